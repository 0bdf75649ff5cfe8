-- An imported block (src/import.rs, docs/moving-from-graphite.md): the slots an import sets in one
-- block of a long archive (src/store/history.rs), and the same slices taken out of the book's
-- hash, in one atomic call, so that a slice is in the hash or in the block, never in both (the
-- cleaner adds a hash's count into its slot: a slice in both would count twice).
--
-- KEYS: the block, the hash. ARGV: the block's bytes with the imported slots flagged, its TTL
-- (seconds), the first slice it holds, the precision, how many slots are imported.
-- A new block is made whole by one SET; in one that exists (the cleaner moved slices into it, or
-- an import did before), only the imported slots are set: an import sets, never adds, so a second
-- one changes nothing. Returns the slots set.

local block, hash = KEYS[1], KEYS[2]
local image, ttl, start, precision = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local count = tonumber(ARGV[5])
local GROUP = 65
local fresh = redis.call('EXISTS', block) == 0
if fresh then
  redis.call('SET', block, image, 'EX', ttl)
end
-- Whether slot `slot` is among the imported ones.
local function imported(slot)
  local flags = string.byte(image, math.floor(slot / 8) * GROUP + 1)
  return bit.band(flags, bit.rshift(0x80, slot % 8)) ~= 0
end
if not fresh then
  for g = 0, #image / GROUP - 1 do
    if string.byte(image, g * GROUP + 1) ~= 0 then
      for j = 0, 7 do
        if imported(g * 8 + j) then
          local at = g * GROUP + 1 + j * 8
          redis.call('SETRANGE', block, at, string.sub(image, at + 1, at + 8))
          redis.call('SETBIT', block, g * GROUP * 8 + j, 1)
        end
      end
    end
  end
  redis.call('EXPIRE', block, ttl)
end
-- The same slices out of the hash, if it holds any: a short hash (the agent's newest slices) is
-- looked through; a long one (an earlier release's whole archive) is asked for each slice.
local held = redis.call('HLEN', hash)
if held > 0 then
  local slots = #image / GROUP * 8
  local gone = {}
  if held <= 2 * slots then
    for _, f in ipairs(redis.call('HKEYS', hash)) do
      local t = tonumber(f)
      if t and t >= start and t < start + slots * precision and t % precision == 0
        and imported((t - start) / precision) then
        gone[#gone + 1] = f
      end
    end
  else
    for slot = 0, slots - 1 do
      if imported(slot) then gone[#gone + 1] = start + slot * precision end
    end
  end
  for j = 1, #gone, 1000 do
    redis.call('HDEL', hash, unpack(gone, j, math.min(j + 999, #gone)))
  end
end
return count
