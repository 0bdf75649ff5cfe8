-- An imported block (src/import.rs, docs/moving-from-graphite.md): the slots an import sets in one
-- block of a long archive (src/store/history.rs), and the same slices taken out of the book's
-- hash, in one atomic call, so that a slice is in the hash or in the block, never in both (the
-- cleaner adds a hash's count into its slot: a slice in both would count twice).
--
-- KEYS: the block, the hash. ARGV: the block's bytes with the imported slots flagged, its TTL
-- (seconds), the first slice it holds, the precision.
-- A new block is made whole by one SET; in one that exists (the cleaner moved slices into it, or
-- an import did before), only the imported slots are set: an import sets, never adds, so a second
-- one changes nothing. Returns the slots set.

local block, hash = KEYS[1], KEYS[2]
local image, ttl, start, precision = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local GROUP = 65
local fresh = redis.call('EXISTS', block) == 0
if fresh then
  redis.call('SET', block, image, 'EX', ttl)
end
local fields = {}
for g = 0, #image / GROUP - 1 do
  local flags = string.byte(image, g * GROUP + 1)
  if flags ~= 0 then
    for j = 0, 7 do
      if bit.band(flags, bit.rshift(0x80, j)) ~= 0 then
        fields[#fields + 1] = start + (g * 8 + j) * precision
        if not fresh then
          local at = g * GROUP + 1 + j * 8
          redis.call('SETRANGE', block, at, string.sub(image, at + 1, at + 8))
          redis.call('SETBIT', block, g * GROUP * 8 + j, 1)
        end
      end
    end
  end
end
if not fresh then
  redis.call('EXPIRE', block, ttl)
end
for j = 1, #fields, 1000 do
  redis.call('HDEL', hash, unpack(fields, j, math.min(j + 999, #fields)))
end
return #fields
