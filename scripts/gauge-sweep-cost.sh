#!/usr/bin/env bash
# What the cleaner's walk of `gauges:` costs: `series` gauges sent every second for `secs`
# seconds to an agent at its defaults but for the cleaner every `interval` seconds; prints
# Redis's CPU per series-minute over the load (writes and cleaner passes together) and the
# cleaner's mean pass time. Run it with AGENT set to a build without the walk (an earlier
# commit's) and without, interleaved, to see the walk's share.
#
#   [AGENT=binary] scripts/gauge-sweep-cost.sh [series=20000] [secs=60] [interval=5] [runs=3]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; secs=${2:-60}; interval=${3:-5}; runs=${4:-3}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh
for run in $(seq 1 "$runs"); do
  sock="$dir/r$run.sock"
  start_redis "$sock"
  start_agent "$dir/agent.log" --redis "redis+unix://$sock" --cleaner-interval-secs "$interval"
  agent=$agent_pid
  # The gauges made first (and a pass over them), then measured.
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --lines "$series" --types g >/dev/null
  sleep $((interval + 2))
  cpu0=$(redis_cpu "$sock")
  passes0=$(agent_metric "$http" cleaner_passes_total)
  seconds0=$(agent_metric "$http" cleaner_pass_duration_seconds_sum)
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --rate "$series" --lines $((series * secs)) --types g >/dev/null
  sleep 2
  cpu1=$(redis_cpu "$sock")
  passes1=$(agent_metric "$http" cleaner_passes_total)
  seconds1=$(agent_metric "$http" cleaner_pass_duration_seconds_sum)
  kill "$agent"; wait "$agent" || true
  python3 -c "
passes = max(1, $passes1 - $passes0)
print(f'run $run  {($cpu1 - $cpu0) / ($series * ($secs + 2) / 60) * 1e6:.1f} us of Redis CPU per series-minute, '
      f'{passes} passes of {($seconds1 - $seconds0) / passes * 1e3:.1f} ms on average')"
  redis-cli -s "$sock" shutdown nosave >/dev/null 2>&1 || true
done
