#!/usr/bin/env bash
# What a gauge point of the present costs Redis if its writer also set it into its block, as a
# design where the cleaner deletes what leaves a hash instead of moving it would need
# (docs/benchmarks.md, "Where the rounds at steady state go"): SERIES series whose 10-second
# hashes hold their newest 16 slices, ROUNDS points each (two a slice: collectd's every 5 s),
# sent in transactions of 100 points as the flush sends them, three ways in turn:
#
#   hset:        the point's HSET alone (what the writer does now)
#   block:       and a BITFIELD setting its slot's value and flag in its block
#   block+hdel:  and, once a slice, an HDEL of the slice that left the hash's newest 16
#
# Redis's process CPU a point (INFO cpu), RUNS times each (median, then the runs).
#
#   scripts/block-write-cost.sh [series=20000] [runs=3] [rounds=12]
#
# Needs python3-redis.
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; runs=${2:-3}; rounds=${3:-12}
. scripts/common.sh
need_python_redis
sock=$dir/redis.sock
start_redis "$sock"

# cost MODE: Redis's CPU a point (µs) for one sending in MODE, on hashes filled afresh.
cost() {
  /usr/bin/python3 - "$sock" "$series" "$rounds" "$1" <<'PY'
import redis, struct, sys, time
sock, n, rounds, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
SLOTS, GROUP = 248, 65
r = redis.Redis(unix_socket_path=sock)
r.flushall()
now = int(time.time())
top = now - now % 10
p = r.pipeline(transaction=False)
for i in range(n):
    p.hset(f"gauge:10:s{i}", mapping={str(top - 150 + k * 10): str(k) for k in range(16)})
    # The block the points' slots are in, made whole as the cleaner makes it.
    p.setrange(f"history:gauge:10:s{i}:{SLOTS}:{(top // 10 + 6) // SLOTS}", SLOTS // 8 * GROUP - 1, b"\0")
    if i % 1000 == 999:
        p.execute()
p.execute()

def cpu():
    info = r.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]

c0 = cpu()
for k in range(rounds):
    t = top + 10 + k // 2 * 10
    value = k + 0.5
    bits = struct.unpack(">q", struct.pack(">d", value))[0]
    index = t // 10
    block, slot = index // SLOTS, index % SLOTS
    at = (slot // 8 * GROUP + 1 + slot % 8 * 8) * 8
    flag = slot // 8 * GROUP * 8 + slot % 8
    p = r.pipeline(transaction=True)
    for i in range(n):
        p.hset(f"gauge:10:s{i}", str(t), str(value))
        if mode != "hset":
            p.execute_command("BITFIELD", f"history:gauge:10:s{i}:{SLOTS}:{block}",
                              "SET", "i64", at, bits, "SET", "u1", flag, 1)
        if mode == "block+hdel" and k % 2 == 0:
            p.hdel(f"gauge:10:s{i}", str(t - 160))
        if i % 100 == 99:
            p.execute()
    p.execute()
print((cpu() - c0) * 1e6 / (n * rounds))
PY
}

declare -A got
for run in $(seq 1 "$runs"); do
  for mode in hset block block+hdel; do
    got[$mode]+="$(cost "$mode") "
  done
done
for mode in hset block block+hdel; do
  # shellcheck disable=SC2086
  show_runs "$mode, Redis's process CPU a point" 2 ${got[$mode]}
done
