#!/usr/bin/env bash
# Redis CPU per counter series per window (and per HINCRBY) as the writer takes it, for one or
# more builds of examples/flush_cost.rs, alternating rounds: what a change costs the counters.
# Each build writes to a private Redis of its own (with CLUSTER=1 a one-master cluster holding
# every slot): one window unmeasured (it makes the keys), then `windows` measured windows of
# `series` counter series at the seven default precisions; the CPU and the HINCRBY calls are the
# server's (INFO) over the measured ones. Works with builds older than flush_cost --warmup.
#
#   [CLUSTER=1] scripts/counter-cost.sh [series=20000] [windows=5] [rounds=3] [flush_cost binary...]
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
urls=(); socks=()
for i in "${!builds[@]}"; do
  if [ "${CLUSTER:-0}" = 1 ]; then
    port=$(node_port)
    start_node "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf"
    redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
    until redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done
    urls+=("redis://127.0.0.1:$port"); socks+=("-p $port")
  else
    start_redis "$dir/redis-$i.sock"
    urls+=("redis+unix://$dir/redis-$i.sock"); socks+=("-s $dir/redis-$i.sock")
  fi
done
cluster=(); [ "${CLUSTER:-0}" = 1 ] && cluster=(--cluster)
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  for i in "${!builds[@]}"; do
    flags=(--redis "${urls[$i]}" --series "$series" "${cluster[@]}")
    "${builds[$i]}" "${flags[@]}" --windows 1 --start "$start" >/dev/null
    read -r cpu0 calls0 < <(redis_usage "${socks[$i]}")
    "${builds[$i]}" "${flags[@]}" --windows "$windows" --start $((start + 1)) >/dev/null
    read -r cpu1 calls1 < <(redis_usage "${socks[$i]}")
    python3 -c "print(f'round $round  ${builds[$i]}  {($cpu1 - $cpu0) / ($windows * $series) * 1e6:.2f} us of Redis CPU per counter series per window, {($cpu1 - $cpu0) / max(1, $calls1 - $calls0) * 1e6:.2f} per HINCRBY')"
  done
  start=$((start + windows + 1))
done
