-- A set's slice moved by the cleaner out of its HyperLogLog into its block of fixed slots
-- (src/store/history.rs, docs/layout.md "History: fixed slots"), in the block's slot; the
-- HyperLogLog is deleted afterwards by set_drop.lua, in its own slot.
-- KEYS[1]: the block. ARGV: the slot, the block's slots, its time to live (s: until its newest
-- slice leaves the retention), the slice's count of distinct members.
-- The slot takes the count, or keeps its own where that is larger (a slice moved, then written
-- late, is the larger of its parts: no member counted twice), so a move repeated changes
-- nothing. Returns {whether the slot held a value before, the count it holds}, or {-1, 0} for
-- another program's key under the block's name (nothing written).
local key, slot, slots, count = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local GROUP = 65
local group = math.floor(slot / 8) * GROUP
local flag, at = group * 8 + slot % 8, (group + 1 + (slot % 8) * 8) * 8
-- Made whole at once (its last byte touched), as history.lua makes a counter's.
local r = redis.pcall('BITFIELD', key, 'INCRBY', 'u8', (slots / 8 * GROUP - 1) * 8, 0,
  'GET', 'u1', flag, 'GET', 'i64', at)
if r.err then
  return {-1, 0}
end
redis.call('EXPIRE', key, ARGV[3])
local held, old = r[2], r[3]
if held == 1 and old >= count then
  return {1, old}
end
redis.call('BITFIELD', key, 'SET', 'i64', at, count, 'SET', 'u1', flag, 1)
return {held, count}
