-- Put in front of clean.lua and clean_slot.lua (src/store/cleaner.rs): the book's clean_counters
-- for one hash.

-- Deletes the slices of `hash` at or before `now - sample_count * precision`; returns how many.
local function trim(hash, precision, now, sample_count)
  local cutoff = now - sample_count * precision
  local old = {}
  for _, slice in ipairs(redis.call('HKEYS', hash)) do
    local t = tonumber(slice)
    if t and t <= cutoff then
      old[#old + 1] = slice
    end
  end
  -- HDEL in bounded groups: Lua's unpack has a stack limit.
  for j = 1, #old, 1000 do
    redis.call('HDEL', hash, unpack(old, j, math.min(j + 999, #old)))
  end
  return #old
end

