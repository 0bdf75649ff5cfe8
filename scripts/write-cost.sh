#!/usr/bin/env bash
# Redis CPU per HINCRBY as the release binary writes counters at its defaults, against the same
# book commands sent bare to the same server right after (examples/flush_cost.rs --bare): the
# ratio "agent / bare" is what the write path costs over the commands themselves.
# Each run: a private Redis on a free TCP port; the agent (its defaults, only the addresses
# given); `series` counter series sent over UDP for `secs` seconds (every series in every
# window); the server's CPU (INFO cpu) and HINCRBY calls over the load and its last flush; then
# `secs` windows of the same number of series written bare. Both after one unmeasured window
# that makes the keys.
#
#   [AGENT=binary] [TYPE=c|ms|g|s] scripts/write-cost.sh [series=20000] [secs=10] [runs=3]
#
# AGENT: another build of the agent to measure (an earlier commit's, say); the bare commands are
# always this checkout's examples/flush_cost. TYPE: timers, gauges or sets instead of counters
# (loadgen's types): then the Redis CPU per series and window is given, and no bare run.
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; secs=${2:-10}; runs=${3:-3}; type=${TYPE:-c}
cargo build --release --quiet --bin statsd-redis --example loadgen --example flush_cost
. scripts/common.sh
# The last window closes and is written: no line moves and the backlog is empty.
settle() {
  local prev=-1 now
  while true; do
    sleep 1.5
    now=$(agent_metric "$http" lines_received_total)
    [ "$now" = "$prev" ] && [ "$(agent_metric "$http" backlog_windows)" = 0 ] && break
    prev=$now
  done
}
for run in $(seq 1 "$runs"); do
  port=$(node_port)
  start_node "$port"
  start_agent "$dir/agent.log" --redis "redis://127.0.0.1:$port"
  agent=$agent_pid
  # One unmeasured window first (it makes the keys), as the bare run has.
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --lines "$series" --types "$type" >/dev/null
  settle
  read -r cpu0 calls0 < <(redis_usage "-p $port")
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --rate $((series * 2)) --lines $((series * 2 * secs)) --types "$type" >/dev/null
  settle
  read -r cpu1 calls1 < <(redis_usage "-p $port")
  kill "$agent"; wait "$agent" || true
  agent_us=$(python3 -c "print(($cpu1 - $cpu0) / max(1, $calls1 - $calls0) * 1e6)")
  if [ "$type" != c ]; then
    python3 -c "print(f'run $run  type $type  {($cpu1 - $cpu0) / ($series * $secs) * 1e6:.2f} us of Redis CPU per series and window')"
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    continue
  fi
  # flush_cost measures the windows after its warm-up: "... us per HINCRBY" last.
  bare_us=$(target/release/examples/flush_cost --redis "redis://127.0.0.1:$port" --bare \
    --series "$series" --warmup 1 --windows "$secs" | awk '/per HINCRBY/ {print $(NF-3)}')
  python3 -c "print(f'run $run  agent {$agent_us:.2f} us of Redis CPU per HINCRBY ({$calls1 - $calls0} calls), bare {$bare_us:.2f}, ratio {$agent_us / $bare_us:.2f}')"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
done
