#!/usr/bin/env bash
# What one small HTTP request costs the agent: two builds on one Redis seeded as
# scripts/graphite-ab.sh seeds it, each URL asked `requests` times (a fresh connection each, as
# curl asks) in alternating rounds; per request, the agent's CPU (every thread's on-CPU time,
# /proc/<pid>/task/*/schedstat, in µs) and its threads' context switches (voluntary and not,
# /proc/<pid>/task/*/status), then the medians of the rounds a build and URL and B's ÷ A's.
# A thread that parks and is woken again is two switches; on a virtual machine each is dear.
#
#   scripts/http-cost.sh BUILD_A BUILD_B [rounds=5] [requests=300]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
a=$1; b=$2; rounds=${3:-5}; requests=${4:-300}
seed_graphite >/dev/null
AGENT=$a start_agent "$dir/a.log" "${graphite_flags[@]}"; http_a=$http; pid_a=$agent_pid
AGENT=$b start_agent "$dir/b.log" "${graphite_flags[@]}"; http_b=$http; pid_b=$agent_pid
urls=(
  "version graphite/version"
  "find graphite/metrics/find?query=app3.host4.*"
  "render1 graphite/render?target=app0.host1.metric1&from=-1h&format=json"
  "render-glob graphite/render?target=app0.host1.metric1%5B0-9%5D&from=-1h&format=json"
)
for round in $(seq "$rounds"); do
  for side in A B; do
    port=$http_a; pid=$pid_a
    [ "$side" = B ] && { port=$http_b; pid=$pid_b; }
    for entry in "${urls[@]}"; do
      read -r name path <<<"$entry"
      curl -sg -o /dev/null "http://127.0.0.1:$port/$path"
      read -r ns0 cs0 <<<"$(task_usage "$pid")"
      for _ in $(seq "$requests"); do curl -sg -o /dev/null "http://127.0.0.1:$port/$path"; done
      read -r ns1 cs1 <<<"$(task_usage "$pid")"
      echo "round $round $side $name $(( (ns1 - ns0) / requests / 1000 )) $(echo "$cs0 $cs1 $requests" | awk '{printf "%.1f", ($2 - $1) / $3}')"
    done
  done
done | tee "$dir/rounds"
echo "medians of the rounds: URL, A's CPU µs and switches a request, B's, B's CPU ÷ A's"
/usr/bin/python3 - "$dir/rounds" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, _, side, name, cpu, switches = line.split()
    rows.setdefault(name, {}).setdefault(side, []).append((float(cpu), float(switches)))
for name, sides in rows.items():
    a = [statistics.median(x) for x in zip(*sides["A"])]
    b = [statistics.median(x) for x in zip(*sides["B"])]
    print(f"{name} {a[0]:.0f} {a[1]:.1f} {b[0]:.0f} {b[1]:.1f} {b[0] / a[0]:.2f}")
EOF
