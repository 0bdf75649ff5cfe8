#!/usr/bin/env bash
# Redis CPU per counter series per window as the writer takes it, for one or more builds of
# examples/flush_cost.rs, alternating rounds: what a change costs the counters. Each build writes
# to a private Redis of its own: one window unmeasured (it makes the keys), then `windows`
# measured windows of `series` counter series at the seven default precisions; the CPU is the
# server's (INFO cpu) over the measured ones.
#
#   scripts/counter-cost.sh [series=20000] [windows=5] [rounds=3] [flush_cost binary...]
#
# Without binaries, this checkout's. An earlier build to compare with:
#   git worktree add /tmp/old REV && (cd /tmp/old && cargo build --release --example flush_cost)
#   scripts/counter-cost.sh 20000 5 3 /tmp/old/target/release/examples/flush_cost target/release/examples/flush_cost
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; windows=${2:-5}; rounds=${3:-3}
builds=("${@:4}")
if [ ${#builds[@]} -eq 0 ]; then
  cargo build --release --quiet --example flush_cost
  builds=(target/release/examples/flush_cost)
fi
. scripts/common.sh
socks=()
for i in "${!builds[@]}"; do
  socks+=("$dir/redis-$i.sock")
  start_redis "${socks[$i]}"
done
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  for i in "${!builds[@]}"; do
    flags=(--redis "redis+unix://${socks[$i]}" --series "$series")
    "${builds[$i]}" "${flags[@]}" --windows 1 --start "$start" >/dev/null
    before=$(redis_cpu "${socks[$i]}")
    "${builds[$i]}" "${flags[@]}" --windows "$windows" --start $((start + 1)) >/dev/null
    after=$(redis_cpu "${socks[$i]}")
    us=$(python3 -c "print(f'{($after - $before) / ($windows * $series) * 1e6:.2f}')")
    echo "round $round  ${builds[$i]}  $us us of Redis CPU per counter series per window"
  done
  start=$((start + windows + 1))
done
