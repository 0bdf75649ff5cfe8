#!/usr/bin/env bash
# Two builds of the agent on one Redis seeded as bench-graphite.sh seeds it, the same Graphite
# requests timed against each in alternating rounds: what a change to the read path bought,
# without graphite-web's noise between. Prints each round's p50 and the medians of the rounds.
#   scripts/graphite-ab.sh BUILD_A BUILD_B [requests=find,moving10] [rounds=5] [runs=300]
# BUILD_*: paths of statsd-redis binaries (e.g. one built from an earlier commit in a worktree).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
a=$1; b=$2; only=${3:-find,moving10}; rounds=${4:-5}; runs=${5:-300}
seed_graphite >/dev/null
AGENT=$a start_agent "$dir/a.log" "${graphite_flags[@]}"; http_a=$http
AGENT=$b start_agent "$dir/b.log" "${graphite_flags[@]}"; http_b=$http
for round in $(seq "$rounds"); do
  # Each build first in every other round: whichever runs first is favoured on a busy machine.
  sides="A B"; [ $((round % 2)) = 0 ] && sides="B A"
  for side in $sides; do
    port=$http_a; [ "$side" = B ] && port=$http_b
    target/release/examples/graphite_latency measure --redis "$redis" \
      --base "http://127.0.0.1:$port/graphite" --now "$now" --runs "$runs" --oracle-runs 0 \
      --only "$only" | tail -n +2 | awk -v s="$side" -v r="$round" '{print "round " r, s, $1, $2}'
  done
done | tee "$dir/rounds"
echo "medians of the rounds' p50 (ms):"
awk '{k=$4" "$3; v[k]=v[k]" "$5} END {for (k in v) print k, v[k]}' "$dir/rounds" | sort |
  while read -r what side values; do
    echo "$what $side $(printf '%s\n' $values | sort -g | awk '{x[NR]=$1} END {print x[int((NR+1)/2)]}')"
  done
