#!/usr/bin/env bash
# Renders docs/dashboard.png: a private Redis and agent, 20 s of varied traffic, then a headless
# Chromium screenshot of the dashboard. Needs redis-server and chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin statsd-redis
. scripts/common.sh
start_redis "$dir/r.sock"
udp=$(free_port); http=$(free_port)
target/debug/statsd-redis --udp "127.0.0.1:$udp" --http "127.0.0.1:$http" --redis "redis+unix://$dir/r.sock" 2>/dev/null &
until curl -s "127.0.0.1:$http/healthz" >/dev/null; do sleep 0.05; done
# One datagram per call, through bash's own /dev/udp (printf writes its output at once).
send() { printf '%b' "$1" > "/dev/udp/127.0.0.1/$udp"; }
for s in web.checkout web.login web.search api.orders api.users; do send "$s.requests:1|c"; done
for i in $(seq 1 20); do
  n=$(( (i * 7) % 13 + 3 ))
  send "web.requests:$n|c\nweb.requests;env=canary:$((n / 3))|c"
  send "checkout:$((100 + i * 3))|ms\nlogin:$((30 + i % 5))|ms\nsearch:$((60 + i % 9))|ms\nqueue.depth:$i|g"
  [ $((i % 6)) -eq 0 ] && send "_e{9,12}:disk full|on /var/data|t:warning|#service:storage"
  [ $((i % 8)) -eq 0 ] && send "_sc|db|2|m:replica lag high"
  sleep 1
done
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --disable-quic --user-data-dir="$dir/chrome" --window-size=1280,860 \
  --virtual-time-budget=4000 --screenshot=docs/dashboard.png \
  "http://127.0.0.1:$http/?counter=web.requests&precision=1" 2>/dev/null
echo "wrote docs/dashboard.png"
