#!/usr/bin/env bash
# Two builds of the agent answering the same Graphite renders over one Redis of `series`
# counter series of SCHEMA from python3-whisper files (`statsd-redis import whisper`, as
# scripts/profile-render.sh fills it), in alternating rounds of `requests` renders of 100 series
# (load.1??.c, or TARGET over them) a range of RANGES (MAX_POINTS: Grafana's maxDataPoints, its
# panel's width): what a change to the render path bought. Prints each round's
# median render time, its time to the first byte of the answer (the reads and the functions,
# before any JSON), Redis's own time a render (INFO commandstats), the agent's CPU and context
# switches a render (common.sh's task_usage) and Redis's process CPU a render (INFO cpu: reading
# the requests and writing the replies too), then the medians of the rounds a build and range,
# B's ÷ A's, and each build's render ÷ Redis's process CPU.
#
#   [SCHEMA=10s:6h,1m:7d,1h:90d,1d:5y] [RANGES="-1h -1d -1y"] [TARGET='aliasByNode(load.1??.c,1)'] \
#     [MAX_POINTS=n] \
#     scripts/render-ab.sh BUILD_A BUILD_B [series=10000] [rounds=5] [requests=30]
#
# Needs python3-whisper.
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1; b=$2; series=${3:-10000}; rounds=${4:-5}; requests=${5:-30}
schema=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
. scripts/common.sh
target=$(/usr/bin/python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "${TARGET:-load.1??.c}")
port=$(free_port)
start_node "$port"
mkwhisper "$dir/whisper" "$series" schema "$schema" >/dev/null
"$a" import whisper --redis "redis://127.0.0.1:$port" --retentions "$schema" "$dir/whisper" \
  >/dev/null 2>&1
flags=(--redis "redis://127.0.0.1:$port" --retentions "$schema" --cleaner-enabled false)
AGENT=$a start_agent "$dir/a.log" "${flags[@]}"; http_a=$http; pid_a=$agent_pid
AGENT=$b start_agent "$dir/b.log" "${flags[@]}"; http_b=$http; pid_b=$agent_pid
for round in $(seq "$rounds"); do
  # Each build first in every other round: whichever runs first is favoured on a busy machine.
  sides="A B"; [ $((round % 2)) = 0 ] && sides="B A"
  for side in $sides; do
    base=$http_a; pid=$pid_a
    [ "$side" = B ] && { base=$http_b; pid=$pid_b; }
    for from in ${RANGES:--1h -1d -1y}; do
      url="http://127.0.0.1:$base/graphite/render?target=$target&from=$from&format=json${MAX_POINTS:+&maxDataPoints=$MAX_POINTS}"
      # The names' look-up, kept 30 s, out of the timing.
      curl -sg -o /dev/null "$url"
      redis-cli -p "$port" config resetstat >/dev/null
      read -r ns0 cs0 <<<"$(task_usage "$pid")"
      redis0=$(redis_usage "-p $port" | cut -d' ' -f1)
      for _ in $(seq "$requests"); do
        curl -sg -o /dev/null -w '%{time_total} %{time_starttransfer}\n' "$url"
      done >"$dir/times"
      read -r ns1 cs1 <<<"$(task_usage "$pid")"
      redis1=$(redis_usage "-p $port" | cut -d' ' -f1)
      redis=$(redis-cli -p "$port" info commandstats | tr -d '\r' |
        awk -F'[=,]' -v n="$requests" '/^cmdstat_/ && !/cmdstat_(info|config)/ {u += $4} END {printf "%.2f", u / n / 1e3}')
      echo "round $round $side $from $(awk '{print $1 * 1e3}' "$dir/times" | median) $redis" \
        "$(awk '{print $2 * 1e3}' "$dir/times" | median)" \
        "$(echo "$ns0 $ns1 $cs0 $cs1 $requests" | awk '{printf "%.2f %.1f", ($2 - $1) / $5 / 1e6, ($4 - $3) / $5}')" \
        "$(echo "$redis0 $redis1 $requests" | awk '{printf "%.2f", ($2 - $1) * 1e3 / $3}')"
    done
  done
done | tee "$dir/rounds"
echo "medians of the rounds (ms): range, A render (first byte, Redis, CPU, switches, Redis CPU), B's," \
  "B / A, A's and B's render ÷ Redis CPU"
for from in ${RANGES:--1h -1d -1y}; do
  m() { awk -v s="$1" -v f="$from" -v c="$2" '$3 == s && $4 == f {print $c}' "$dir/rounds" | median; }
  printf '%s %.2f (%.2f, %.2f, %.2f, %.0f, %.2f) %.2f (%.2f, %.2f, %.2f, %.0f, %.2f) %.2f %.2f %.2f\n' \
    "$from" "$(m A 5)" "$(m A 7)" "$(m A 6)" "$(m A 8)" "$(m A 9)" "$(m A 10)" \
    "$(m B 5)" "$(m B 7)" "$(m B 6)" "$(m B 8)" "$(m B 9)" "$(m B 10)" \
    "$(echo "$(m B 5) / $(m A 5)" | bc -l)" "$(echo "$(m A 5) / $(m A 10)" | bc -l)" \
    "$(echo "$(m B 5) / $(m B 10)" | bc -l)"
done
