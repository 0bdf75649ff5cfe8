#!/usr/bin/env bash
# Redis CPU per timer series per window with the quantile buckets and without them: the writer
# itself (examples/flush_cost.rs --timers) writes `windows` windows of `series` timer series with
# `samples` values each (log-normal, median 100 ms) into a private Redis, first unmeasured to make
# the keys, then measured; variants alternate in `rounds`:
#   off      stats only (the script as it was before buckets)
#   hours    stats and the buckets of the hour (quantile_precisions = [3600])
#   default  stats and the buckets of the minute and of the hour (quantile_precisions = [60, 3600])
#            written with every window (quantile_write_secs = 0)
#   held     quantile_write_secs = 60, the default: per second, the stats of a window (20 values,
#            no buckets) plus a sixtieth of one minute's buckets (60 x samples values) written
#            once, into a new minute slice and the hour's (windows a minute apart)
# REDIS_ARGS passes flags to redis-server (e.g. "--hash-max-listpack-entries 16").
#
#   scripts/quantile-cost.sh [series=10000] [samples=20] [windows=5] [rounds=2]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-10000}; samples=${2:-20}; windows=${3:-5}; rounds=${4:-2}
cargo build --release --quiet --example flush_cost
. scripts/common.sh
sock="$dir/redis.sock"
start_redis "$sock" ${REDIS_ARGS:-}
start=$(date +%s)
measure() { # label [flush_cost flags...]
  local flags=(--redis "redis+unix://$sock" --timers --series "$series" --samples "$samples" "${@:2}")
  target/release/examples/flush_cost "${flags[@]}" --windows 1 --start "$start" >/dev/null
  local before after
  before=$(redis_cpu "$sock")
  target/release/examples/flush_cost "${flags[@]}" --windows "$windows" --start $((start + 1)) >/dev/null
  after=$(redis_cpu "$sock")
  local us; us=$(python3 -c "print(($after - $before) / ($windows * $series) * 1e6)")
  printf '%-8s %6.2f us of Redis CPU per timer series per window\n' "$1" "$us"
  start=$((start + windows + 1))
  last_us=$us
}
# The held variant's minute writes start at a minute of their own, far from the others.
held() {
  local flags=(--redis "redis+unix://$sock" --timers --series "$series" --buckets-only
    --samples $((samples * 60)) --step 60)
  local begin=$(( (start / 3600 + 2 + round) * 3600 ))
  target/release/examples/flush_cost "${flags[@]}" --windows 1 --start "$begin" >/dev/null
  local before after
  before=$(redis_cpu "$sock")
  target/release/examples/flush_cost "${flags[@]}" --windows "$windows" --start $((begin + 60)) >/dev/null
  after=$(redis_cpu "$sock")
  printf '%-8s %6.2f us of Redis CPU per timer series per second (%s + a minute'"'"'s buckets / 60)\n' \
    held "$(python3 -c "print($1 + ($after - $before) / ($windows * $series) * 1e6 / 60)")" "$1"
}
for round in $(seq 1 "$rounds"); do
  measure off --no-buckets
  held "$last_us"
  measure hours --quantile-precisions 3600
  measure default
done
