#!/usr/bin/env bash
# What a render's hash reads cost Redis (issue 52: a render within 2x of Redis's own time):
# for each shape, its commands' own time (INFO commandstats, what "Redis's own time" means in
# docs/benchmarks.md) beside the CPU its process spends on them (INFO cpu: reading the request's
# arguments and writing the reply too), a call, medians of `rounds` rounds of 200 pipelined calls.
# Shapes: a day of minutes read from a hash holding that day (1 440 fields) and from one full at
# `--sample-count 2880` (2 880), by `HMGET` of the 1 440 fields and by `HGETALL`; the book's
# hash of 120 slices (a listpack), all of it both ways.
#   scripts/read-cost.sh [rounds=5]
# Needs: apt-get install -y python3-redis
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
need_python_redis
start_redis "$dir/redis.sock"
/usr/bin/python3 - "$dir/redis.sock" "${1:-5}" <<'PY'
import statistics, sys
import redis
r = redis.Redis(unix_socket_path=sys.argv[1])
rounds = int(sys.argv[2])
def cpu():
    c = r.info("cpu")
    return c["used_cpu_user"] + c["used_cpu_sys"]
now = 1_760_001_200
print("shape                          command  own µs  process µs  process ÷ own")
for held, step, asked in ((1440, 60, 1440), (2880, 60, 1440), (120, 60, 120)):
    r.delete("h")
    r.hset("h", mapping={str(now - s * step): str(1 + s % 97) for s in range(held)})
    fields = [str(now - s * step) for s in range(asked)][::-1]
    for name, args in (("hmget", ["HMGET", "h", *fields]), ("hgetall", ["HGETALL", "h"])):
        own, process = [], []
        for _ in range(rounds):
            p = r.pipeline(transaction=False)
            for _ in range(200):
                p.execute_command(*args)
            r.config_resetstat()
            c0 = cpu()
            p.execute()
            c1 = cpu()
            stat = r.info("commandstats")["cmdstat_" + name]
            own.append(stat["usec_per_call"])
            process.append((c1 - c0) / stat["calls"] * 1e6)
        o, c = statistics.median(own), statistics.median(process)
        shape = f"{asked} of {held} ({r.object('encoding', 'h').decode()})"
        print(f"{shape:30} {name:8} {o:7.1f} {c:11.1f} {c / o:14.2f}")
PY
