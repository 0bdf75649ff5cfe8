-- Put in front of clean.lua and clean_slot.lua, after retention.lua and history.lua
-- (src/store/cleaner.rs): the book's clean_counters for one hash.

-- Deletes the slices of `hash` at or before `now - kept(precision)` (retention.lua's function);
-- returns how many. A key of another type (another program's under our names) is left alone.
-- With `slots` (a long archive's cut: history.lua), the slices older than the hash keeps are
-- moved into the blocks named `block_base:<n>` first; returns {deleted, moved}.
local function trim(hash, precision, now, kept, slots, block_base, gauge)
  local cutoff = now - kept(precision)
  local old = {}
  local fields = redis.pcall(slots and 'HGETALL' or 'HKEYS', hash)
  if fields.err then
    return 0, 0
  end
  local moved = 0
  if slots then
    moved = move(hash, block_base .. ':' .. slots, precision, slots, fields, now, cutoff,
      kept(precision), gauge)
    local names = {}
    for i = 1, #fields, 2 do names[#names + 1] = fields[i] end
    fields = names
  end
  for _, slice in ipairs(fields) do
    local t = tonumber(slice)
    if t and t <= cutoff then
      old[#old + 1] = slice
    end
  end
  -- HDEL in bounded groups: Lua's unpack has a stack limit.
  for j = 1, #old, 1000 do
    redis.call('HDEL', hash, unpack(old, j, math.min(j + 999, #old)))
  end
  return #old, moved
end


-- Whether `hash` is one of ours still: a hash. Gone, or a key of another type (another
-- program's), its index member goes.
local function is_hash(hash)
  return redis.call('TYPE', hash).ok == 'hash'
end
