#!/usr/bin/env bash
# What the cleaner's walk of the hourly statistics costs Redis: a private Redis holding `keys`
# other keys (DEBUG POPULATE) and `families` families of hourly statistics, walked as the
# cleaner walks them every five minutes (`SCAN cursor MATCH stats:* COUNT 1000` to the end);
# prints Redis's CPU per walk, `runs` times.
#
#   scripts/stats-walk-cost.sh [keys=1000000] [families=10000] [runs=3]
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-1000000}; families=${2:-10000}; runs=${3:-3}
. scripts/common.sh
need_python_redis
sock="$dir/r.sock"
start_redis "$sock" --enable-debug-command yes
redis-cli -s "$sock" debug populate "$keys" >/dev/null
redis-cli -s "$sock" eval "for i = 1, tonumber(ARGV[1]) do
  redis.call('ZADD', 'stats:s' .. i .. ':AccessTime', 1, 'count')
  redis.call('SET', 'stats:s' .. i .. ':AccessTime:start', '2026-11-28T06:00:00')
end" 0 "$families" >/dev/null
# One connection, as the cleaner's (a redis-cli per call would count its connection too).
/usr/bin/python3 - "$sock" "$runs" <<'EOF'
import sys
import redis
r = redis.Redis(unix_socket_path=sys.argv[1])
def cpu():
    i = r.info('cpu')
    return i['used_cpu_user'] + i['used_cpu_sys']
for run in range(1, int(sys.argv[2]) + 1):
    c0, cursor, found, calls = cpu(), 0, 0, 0
    while True:
        cursor, keys = r.scan(cursor, match='stats:*', count=1000)
        found, calls = found + len(keys), calls + 1
        if cursor == 0:
            break
    print(f'run {run}  {(cpu() - c0) * 1e3:.0f} ms of Redis CPU for a walk of {r.dbsize()} keys '
          f'({calls} SCAN calls, {found} stats: keys found)')
EOF
