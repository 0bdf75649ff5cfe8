"""Candidate layouts for long histories, measured before one is built (issue 52): what a write
and a read cost Redis, and the bytes a point takes, at a short archive and a five-year one.

  hash      today's: one HASH a series and precision, a field a slice (`HINCRBY`), kept a
            listpack (hash-max-listpack-entries above the archive's length); a read is
            `HGETALL` (the Graphite source reads the whole hash today).
  buckets   HASHes of 1024 slices each (`<key>:<slice // 1024>`), the field the slice's place
            in its bucket, a bucket expiring with its last slice (`HINCRBY`; a read `HGETALL`s
            the buckets its range touches).
  slots     one STRING a series and precision, whisper's fixed slots: blocks of 64 slots of 8
            bytes (a signed integer; the smallest one is "no point") behind an 8-byte tag, the
            block's cycle through the archive; a write (a script) checks the tag, fills a stale
            block with "no point", and adds to its slot; a read is one `GETRANGE` (two where the
            range wraps) and its tags checked.

Run by scripts/history-layouts.sh, which starts the Redis. Prints one row per layout and archive.
"""
import struct
import sys
import time

import redis

SOCKET, SERIES, WRITES, READ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
P = 600  # the precision: 10-minute slices, as Etsy's 10min:1800d
NOW = int(time.time()) // P * P
r = redis.Redis(unix_socket_path=SOCKET)

SLOTS = """
local key, slot, n, count = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local index = slot % count
local block, cycle = math.floor(index / 64), math.floor(slot / count)
local at = block * 520
local tag = redis.call('GETRANGE', key, at, at + 7)
if #tag < 8 or struct.unpack('<l', tag) ~= cycle then
  redis.call('SETRANGE', key, at, struct.pack('<l', cycle) .. string.rep(struct.pack('<l', -2^63), 64))
end
local place = at + 8 + (index % 64) * 8
local old = struct.unpack('<l', redis.call('GETRANGE', key, place, place + 7))
if old == -2^63 then old = 0 end
redis.call('SETRANGE', key, place, struct.pack('<l', old + n))
return 1
"""
slots_write = r.register_script(SLOTS)
NONE = -(2**63)


def cpu():
    i = r.info("cpu")
    return i["used_cpu_user"] + i["used_cpu_sys"]


def fill(layout, key, count):
    """An archive of `count` slices, every one holding a point, the newest at NOW."""
    first = NOW // P - count + 1
    if layout == "hash":
        for j in range(0, count, 5000):
            r.hset(key, mapping={(first + k) * P: 1 for k in range(j, min(j + 5000, count))})
    elif layout == "buckets":
        buckets = {}
        for k in range(count):
            slot = first + k
            buckets.setdefault(slot // 1024, {})[slot % 1024] = 1
        for b, fields in buckets.items():
            r.hset(f"{key}:{b}", mapping=fields)
    else:
        blocks = bytearray((count + 63) // 64 * 520)
        for k in range(count):
            slot = first + k
            index = slot % count
            at = index // 64 * 520
            struct.pack_into("<q", blocks, at, slot // count)
            struct.pack_into("<q", blocks, at + 8 + index % 64 * 8, 1)
        r.set(key, bytes(blocks))


def write(pipe, layout, key, slot, count):
    if layout == "hash":
        pipe.hincrby(key, slot * P, 1)
    elif layout == "buckets":
        pipe.hincrby(f"{key}:{slot // 1024}", slot % 1024, 1)
    else:
        slots_write(keys=[key], args=[slot, 1, count], client=pipe)


def read(layout, key, count, n):
    """The newest `n` slices' values (None where no point)."""
    last = NOW // P + WRITES // SERIES
    first = last - n + 1
    if layout == "hash":
        values = r.hgetall(key)
        return [values.get(str(s * P).encode()) for s in range(first, last + 1)]
    if layout == "buckets":
        out = []
        for b in range(first // 1024, last // 1024 + 1):
            values = r.hgetall(f"{key}:{b}")
            out += [values.get(str(s % 1024).encode()) for s in range(max(first, b * 1024), min(last, b * 1024 + 1023) + 1)]
        return out
    # slots: the blocks holding the range, one GETRANGE per unwrapped run
    out = []
    s = first
    while s <= last:
        index = s % count
        run = min(last - s + 1, count - index)
        lo, hi = index // 64 * 520, (index + run - 1) // 64 * 520 + 519
        data = r.getrange(key, lo, hi)
        for k in range(run):
            i = index + k
            at = i // 64 * 520 - lo
            tag = struct.unpack_from("<q", data, at)[0]
            v = struct.unpack_from("<q", data, at + 8 + i % 64 * 8)[0]
            out.append(None if tag != (s + k) // count or v == NONE else v)
        s += run
    return out


print(f"{'layout':8} {'archive':>8} {'bytes/point':>11} {'write us':>9} {'read us':>9} (Redis CPU; a read of {READ} slices)")
for count in (720, 259200):
    for layout in ("hash", "buckets", "slots"):
        r.flushall()
        keys = [f"h:{P}:s{i}" for i in range(SERIES)]
        # Filled as hash tables (a listpack takes a field in time of its length), then made the
        # listpacks the agent asks for by a reload, as its import makes them whole at once.
        r.config_set("hash-max-listpack-entries", 128)
        for key in keys:
            fill(layout, key, count)
        r.config_set("hash-max-listpack-entries", 300000)
        r.execute_command("DEBUG", "RELOAD")
        used = sum(r.memory_usage(k, samples=0) for k in r.scan_iter(count=1000))
        c0 = cpu()
        pipe = r.pipeline(transaction=False)
        for w in range(WRITES):
            write(pipe, layout, keys[w % SERIES], NOW // P + 1 + w // SERIES, count)
            if len(pipe) >= 1000:
                pipe.execute()
        pipe.execute()
        per_write = (cpu() - c0) / WRITES * 1e6
        c0 = cpu()
        for key in keys:
            got = read(layout, key, count, READ)
            assert len(got) == READ and got[-1] is not None, (layout, len(got), got[-1])
        per_read = (cpu() - c0) / SERIES * 1e6
        print(f"{layout:8} {count:8} {used / (SERIES * count):11.2f} {per_write:9.2f} {per_read:9.0f}")
