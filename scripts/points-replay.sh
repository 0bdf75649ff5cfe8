#!/usr/bin/env bash
# What Redis spends on one carbon series' item of `points.lua` (issue 53: where the batch's
# script time goes). The release agent takes SERIES series of POINTS points ten seconds apart
# over carbon's plaintext (scripts/bench-carbon.sh's batch shape); the first series' flush
# script call is captured with MONITOR, then called again `calls` times against a second
# private Redis, emptied before each call, with the flush script as the source tree has it, or
# as EDIT (a Python file that rewrites the variable `src`, the script's text) makes it: Redis's
# own time a call for the script, and for the commands it called.
#
#   [SCHEMA=10s:6h,1m:7d,1h:90d,1d:5y] [POINTS=360] [EDIT=variant.py] \
#     scripts/points-replay.sh [calls=300] [rounds=2]
#
# Needs python3-redis.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-300}; rounds=${2:-2}
schema=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
. scripts/common.sh
sock=$dir/redis.sock
start_redis "$sock"
carbon=$(free_port)
start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$schema" \
  --carbon-tcp "127.0.0.1:$carbon" --cleaner-enabled false
redis-cli -s "$sock" monitor >"$dir/monitor" &
monitor=$!
sleep 0.5
/usr/bin/python3 - "$carbon" "${POINTS:-360}" <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
now, points = int(time.time()), int(sys.argv[2])
s.sendall("".join(f"bench.host0.metric0 {k % 1000 / 10} {now - (points - k) * 10}\n" for k in range(points)).encode())
s.close()
PY
until grep -q '"EVALSHA"' "$dir/monitor"; do sleep 0.2; done
kill "$monitor"
port=$(free_port)
start_node "$port"
/usr/bin/python3 - "$dir/monitor" "$port" "$calls" "$rounds" "${EDIT:-}" <<'PY'
import re, sys, redis
monitor, port, calls, rounds, edit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
line = next(l for l in open(monitor, 'rb') if b'"EVALSHA"' in l and b'[0 lua]' not in l)
# MONITOR's quoting: "..." with C escapes (\xHH, \n, \r, \t, \a, \b, \", \\).
escapes = {b'n': b'\n', b'r': b'\r', b't': b'\t', b'a': b'\a', b'b': b'\b', b'"': b'"', b'\\': b'\\'}
def unquote(m):
    out, s, j = bytearray(), m.group(1), 0
    while j < len(s):
        if s[j:j + 1] == b'\\':
            if s[j + 1:j + 2] == b'x':
                out.append(int(s[j + 2:j + 4], 16)); j += 4
            else:
                out += escapes[s[j + 1:j + 2]]; j += 2
        else:
            out += s[j:j + 1]; j += 1
    return bytes(out)
args = [unquote(m) for m in re.finditer(rb'"((?:[^"\\]|\\.)*)"', line)][3:]
src = ''.join(open(f'src/store/{f}.lua').read() for f in ['retention', 'hourly', 'numbers', 'points', 'flush'])
if edit:
    exec(open(edit).read())
r = redis.Redis(port=port)
sha = r.script_load(src)
for _ in range(rounds):
    r.config_resetstat()
    for _ in range(calls):
        r.flushall()
        r.evalsha(sha, 0, *args)
    stats = r.info('commandstats')
    inner = sum(v['usec'] for k, v in stats.items()
                if k not in ('cmdstat_evalsha', 'cmdstat_flushall', 'cmdstat_config|resetstat', 'cmdstat_info'))
    print(f"{edit or 'as is'}: {len(args)} arguments; the script {stats['cmdstat_evalsha']['usec'] / calls:.1f} us a call, "
          f"the commands it called {inner / calls:.1f} us")
PY
