#!/usr/bin/env bash
# Redis CPU per timer series per window with the quantile buckets and without them: the writer
# itself (examples/flush_cost.rs --timers) writes `windows` windows of `series` timer series with
# `samples` values each (log-normal, median 100 ms) into a private Redis, first unmeasured to make
# the keys, then measured; variants alternate in `rounds`:
#   off      stats only (the script as it was before buckets)
#   hours    stats and the buckets of the hour (quantile_precisions = [3600])
#   default  stats and the buckets of the minute and of the hour (quantile_precisions = [60, 3600])
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
  printf '%-8s %6.2f us of Redis CPU per timer series per window\n' "$1" \
    "$(python3 -c "print(($after - $before) / ($windows * $series) * 1e6)")"
  start=$((start + windows + 1))
}
for _ in $(seq 1 "$rounds"); do
  measure off --no-buckets
  measure hours --quantile-precisions 3600
  measure default
done
