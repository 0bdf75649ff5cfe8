#!/usr/bin/env bash
# The Graphite API's memory and the agent's liveness under the largest render one request may
# make: 10 000 series (the limit of a request) × a day of minutes, 14.4 million points. Prints
# the agent's resident memory before, its peak (VmHWM) after, the render's time and size, and
# the slowest /healthz answer while it ran. TARGET: another target over them (e.g.
# 'aliasByNode(app*.*.*,1,2)').
#   [TARGET=…] scripts/graphite-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
cargo build --release --quiet
seed_graphite --day-series 10000
start_agent "$dir/agent.log" "${graphite_flags[@]}"
kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$agent_pid/status"; }
echo "agent before: VmRSS $(kb VmRSS) kB"
(
  worst=0
  while [ ! -f "$dir/done" ]; do
    t=$(curl -s -o /dev/null -w '%{time_total}' "127.0.0.1:$http/healthz")
    worst=$(awk -v a="$worst" -v b="$t" 'BEGIN {print (b > a) ? b : a}')
    sleep 0.05
  done
  echo "slowest /healthz during the render: ${worst} s"
) &
watch=$!
target=${TARGET:-app*.*.*}
curl -s -o "$dir/body.json" -w "render of $target from -1d: %{http_code}, %{size_download} bytes in %{time_total} s\n" \
  --data-urlencode "target=$target" --data-urlencode 'from=-1d' --data-urlencode "now=$now" \
  --data-urlencode 'format=json' "127.0.0.1:$http/graphite/render"
touch "$dir/done"; wait "$watch"
echo "agent after: VmRSS $(kb VmRSS) kB, peak VmHWM $(kb VmHWM) kB"
