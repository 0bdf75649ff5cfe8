-- Put in front of clean.lua and clean_slot.lua, after retention.lua and history.lua
-- (src/store/cleaner.rs): the book's clean_counters for one hash.

-- The slices of a long archive's hash a quick visit asks for (see `trim`): those that left the
-- newest slices it keeps since the pass at `since`, with two more before them. A visit that would ask
-- more reads the whole hash.
local QUICK_MOST = 64

-- A hash of at most this many fields is read whole anyway: that costs about what the few fields
-- asked cost, and such a hash (a new series, a sparse one) is where an older slice is likeliest.
local QUICK_LEAST = 16

-- Deletes the slices of `hash` at or before `now - kept(precision)` (retention.lua's function);
-- returns how many, the slices moved (below), and how many fields the hash surely still holds
-- (more than 0: it is a hash, and not empty; else `is_hash` asks). A key of another type
-- (another program's under our names) is left alone.
-- With `slots` (a long archive's cut: history.lua), the slices older than the hash keeps are
-- moved into the blocks named `block_base:<n>` first.
-- With `since` (the `now` of a pass that moved everything older than the hash kept then), the
-- visit is quick: it reads only the slices that have left the hash's newest since (an `HMGET`
-- of a few fields, not the whole hash), unless the hash holds more fields than the newest and
-- those (a hash of an earlier release, a burst of late slices) or at most QUICK_LEAST. A late
-- slice of a longer hash older than the visit asks for, and a slice past the retention, wait
-- for the next full visit (`FULL_EVERY` passes,
-- src/store/cleaner.rs); readers read the hash whole, so both read as they should meanwhile.
local function quick_fields(hash, precision, now, since, gauge)
  local n = redis.pcall('HLEN', hash)
  if type(n) ~= 'number' then
    return nil
  end
  local from = keep_from(since, precision, gauge) - 2 * precision
  local asked = {}
  for t = math.max(from, 0), keep_from(now, precision, gauge) - precision, precision do
    asked[#asked + 1] = whole_text(t)
  end
  if n <= QUICK_LEAST or #asked > QUICK_MOST or n > hash_slices(gauge) + #asked + 1 then
    return nil
  end
  local fields = {}
  if #asked > 0 then
    local values = redis.call('HMGET', hash, unpack(asked))
    for i, v in ipairs(values) do
      if v then
        fields[#fields + 1] = asked[i]
        fields[#fields + 1] = v
      end
    end
  end
  -- Every field found: the hash's newest is among them, and stays. Else the others keep it.
  return fields, #fields / 2 < n, n
end

local function trim(hash, precision, now, kept, slots, block_base, gauge, since)
  local cutoff = now - kept(precision)
  local fields, others, held
  if slots and since and since > 0 then
    fields, others, held = quick_fields(hash, precision, now, since, gauge)
  end
  if not fields then
    fields = redis.pcall(slots and 'HGETALL' or 'HKEYS', hash)
    if fields.err then
      return 0, 0, 0
    end
  end
  -- Each field's slice as a number, once (Lua's tonumber is what a visit costs).
  local step = slots and 2 or 1
  held = held or #fields / step
  local times, oldest, newest = {}, nil, -1
  for i = 1, #fields, step do
    local t = tonumber(fields[i])
    times[i] = t
    if t then
      if t > newest then newest = t end
      if not oldest or t < oldest then oldest = t end
    end
  end
  local moved = 0
  if slots and oldest and oldest < keep_from(now, precision, gauge) then
    moved = move(hash, block_base .. ':' .. whole_text(slots), precision, slots, fields, times,
      newest, now, cutoff, kept(precision), gauge, others)
  end
  local old = {}
  if oldest and oldest <= cutoff then
    for i = 1, #fields, step do
      local t = times[i]
      if t and t <= cutoff then
        old[#old + 1] = fields[i]
      end
    end
  end
  -- HDEL in bounded groups: Lua's unpack has a stack limit.
  for j = 1, #old, 1000 do
    redis.call('HDEL', hash, unpack(old, j, math.min(j + 999, #old)))
  end
  return #old, moved, held - #old - moved
end


-- Whether `hash` is one of ours still: a hash. Gone, or a key of another type (another
-- program's), its index member goes.
local function is_hash(hash)
  return redis.call('TYPE', hash).ok == 'hash'
end
