#!/usr/bin/env bash
# Renders docs/dashboard.png (two counters on one chart) and docs/dashboard-timers.png (a timer's
# quantiles): a private Redis and an agent with the built-in defaults, SECS (default 200) seconds
# of varied traffic, then headless Chromium screenshots of the dashboard. A minute's quantile
# buckets are written during the next minute (quantile_write_secs), so the timer chart needs a
# few minutes to show more than the band still arriving. Needs redis-server and chromium.
#   scripts/dashboard-screenshot.sh [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin statsd-redis
. scripts/common.sh
start_redis "$dir/r.sock"
AGENT=target/debug/statsd-redis start_agent "$dir/agent.log" --redis "redis+unix://$dir/r.sock"
# One datagram per call, through bash's own /dev/udp (printf writes its output at once).
send() { printf '%b' "$1" > "/dev/udp/127.0.0.1/$udp"; }
for s in web.checkout web.login web.search api.orders api.users; do send "$s.requests:1|c"; done
for i in $(seq 1 "${1:-200}"); do
  n=$(( (i * 7) % 13 + 3 ))
  send "web.requests:$n|c\nweb.requests;env=canary:$((n / 3))|c"
  send "checkout:$((100 + i * 3))|ms\nlogin:$((30 + i % 5))|ms\nsearch:$((60 + i % 9))|ms\nqueue.depth:$i|g"
  lines=""; for k in $(seq 0 39); do lines+="api.latency:$(( 40 + (i * 37 + k * 53) % 90 + (k % 10 == 0 ? 150 : 0) ))|ms\n"; done
  send "$lines"
  [ $((i % 6)) -eq 0 ] && send "_e{9,12}:disk full|on /var/data|t:warning|#service:storage"
  [ $((i % 8)) -eq 0 ] && send "_sc|db|2|m:replica lag high"
  sleep 1
done
shot() { # file query
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
    --disable-sync --no-first-run --disable-quic --user-data-dir="$dir/chrome" --window-size=1280,860 \
    --virtual-time-budget=4000 --screenshot="$1" "http://127.0.0.1:$http/?$2" 2>/dev/null
  echo "wrote $1"
}
shot docs/dashboard.png "type=counter&series=web.requests,web.requests%3Benv%3Dcanary&precision=1"
shot docs/dashboard-timers.png "type=timer&series=api.latency"
