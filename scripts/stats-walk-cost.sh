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
sock="$dir/r.sock"
start_redis "$sock" --enable-debug-command yes
redis-cli -s "$sock" debug populate "$keys" >/dev/null
redis-cli -s "$sock" eval "for i = 1, tonumber(ARGV[1]) do
  redis.call('ZADD', 'stats:s' .. i .. ':AccessTime', 1, 'count')
  redis.call('SET', 'stats:s' .. i .. ':AccessTime:start', '2026-11-28T06:00:00')
end" 0 "$families" >/dev/null
# One connection, as the cleaner's: a minimal RESP client (a new redis-cli per call would
# count its connection's cost too).
python3 - "$sock" "$runs" <<'EOF'
import socket, sys
path, runs = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
f = s.makefile('rb')
def call(*args):
    s.sendall(b''.join([f'*{len(args)}\r\n'.encode()] + [f'${len(a)}\r\n{a}\r\n'.encode() for a in map(str, args)]))
    return read()
def read():
    line = f.readline()[:-2]
    kind, rest = line[:1], line[1:]
    if kind == b'$':
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b'*':
        return [read() for _ in range(int(rest))]
    if kind == b'-':
        raise RuntimeError(rest.decode())
    return rest
def cpu():
    info = dict(l.split(':', 1) for l in call('INFO', 'cpu').decode().splitlines() if ':' in l)
    return float(info['used_cpu_user']) + float(info['used_cpu_sys'])
for run in range(1, runs + 1):
    c0, cursor, found, calls = cpu(), b'0', 0, 0
    while True:
        cursor, keys = call('SCAN', cursor.decode(), 'MATCH', 'stats:*', 'COUNT', 1000)
        found, calls = found + len(keys), calls + 1
        if cursor == b'0':
            break
    print(f'run {run}  {(cpu() - c0) * 1e3:.0f} ms of Redis CPU for a walk of {int(call("DBSIZE"))} keys '
          f'({calls} SCAN calls, {found} stats: keys found)')
EOF
