#!/usr/bin/env bash
# Names that come and go: every 20 s (the agent's time) `names` new names of four types (a
# counter, a gauge, a timer and a set each) are sent once and never again, against an agent with
# short retentions (`1s:1m,10s:5m`), `forget_idle_secs = 60` and the cleaner every 5 s. Prints,
# every `every` seconds, Redis's used_memory, its keys, those of the hourly statistics
# (`stats:*`), the indexed hashes (`count:`, `gauge:`), the keys nothing would ever remove, the
# `gauges:` fields, the `slowest:AccessTime` members and the index sizes. Everything but the
# hourly statistics levels off within minutes; those are kept through their hour and the next,
# so their part rises for two hours, then falls back at every hour's end.
#
#   scripts/churn.sh [minutes=30] [names=1000] [every=300] [speed=1]
#
# speed > 1 runs the agent on a clock that many times the machine's (libfaketime, `x<speed>`),
# so that a run shows hours of churn: the windows, the ledger's forgetting and the cleaner's
# passes (which delete the hourly statistics by the agent's hours) all run on it. Redis keeps
# the machine's time, so keys that expire by Redis's clock live their retention in real seconds:
# the quantile slices' hours (two hours) are then left out (`quantile_precisions = 60`).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}; names=${2:-1000}; every=${3:-300}; speed=${4:-1}
faketime=()
if [ "$speed" != 1 ]; then
  lib=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
  [ -e "$lib" ] || { echo "libfaketime is missing: apt-get install -y faketime" >&2; exit 1; }
  faketime=(--quantile-precisions 60)
fi
cargo build --release --quiet --bin statsd-redis
. scripts/common.sh
sock="$dir/redis.sock"
start_redis "$sock"
[ "$speed" = 1 ] || export LD_PRELOAD=$lib FAKETIME="+0 x$speed"
start_agent "$dir/agent.log" --redis "redis+unix://$sock" --retentions 1s:1m,10s:5m \
  --forget-idle-secs 60 --cleaner-interval-secs 5 "${faketime[@]}"
unset LD_PRELOAD FAKETIME
# The sender, on the machine's clock: a round every 20 s of the agent's.
python3 - "$udp" "$names" "$minutes" "$speed" <<'EOF' &
import socket, sys, time
port, names, minutes, speed = (int(a) for a in sys.argv[1:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, r = time.time() + minutes * 60, 0
while time.time() < end:
    lines = []
    for i in range(names):
        n = f"churn.r{r}.n{i}"
        lines += [f"{n}.c:1|c", f"{n}.g:{i}|g", f"{n}.t:{i % 97}|ms", f"{n}.s:u{i}|s"]
    for j in range(0, len(lines), 20):
        s.sendto("\n".join(lines[j:j + 20]).encode(), ("127.0.0.1", port))
    r += 1
    time.sleep(20 / speed)
EOF
# Keys without a TTL that nothing removes: neither expiring nor a hash the cleaner trims through
# its index (count:, gauge:), nor hourly statistics (the cleaner deletes them by their hour), nor
# one of the agent's fixed keys.
census='local keys, stats, hashes, forever = 0, 0, 0, 0
local fixed = {["gauges:"] = true, ["known:"] = true, ["known:gauge:"] = true,
  ["slowest:AccessTime"] = true, ["flush:"] = true, ["cleaner:lock"] = true}
local cursor = "0"
repeat
  local r = redis.call("SCAN", cursor, "COUNT", 10000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    keys = keys + 1
    local family = string.match(k, "^[^:]*")
    if family == "stats" then
      stats = stats + 1
    elseif family == "count" or family == "gauge" then
      hashes = hashes + 1
    elseif redis.call("TTL", k) == -1 and not fixed[k] then
      forever = forever + 1
    end
  end
until cursor == "0"
return {keys, stats, hashes, forever, redis.call("HLEN", "gauges:"), redis.call("ZCARD", "slowest:AccessTime"),
  redis.call("ZCARD", "known:"), redis.call("ZCARD", "known:gauge:")}'
printf '%8s %7s %12s %8s %8s %8s %9s %8s %8s %7s %13s\n' time min_sim used_memory keys stats: hashes unbounded gauges: slowest known: known:gauge:
start=$(date +%s)
for i in $(seq 1 $((minutes * 60 / every))); do
  wait_s=$((start + i * every - $(date +%s)))
  [ "$wait_s" -le 0 ] || sleep "$wait_s"
  mem=$(redis-cli -s "$sock" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}')
  read -r keys stats hashes forever gauges slowest known known_gauge <<<"$(redis-cli -s "$sock" eval "$census" 0 | tr '\n' ' ')"
  printf '%8s %7s %12s %8s %8s %8s %9s %8s %8s %7s %13s\n' "$(date -u +%H:%M:%S)" $((i * every * speed / 60)) "$mem" "$keys" "$stats" "$hashes" "$forever" "$gauges" "$slowest" "$known" "$known_gauge"
done
echo "agent: windows dropped $(agent_metric "$http" windows_dropped_total), backlog $(agent_metric "$http" backlog_windows) windows, cleaner passes $(agent_metric "$http" cleaner_passes_total), gauges: fields removed $(agent_metric "$http" cleaner_gauges_removed_total), slowest: members removed $(agent_metric "$http" cleaner_slowest_removed_total)"
