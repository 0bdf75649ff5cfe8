#!/usr/bin/env bash
# Redis CPU per HINCRBY of the flush as one server takes it and as a Redis Cluster takes it,
# without the agent's UDP side or a load generator competing for the cores: examples/flush_cost.rs
# writes `windows` windows of counter series at the seven default precisions through the agent's
# writer, to a standalone Redis with `series` series, then to a cluster of `masters` masters (the
# 16384 slots split evenly) with `masters` x `series` series: each master then holds as many keys
# as the standalone server and takes as many HINCRBY, the load that fills each of them alike; a
# slot chunk carries `masters` times as many series as with one master. Each target first takes
# one window unmeasured, which creates the keys; the measured windows follow it in the same run of
# the writer, as an agent's windows follow each other. Runs `rounds` alternating pairs; the CPU and
# HINCRBY calls are the servers' own (INFO, summed over the masters: flush_cost --warmup --masters).
#
#   scripts/cluster-cost.sh [series=110000] [windows=5] [rounds=2] [masters=1]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-110000}; windows=${2:-5}; rounds=${3:-2}; masters=${4:-1}
cargo build --release --quiet --example flush_cost
. scripts/common.sh

single=$(free_port); start_node "$single"
nodes=()
for m in $(seq 0 $((masters - 1))); do
  port=$(node_port); start_node "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf"
  redis-cli -p "$port" cluster addslotsrange $((16384 * m / masters)) $((16384 * (m + 1) / masters - 1)) >/dev/null
  nodes+=("$port")
done
for port in "${nodes[@]:1}"; do redis-cli -p "${nodes[0]}" cluster meet 127.0.0.1 "$port" >/dev/null; done
for port in "${nodes[@]}"; do
  until redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done
done
urls=$(printf 'redis://127.0.0.1:%s,' "${nodes[@]}"); urls=${urls%,}

start=$(date +%s)
measure() { # label port series [flush_cost flags...]
  local line
  line=$(target/release/examples/flush_cost --redis "redis://127.0.0.1:$2" --series "$3" --warmup 1 \
    --windows "$windows" --start "$start" "${@:4}" | tail -1)
  printf '%-10s %s\n' "$1" "$line"
}
for _ in $(seq 1 "$rounds"); do
  measure standalone "$single" "$series"
  measure "cluster of $masters" "${nodes[0]}" $((series * masters)) --cluster --masters "$urls"
  start=$((start + windows + 1))
done
