-- Put after numbers.lua, in front of flush.lua: carbon points (docs/carbon.md), written as
-- whisper writes them. A point is set into its slice of the finest archive that keeps its age
-- (the agent chose the archive and the slice, and kept one point a slice), in the gauge
-- family's hash, gauge:<p>:<series>; then each coarser archive's slice over it is recomputed
-- from the finer archive's known slices in its interval, written only when known / total
-- reaches the series' xFilesFactor, else left as it was, and the next archive is built from
-- that one (whisper's __archive_update_many and __propagate). Setting and recomputing are
-- idempotent: a chunk applied twice changes nothing.

-- The slices a gauge's hash keeps of a long archive before the cleaner moves them into its
-- blocks (history.lua's GAUGE_HASH_SLICES), a block's group of eight slots, and how long past
-- the hash's own boundary the cleaner may have moved (a clock ahead of the agent's; as the
-- readers allow).
local POINT_HASH_SLICES, POINT_GROUP, POINT_MARGIN = 16, 65, 300

-- whisper.aggregate: `known` are the known values in time order, `total` the slices.
local aggregations = {
  average = function(known)
    local s = 0
    for _, v in ipairs(known) do s = s + v end
    return s / #known
  end,
  sum = function(known)
    local s = 0
    for _, v in ipairs(known) do s = s + v end
    return s
  end,
  avg_zero = function(known, total)
    local s = 0
    for _, v in ipairs(known) do s = s + v end
    return s / total
  end,
  last = function(known) return known[#known] end,
  max = function(known)
    local m = known[1]
    for _, v in ipairs(known) do if v > m then m = v end end
    return m
  end,
  min = function(known)
    local m = known[1]
    for _, v in ipairs(known) do if v < m then m = v end end
    return m
  end,
  -- Python's max/min with key=abs: the first of equal magnitudes.
  absmax = function(known)
    local m = known[1]
    for _, v in ipairs(known) do if math.abs(v) > math.abs(m) then m = v end end
    return m
  end,
  absmin = function(known)
    local m = known[1]
    for _, v in ipairs(known) do if math.abs(v) < math.abs(m) then m = v end end
    return m
  end,
}

-- A double as text that reads back as the same double, as short as %.15g allows.
local function point_text(v)
  local s = string.format('%.15g', v)
  if tonumber(s) ~= v then
    s = string.format('%.17g', v)
  end
  return s
end

-- The name of gauge block `block` of `series` at `archive` (docs/layout.md, "History: fixed
-- slots").
local function block_key(prefix, series, archive, block)
  return prefix .. 'history:gauge:' .. archive.text .. ':' .. series .. ':' .. whole_text(archive.slots) .. ':' .. whole_text(block)
end

-- The slot of slice `t` in the gauge block of `series` at `archive`, or nil.
local function block_value(prefix, series, archive, t)
  local index = t / archive.p
  local block, slot = math.floor(index / archive.slots), index % archive.slots
  local key = block_key(prefix, series, archive, block)
  local at = math.floor(slot / 8) * POINT_GROUP
  local group = redis.call('GETRANGE', key, whole_text(at), whole_text(at + POINT_GROUP - 1))
  if #group < POINT_GROUP then
    return nil
  end
  local j = slot % 8
  local flag = string.byte(group, 1)
  if math.floor(flag / 2 ^ (7 - j)) % 2 ~= 1 then
    return nil
  end
  return struct.unpack('>d', string.sub(group, 2 + j * 8, 9 + j * 8))
end

-- Archives as the points section lists them and a pending rollup names them: each its
-- precision (and as text), seconds kept and slots a block.
local function archive(p, kept, slots)
  return {p = tonumber(p), text = p, kept = tonumber(kept), slots = tonumber(slots)}
end

local function hash_of(prefix, archives, series, a)
  return prefix .. 'gauge:' .. archives[a].text .. ':' .. series
end

-- Sets `fields` (slice, value, ...) into archive `a`'s hash; its index member into `members`.
local function set(prefix, archives, series, a, fields, members)
  local hash = hash_of(prefix, archives, series, a)
  for j = 1, #fields, 2000 do
    redis.call('HSET', hash, unpack(fields, j, math.min(j + 1999, #fields)))
  end
  members[#members + 1] = '0'
  members[#members + 1] = archives[a].text .. ':' .. series
end

-- Takes `slices` (texts) out of `hash`, where an older value would read before the block's:
-- only those it holds. An HDEL of a field a listpack does not hold scans all of it (about 4 µs
-- a field at 120 fields), so a batch's old slices sent to a series whose hash is full (a
-- relay's backlog, a batch sent again) cost Redis a millisecond a series; one HKEYS of a short
-- hash finds the few it holds (docs/benchmarks.md, "Old slices taken out of a full hash"). A
-- few slices are deleted as they are (a few scans cost less than the read), and so are those
-- of a hash of over 1 024 fields (the read's cost kept bounded; such a hash may have left its
-- listpack, and an HDEL there finds its field at once).
local function take_out(hash, slices)
  if #slices == 0 then
    return
  end
  local n = redis.call('HLEN', hash)
  if n == 0 then
    return
  end
  if n <= 1024 and #slices > 8 then
    local held = {}
    for _, f in ipairs(redis.call('HKEYS', hash)) do
      held[f] = true
    end
    local present = {}
    for _, f in ipairs(slices) do
      if held[f] then
        present[#present + 1] = f
      end
    end
    slices = present
  end
  for j = 1, #slices, 1000 do
    redis.call('HDEL', hash, unpack(slices, j, math.min(j + 999, #slices)))
  end
end

-- The `total` slices of precision `p` from `t` on, as numbers and as text: the same for every
-- series of a call, so made once.
local intervals = {}
local function interval(t, p, total)
  local by_total = intervals[total]
  if by_total == nil then
    by_total = {}
    intervals[total] = by_total
  end
  local by_p = by_total[p]
  if by_p == nil then
    by_p = {}
    by_total[p] = by_p
  end
  local made = by_p[t]
  if made == nil then
    local fields, texts = {}, {}
    for k = 1, total do
      fields[k] = t + (k - 1) * p
      texts[k] = whole_text(fields[k])
    end
    made = {fields, texts}
    by_p[t] = made
  end
  return made[1], made[2]
end

-- The slice `t` of archive `lower` made of archive `higher`'s (`wrote`: those just written
-- there, by slice, which are all that is read when they fill the interval), or nil where too
-- few are known.
local function propagate(prefix, now, archives, method, xff, t, higher, lower, series, wrote)
  local h = archives[higher]
  local total = archives[lower].p / h.p
  local fields, texts = interval(t, h.p, total)
  local whole = true
  for k = 1, total do
    if wrote[fields[k]] == nil then
      whole = false
      break
    end
  end
  local values = {}
  if whole then
    for k = 1, total do values[k] = wrote[fields[k]] end
  elseif total <= 1000 then
    values = redis.call('HMGET', hash_of(prefix, archives, series, higher), unpack(texts))
  else
    -- Lua's unpack takes at most about 8 000 values: a day of ten-second slices, in parts.
    local hash = hash_of(prefix, archives, series, higher)
    for j = 1, total, 1000 do
      for k, v in ipairs(redis.call('HMGET', hash, unpack(texts, j, math.min(j + 999, total)))) do
        values[j + k - 1] = v
      end
    end
  end
  local in_hash = now - now % h.p - (POINT_HASH_SLICES - 1) * h.p + POINT_MARGIN
  local stale, blocks = now - h.kept, h.slots > 0
  local known, n = {}, 0
  for k = 1, total do
    local v = tonumber(values[k])
    if v == nil and blocks and fields[k] < in_hash then
      v = block_value(prefix, series, h, fields[k])
    end
    -- A slice past the archive's retention is whisper's stale slot: not known.
    if v ~= nil and fields[k] > stale then
      n = n + 1
      known[n] = v
    end
  end
  if n == 0 or n / total < xff then
    return nil
  end
  local value = aggregations[method](known, total)
  if value ~= value or value == math.huge or value == -math.huge then
    return nil
  end
  return value
end

-- A block made once a call: its whole length at once, kept until its newest slice leaves the
-- retention, as the cleaner makes it; false where the name holds another type.
local blocks_made = {}
local function make_block(key, archive, block, now)
  local made = blocks_made[key]
  if made == nil then
    local slots, p = archive.slots, archive.p
    local r = redis.pcall('BITFIELD', key, 'INCRBY', 'u8', (slots / 8 * POINT_GROUP - 1) * 8, 0)
    made = not r.err
    if made then
      redis.call('EXPIRE', key, math.max((block + 1) * slots * p + archive.kept - now, 1))
    end
    blocks_made[key] = made
  end
  return made
end

-- The `fields` (slice, value, ...) of archive `a` older than the newest slices its hash keeps,
-- but the newest of them (which keeps the hash, and its index member; with `all_old`, the agent
-- kept it already), set straight into their blocks as the cleaner would move them (history.lua:
-- a group of eight slots a SETRANGE, read first where the item does not fill it) and taken out
-- of the hash, where an older value would hide them: a batch of old points neither grows the
-- hash nor waits for the cleaner's move. Returns the fields left for the hash. A block name
-- holding another type takes nothing.
local function set_blocks(prefix, archives, a, series, fields, now, all_old)
  local archive = archives[a]
  if archive.slots == 0 or (#fields < 4 and not all_old) then
    return fields
  end
  local p, slots = archive.p, archive.slots
  local keep_from = now - now % p - (POINT_HASH_SLICES - 1) * p
  local newest = -1
  if not all_old then
    for f = 1, #fields, 2 do
      local t = tonumber(fields[f])
      if t > newest then newest = t end
    end
  end
  local groups, order = {}, {}
  for f = 1, #fields, 2 do
    local t = tonumber(fields[f])
    if t < keep_from and t ~= newest then
      local index = t / p
      local block, slot = math.floor(index / slots), index % slots
      local first = index - slot % 8
      local g = groups[first]
      if g == nil then
        g = {block = block, at = math.floor(slot / 8) * POINT_GROUP, values = {}, fields = {}}
        groups[first] = g
        order[#order + 1] = first
      end
      g.values[slot % 8] = tonumber(fields[f + 1])
      g.fields[#g.fields + 1] = f
    end
  end
  if #order == 0 then
    return fields
  end
  local moved = {}
  for _, first in ipairs(order) do
    local g = groups[first]
    local key = block_key(prefix, series, archive, g.block)
    if make_block(key, archive, g.block, now) then
      local full = true
      for j = 0, 7 do
        if g.values[j] == nil then
          full = false
          break
        end
      end
      local current, flag = nil, 255
      if not full then
        current = redis.call('GETRANGE', key, g.at, g.at + POINT_GROUP - 1)
        flag = string.byte(current, 1)
      end
      local parts = {}
      for j = 0, 7 do
        local v = g.values[j]
        if v ~= nil then
          parts[j + 2] = struct.pack('>d', v)
          if math.floor(flag / 2 ^ (7 - j)) % 2 == 0 then
            flag = flag + 2 ^ (7 - j)
          end
        else
          parts[j + 2] = string.sub(current, 2 + j * 8, 9 + j * 8)
        end
      end
      parts[1] = string.char(flag)
      redis.call('SETRANGE', key, g.at, table.concat(parts))
      for _, f in ipairs(g.fields) do
        moved[f] = true
      end
    end
  end
  local left, gone = {}, {}
  for f = 1, #fields, 2 do
    if moved[f] then
      gone[#gone + 1] = fields[f]
    else
      left[#left + 1], left[#left + 2] = fields[f], fields[f + 1]
    end
  end
  take_out(hash_of(prefix, archives, series, a), gone)
  return left
end

-- A pending rollup (docs/carbon.md, "Rollups"): slice `t` of archive `lower` is to be made
-- again, and every coarser archive's slice over it after it. The member names all the
-- rollup needs, so that whichever agent runs it needs no configuration of its own:
-- lower|slice|method|xFilesFactor|archives|series, the archives as p:kept:slots,...
local function pending_member(lower, t, method, xff, spec, series)
  return lower .. '|' .. t .. '|' .. method .. '|' .. xff .. '|' .. spec .. '|' .. series
end

-- Sets ARGV's `n` pairs (slice, value) from `from` into archive `a`'s hash.
local function set_args(prefix, archives, series, a, from, n, members)
  if n == 0 then
    return
  end
  local hash = hash_of(prefix, archives, series, a)
  for j = from, from + 2 * n - 1, 2000 do
    redis.call('HSET', hash, unpack(ARGV, j, math.min(j + 1999, from + 2 * n - 1)))
  end
  members[#members + 1] = '0'
  members[#members + 1] = archives[a].text .. ':' .. series
end

-- Applies the values the agent wrote of archive `a` from ARGV[j] (src/store/write/points.rs):
-- the hash's pairs, the old pairs (set into blocks here, groups read first), the runs of whole
-- groups (block, byte offset, bytes: SETRANGE), then the runs' slices (taken out of the hash,
-- where an older value would hide them). Returns the index after them and how many slices it
-- wrote; `live` false only skips them.
local function put(prefix, now, archives, series, a, j, members, live)
  local nh = tonumber(ARGV[j])
  local hash_from = j + 1
  j = hash_from + 2 * nh
  local no = tonumber(ARGV[j])
  local old_from = j + 1
  j = old_from + 2 * no
  local nr = tonumber(ARGV[j])
  local runs_from = j + 1
  j = runs_from + 3 * nr
  local slices_from = j
  for r = 0, nr - 1 do
    j = j + #ARGV[runs_from + 3 * r + 2] / POINT_GROUP * 8
  end
  if not live then
    return j, 0
  end
  local archive = archives[a]
  if j > slices_from then
    local slices = {}
    for k = slices_from, j - 1 do
      slices[#slices + 1] = ARGV[k]
    end
    take_out(hash_of(prefix, archives, series, a), slices)
  end
  local fields, at = {}, slices_from
  for r = 0, nr - 1 do
    local block, offset, bytes = ARGV[runs_from + 3 * r], ARGV[runs_from + 3 * r + 1], ARGV[runs_from + 3 * r + 2]
    local key = block_key(prefix, series, archive, tonumber(block))
    local n = #bytes / POINT_GROUP * 8
    if make_block(key, archive, tonumber(block), now) then
      redis.call('SETRANGE', key, offset, bytes)
    else
      -- A block name holding another type takes nothing: the values go to the hash.
      for k = 0, n - 1 do
        local g = math.floor(k / 8) * POINT_GROUP
        fields[#fields + 1] = ARGV[at + k]
        fields[#fields + 1] = point_text(struct.unpack('>d', string.sub(bytes, g + 2 + (k % 8) * 8, g + 9 + (k % 8) * 8)))
      end
    end
    at = at + n
  end
  if no > 0 then
    local old = {}
    for k = old_from, old_from + 2 * no - 1 do
      old[#old + 1] = ARGV[k]
    end
    for _, f in ipairs(set_blocks(prefix, archives, a, series, old, now, true)) do
      fields[#fields + 1] = f
    end
  end
  if #fields > 0 then
    set(prefix, archives, series, a, fields, members)
  end
  set_args(prefix, archives, series, a, hash_from, nh, members)
  return j, nh + no + (j - slices_from)
end

-- A points section of a build before the plans (a spool written before an upgrade): a count,
-- the archives, then each series' name, method, xFilesFactor, m and m triples of archive,
-- slice and value. Each series is refused as a write Redis refused (counted and logged by the
-- agent), not misread; `0`, no points, is the empty section. Returns the index after it.
local function refuse_unplanned(prefix, i)
  local n = tonumber(ARGV[i]) or 0
  if n == 0 then
    return i + 1
  end
  i = i + 2 + 3 * tonumber(ARGV[i + 1])
  for _ = 1, n do
    failed(prefix .. 'gauge:' .. ARGV[i], 'a carbon points section of an earlier release (a spool from before the upgrade): not applied')
    i = i + 4 + 3 * tonumber(ARGV[i + 3])
  end
  return i
end

-- The points section, from ARGV[i] (flush.lua documents it). Returns the index after it.
-- Each series' item is the agent's plan (src/store/write/points.rs): the coarser slices the
-- window alone decides it made itself; this script makes those it asks for from what the finer
-- archive holds, and leaves those of an open interval pending (ZADD to pending:gauge:) for the
-- next rollup run, which makes them from what the finer archive holds then: a point every few
-- seconds costs one rollup a run, not one each.
local function write_points(prefix, now, i)
  if ARGV[i] ~= 'plan' then
    return refuse_unplanned(prefix, i)
  end
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  local archives, specs = {}, {}
  for a = 1, tonumber(ARGV[i]) do
    local at = i + 1 + 3 * (a - 1)
    archives[a] = archive(ARGV[at], ARGV[at + 1], ARGV[at + 2])
    specs[a] = ARGV[at] .. ':' .. ARGV[at + 1] .. ':' .. ARGV[at + 2]
  end
  local spec = table.concat(specs, ',')
  i = i + 1 + 3 * #archives
  local index = prefix .. 'known:gauge:'
  local pending_key = prefix .. 'pending:gauge:'
  local members, pending = {}, {}
  -- A pending member's score is when it was first written (NX: a later point leaves the
  -- sorted set as it is): a run makes the older first, so that of two members of one slice
  -- (an aggregation changed at SIGHUP) the newer decides.
  local now_text = whole_text(now)
  local function defer(lower, t, method, xff_text, series)
    pending[#pending + 1] = now_text
    pending[#pending + 1] = pending_member(lower, t, method, xff_text, spec, series)
  end

  -- An item from ARGV[j]: its chains, each the archive of its points, their values (put), a
  -- count of levels, and each level (the next coarser archive) the values made by the agent,
  -- the slices to make here, and the slices to leave pending. Below a level that gets no
  -- slice, a chain stops, as whisper's carrying down does. (A point of the present, the agent's
  -- `p` item, never comes here: the writer sends it as bare commands, src/store/write/standalone.rs.)
  local function write(series, method, xff_text, j)
    local xff = tonumber(xff_text)
    local chains = tonumber(ARGV[j])
    j = j + 1
    for _ = 1, chains do
      local a = tonumber(ARGV[j])
      j = put(prefix, now, archives, series, a, j + 1, members, true)
      local levels = tonumber(ARGV[j])
      j = j + 1
      local live = true
      for lower = a + 1, a + levels do
        local wrote
        j, wrote = put(prefix, now, archives, series, lower, j, members, live)
        local asks = tonumber(ARGV[j])
        if live and asks > 0 then
          local made = {}
          for k = j + 1, j + asks do
            local v = propagate(prefix, now, archives, method, xff, tonumber(ARGV[k]), lower - 1, lower, series, {})
            if v ~= nil then
              made[#made + 1], made[#made + 2] = ARGV[k], point_text(v)
            end
          end
          if #made > 0 then
            set(prefix, archives, series, lower, set_blocks(prefix, archives, lower, series, made, now, false), members)
          end
          wrote = wrote + #made / 2
        end
        j = j + 1 + asks
        local defers = tonumber(ARGV[j])
        if live then
          for k = j + 1, j + defers do
            defer(lower, ARGV[k], method, xff_text, series)
          end
        end
        j = j + 1 + defers
        live = live and wrote > 0
      end
    end
  end

  for _ = 1, n do
    local series, method, xff, len = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
    local ok, err = pcall(write, series, method, xff, i + 4)
    if not ok then
      failed(prefix .. 'gauge:' .. archives[1].text .. ':' .. series, err)
    end
    i = i + 4 + len
  end
  for j = 1, #members, 1000 do
    try(index, 'ZADD', index, unpack(members, j, math.min(j + 999, #members)))
  end
  for j = 1, #pending, 1000 do
    try(pending_key, 'ZADD', pending_key, 'NX', unpack(pending, j, math.min(j + 999, #pending)))
  end
  return i
end
