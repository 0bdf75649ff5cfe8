#!/usr/bin/env bash
# The transports side by side: the load generator at full speed into the floor receiver (UDP,
# reads and counts only), then into the agent over UDP, TCP and a unix datagram socket, each
# writing to a private Redis; the same lines, interleaved, several runs. Prints loss and the
# agent's CPU (user+system, flush included) per line for each.
#
#   scripts/bench-transports.sh [runs=3] [lines=1000000] [series=1000]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; lines=${2:-1000000}; series=${3:-1000}
cargo build --release --quiet --bin statsd-redis --example loadgen --example floor
. scripts/common.sh
cpu_us() { awk '{ print ($14 + $15) * 1000000 / '"$(getconf CLK_TCK)"' }' "/proc/$1/stat"; }
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v m="statsd_redis_$2" '$1 == m || index($1, m "{") == 1 { s += $2; n++ } END { print s + 0 }'; }

run_floor() { # lines_per_datagram
  local port; port=$(free_port)
  target/release/examples/floor "127.0.0.1:$port" > "$dir/floor.out" &
  local pid=$!; sleep 0.3
  target/release/examples/loadgen send --target "127.0.0.1:$port" --series "$series" \
    --lines-per-datagram "$1" --lines "$lines" > /dev/null
  wait $pid
  local got cpu
  got=$(sed -E 's/.*lines=([0-9]+).*/\1/' "$dir/floor.out")
  cpu=$(sed -E 's/.*cpu_us=([0-9]+).*/\1/' "$dir/floor.out")
  printf 'floor/udp  %2s lines a datagram: lost %7d  %6.0f ns a line\n' "$1" $((lines - got)) \
    "$(python3 -c "print($cpu * 1000 / $got)")"
}

run_agent() { # transport lines_per_datagram
  local sock="$dir/r.sock" udp tcp http target
  start_redis "$sock"
  tcp=$(free_port)
  start_agent "$dir/agent.log" --tcp "127.0.0.1:$tcp" --unix-datagram "$dir/statsd.sock" \
    --redis "redis+unix://$sock" --cleaner-enabled false
  local pid=$agent_pid
  case $1 in
    udp) target="127.0.0.1:$udp" ;;
    tcp) target="127.0.0.1:$tcp" ;;
    unixgram) target="$dir/statsd.sock" ;;
  esac
  local before; before=$(cpu_us $pid)
  target/release/examples/loadgen send --transport "$1" --target "$target" --series "$series" \
    --lines-per-datagram "$2" --lines "$lines" > /dev/null
  local prev=-1 now
  while true; do
    sleep 1.5
    now=$(metric "$http" lines_received_total)
    [ "$now" = "$prev" ] && [ "$(metric "$http" backlog_windows)" = "0" ] && break
    prev=$now
  done
  local after; after=$(cpu_us $pid)
  kill -TERM $pid; wait $pid || true
  printf 'agent/%-8s %2s lines a datagram: lost %7d  %6.0f ns a line\n' "$1" "$2" $((lines - now)) \
    "$(python3 -c "print(($after - $before) * 1000 / max($now, 1))")"
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
  rm -f "$sock"
}

for run in $(seq 1 "$runs"); do
  echo "run $run"
  for per in 1 20; do
    run_floor "$per"
    for transport in udp tcp unixgram; do
      run_agent "$transport" "$per"
    done
  done
done
