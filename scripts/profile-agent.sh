#!/usr/bin/env bash
# Where the agent's CPU goes at the load generator's full speed: the agent (default
# configuration, a private Redis, cleaner off) under `perf record -g` while `loadgen send`
# sends `lines` lines over 1000 counter series in `lines_per_datagram`-line datagrams. Prints the
# share of kernel and user space, the top symbols, and how often the receiver's threads blocked
# (voluntary context switches); the profile stays in `out`. FLOOR=1
# profiles the floor receiver (examples/floor.rs) instead, for comparison.
#
#   scripts/profile-agent.sh [lines_per_datagram=20] [lines=20000000] [out=agent.perf]
set -euo pipefail
cd "$(dirname "$0")/.."
lpd=${1:-20}; lines=${2:-20000000}; out=${3:-agent.perf}
command -v perf >/dev/null || { echo "perf is missing: apt-get install -y linux-perf" >&2; exit 1; }
cargo build --profile profiling --quiet --bin statsd-redis --example loadgen --example floor
. scripts/common.sh
sock="$dir/r.sock"
start_redis "$sock"
udp=$(free_port); http=$(free_port)
if [ -n "${FLOOR:-}" ]; then
  target/profiling/examples/floor "127.0.0.1:$udp" >/dev/null &
  pid=$!
  sleep 0.5
else
  AGENT=target/profiling/statsd-redis start_agent "$dir/agent.log" --redis "redis+unix://$sock" \
    --cleaner-enabled false
  pid=$agent_pid
fi
# Voluntary context switches of all the receiver's threads.
switches() { cat /proc/"$pid"/task/*/status | awk '/^voluntary_ctxt_switches/ {n += $2} END {print n}'; }
switches0=$(switches)
perf record -q -g -F 4000 -o "$out" -p "$pid" 2>/dev/null &
perf_pid=$!
sleep 0.5
target/profiling/examples/loadgen send --target "127.0.0.1:$udp" --series 1000 \
  --lines-per-datagram "$lpd" --lines "$lines"
echo "the receiver's threads blocked $(( $(switches) - switches0 )) times"
sleep 2
kill -INT "$perf_pid"; wait "$perf_pid" || true
perf report -i "$out" --no-children --sort dso 2>/dev/null | grep -E '^ +[0-9.]+%' | head -5
perf report -i "$out" --no-children --sort symbol -g none 2>/dev/null | grep -E '^ +[0-9.]+%' | head -20
