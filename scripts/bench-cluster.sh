#!/usr/bin/env bash
# One Redis against a Redis Cluster of 3 masters, in the same run: the high-cardinality load of
# bench-cardinality.sh (counter and timer series, each active every second) sent to an agent in
# standalone mode, then to one in cluster mode. Prints per target: Redis CPU per million
# HINCRBY (all masters together, and per master), the share of the master that holds `known:`,
# flush p50/p99 and the backlog.
#
#   scripts/bench-cluster.sh [seconds=30] [counters=20000] [timers=2000]
#
# The masters have no replicas (a replica costs a master's CPU again, on the same 2 cores).
# AGENT_ARGS adds agent flags to both runs, e.g. AGENT_ARGS='--coarse-write-secs 60'.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}; counters=${2:-20000}; timers=${3:-2000}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh

# cpu_of HOSTPORT: CPU seconds (user + system) of that Redis so far; hincrby_of: its HINCRBY calls.
cpu_of() { redis-cli -h 127.0.0.1 -p "$1" info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'; }
hincrby_of() { redis-cli -h 127.0.0.1 -p "$1" info commandstats | awk -F'[:=,]' '/^cmdstat_hincrby:/ {n = $3} END {print n + 0}'; }

# run LABEL AGENT_FLAGS... : the load against an agent with those flags; PORTS names the masters.
run() {
  local label=$1; shift
  local udp http pid t backlog
  # shellcheck disable=SC2086
  start_agent "$dir/agent-$label.log" --cleaner-enabled false ${AGENT_ARGS:-} "$@"
  pid=$agent_pid
  sleep 1
  declare -A cpu0 calls0
  for p in $PORTS; do cpu0[$p]=$(cpu_of "$p"); redis-cli -p "$p" config resetstat >/dev/null; done
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$counters" --prefix hc \
    --lines-per-datagram 20 --lines $((counters * secs)) --rate "$counters" >/dev/null &
  local gen1=$!
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$timers" --prefix ht --types ms \
    --lines-per-datagram 20 --lines $((timers * secs)) --rate "$timers" >/dev/null &
  local gen2=$!
  wait $gen1 $gen2 || true
  for _ in $(seq 1 120); do
    backlog=$(curl -s "127.0.0.1:$http/metrics" | awk '$1 == "statsd_redis_backlog_windows" {print $2}')
    [ "${backlog:-0}" = 0 ] && break
    sleep 1
  done
  sleep 2
  local total_cpu=0 total_calls=0 known_port
  for p in $PORTS; do [ "$(redis-cli -p "$p" exists known: 2>/dev/null)" = 1 ] && known_port=$p; done
  echo "== $label: $counters counter + $timers timer series for ${secs} s"
  for p in $PORTS; do
    local cpu calls
    cpu=$(python3 -c "print(round($(cpu_of "$p") - ${cpu0[$p]}, 2))")
    calls=$(hincrby_of "$p")
    total_cpu=$(python3 -c "print($total_cpu + $cpu)"); total_calls=$((total_calls + calls))
    printf '  redis :%s  CPU %6.2f s  HINCRBY %9d  %6s s per million%s\n' "$p" "$cpu" "$calls" \
      "$(python3 -c "print(round($cpu / max($calls, 1) * 1e6, 2))")" "$([ "$p" = "${known_port:-}" ] && echo '  (known:)' || true)"
  done
  printf '  all: CPU %.2f s, HINCRBY %d, %s s per million HINCRBY\n' "$total_cpu" "$total_calls" \
    "$(python3 -c "print(round($total_cpu / max($total_calls, 1) * 1e6, 2))")"
  if [ -n "${known_port:-}" ]; then
    printf '  the known: master: %s %% of the CPU\n' \
      "$(python3 -c "print(round(100 * ($(cpu_of "$known_port") - ${cpu0[$known_port]}) / max($total_cpu, 0.01), 1))")"
  fi
  echo "  backlog after sending: ${backlog:-?}; windows dropped: $(curl -s "127.0.0.1:$http/metrics" | awk '$1 == "statsd_redis_windows_dropped_total" {print $2}')"
  curl -s "127.0.0.1:$http/metrics" | python3 -c '
import sys
b = [(float(l.split("le=\"")[1].split("\"")[0].replace("+Inf", "inf")), float(l.split()[-1]))
     for l in sys.stdin if l.startswith("statsd_redis_flush_duration_seconds_bucket")]
total = b[-1][1]
print("  flush p50 <= %s s, p99 <= %s s (of %d)" % tuple(
    [next(le for le, c in b if c >= q * total) for q in (0.5, 0.99)] + [total]))'
  kill -TERM $pid; wait $pid || true
}

single=$(free_port)
start_node "$single"
PORTS=$single run standalone --redis "redis://127.0.0.1:$single"

masters=""
for _ in 1 2 3; do
  p=$(node_port)
  start_node "$p" --cluster-enabled yes --cluster-config-file "nodes-$p.conf"
  masters="$masters $p"
done
masters=${masters# }
redis-cli --cluster create $(for p in $masters; do printf '127.0.0.1:%s ' "$p"; done) --cluster-yes >/dev/null
for p in $masters; do
  until redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done
done
PORTS=$masters run cluster --redis-mode cluster \
  --redis-cluster-nodes "$(for p in $masters; do printf 'redis://127.0.0.1:%s,' "$p"; done | sed 's/,$//')"
