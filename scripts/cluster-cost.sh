#!/usr/bin/env bash
# Redis CPU per HINCRBY of the flush as one server takes it and as a Redis Cluster takes it, at
# the same number of counter series, without the agent's UDP side or a load generator competing
# for the cores: examples/flush_cost.rs writes `windows` windows of `series` counter series at
# the seven default precisions through the agent's writer, to a standalone Redis, then to a
# one-master cluster that holds all 16384 slots (a master's cost per call is the same whatever
# the number of masters; with several, each takes its share of the slots). Each target first
# takes one window unmeasured, which creates the keys; the measured windows follow it in the
# same run of the writer, as an agent's windows follow each other. Runs `rounds` alternating
# pairs; the server's CPU and HINCRBY calls come from its INFO (flush_cost --warmup).
#
#   scripts/cluster-cost.sh [series=110000] [windows=5] [rounds=2]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-110000}; windows=${2:-5}; rounds=${3:-2}
cargo build --release --quiet --example flush_cost
. scripts/common.sh

start_node() { # port [flags...]
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no \
    --dbfilename "dump-$1.rdb" "${@:2}" >/dev/null &
  until redis-cli -p "$1" ping >/dev/null 2>&1; do sleep 0.05; done
}

single=$(free_port); start_node "$single"
node=$(node_port); start_node "$node" --cluster-enabled yes --cluster-config-file "nodes-$node.conf"
redis-cli -p "$node" cluster addslotsrange 0 16383 >/dev/null
until redis-cli -p "$node" cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done

start=$(date +%s)
measure() { # label port [flush_cost flags...]
  local line
  line=$(target/release/examples/flush_cost --redis "redis://127.0.0.1:$2" --series "$series" --warmup 1 \
    --windows "$windows" --start "$start" "${@:3}" | tail -1)
  printf '%-10s %s\n' "$1" "$line"
}
for _ in $(seq 1 "$rounds"); do
  measure standalone "$single"
  measure cluster "$node" --cluster
  start=$((start + windows + 1))
done
