-- Put in front of flush.lua: carbon points (docs/carbon.md), written as whisper writes them.
-- A point is set into its slice of the finest archive that keeps its age (the agent chose
-- the archive and the slice, and kept one point a slice), in the gauge family's hash,
-- gauge:<p>:<series>; then each coarser archive's slice over it is recomputed from the finer
-- archive's known slices in its interval, written only when known / total reaches the
-- series' xFilesFactor, else left as it was, and the next archive is built from that one
-- (whisper's __archive_update_many and __propagate). Setting and recomputing are idempotent:
-- a chunk applied twice changes nothing.

-- The slices the book's hash keeps of a long archive before the cleaner moves them into its
-- blocks (history.lua), a block's group of eight slots, and how long past the hash's own
-- boundary the cleaner may have moved (a clock ahead of the agent's; as the readers allow).
local POINT_HASH_SLICES, POINT_GROUP, POINT_MARGIN = 120, 65, 300

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

-- Redis 7.0 formats a number argument of redis.call with printf's %.17g, and Lua a number
-- joined to a string with %.14g: each several microseconds, most of a point's cost when a
-- point's coarser slices read a few dozen fields. So slices, offsets and precisions go to
-- Redis as text, each number written once a call (the items of a chunk share their slices):
-- %d, which gives the same digits for these whole numbers.
local point_texts = {}
local function whole_text(n)
  local s = point_texts[n]
  if s == nil then
    s = string.format('%d', n)
    point_texts[n] = s
  end
  return s
end

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
  else
    values = redis.call('HMGET', hash_of(prefix, archives, series, higher), unpack(texts))
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

-- The `fields` (slice, value, ...) of archive `a` older than the newest slices its hash keeps,
-- but the newest of them (which keeps the hash, and its index member), set straight into their
-- blocks as the cleaner would move them (history.lua: a group of eight slots a SETRANGE, read
-- first where the item does not fill it) and taken out of the hash, where an older value would
-- hide them: a batch of old points neither grows the hash nor waits for the cleaner's move.
-- Returns the fields left for the hash. A block name holding another type takes nothing.
local function set_blocks(prefix, archives, a, series, fields, now)
  local archive = archives[a]
  if archive.slots == 0 or #fields < 4 then
    return fields
  end
  local p, slots = archive.p, archive.slots
  local keep_from = now - now % p - (POINT_HASH_SLICES - 1) * p
  local newest = -1
  for f = 1, #fields, 2 do
    local t = tonumber(fields[f])
    if t > newest then newest = t end
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
  local moved, made = {}, {}
  for _, first in ipairs(order) do
    local g = groups[first]
    local key = block_key(prefix, series, archive, g.block)
    if made[key] == nil then
      -- Made whole at once and kept until its newest slice leaves the retention, as the
      -- cleaner makes it.
      local r = redis.pcall('BITFIELD', key, 'INCRBY', 'u8', (slots / 8 * POINT_GROUP - 1) * 8, 0)
      made[key] = not r.err
      if made[key] then
        redis.call('EXPIRE', key, math.max((g.block + 1) * slots * p + archive.kept - now, 1))
      end
    end
    if made[key] then
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
  local hash = hash_of(prefix, archives, series, a)
  for j = 1, #gone, 1000 do
    redis.call('HDEL', hash, unpack(gone, j, math.min(j + 999, #gone)))
  end
  return left
end

-- A pending rollup (docs/carbon.md, "Rollups"): slice `t` of archive `lower` is to be made
-- again, and every coarser archive's slice over it after it. The member names all the
-- rollup needs, so that whichever agent runs it needs no configuration of its own:
-- lower|slice|method|xFilesFactor|archives|series, the archives as p:kept:slots,...
local function pending_member(lower, t, method, xff, spec, series)
  return lower .. '|' .. whole_text(t) .. '|' .. method .. '|' .. xff .. '|' .. spec .. '|' .. series
end

-- Makes slice `t` of archive `lower` again from what the finer archive holds now, then the
-- slice over it in each coarser archive (a rollup's run). Unlike whisper's carrying down it
-- goes on past a slice too little known to be written: the pending member of a point stands
-- for the coarser slices over it too (write_points adds none of their own), and making one
-- from the finer archive as it is gives what whisper's last write over it gave.
local function roll(prefix, now, archives, series, method, xff, lower, t, members)
  local wrote = {}
  for a = 1, #archives do
    wrote[a] = {}
  end
  for l = lower, #archives do
    t = t - t % archives[l].p
    local v = propagate(prefix, now, archives, method, xff, t, l - 1, l, series, wrote[l - 1])
    if v ~= nil then
      set(prefix, archives, series, l, {whole_text(t), point_text(v)}, members)
      wrote[l][t] = v
    end
  end
end

-- The points section, from ARGV[i] (flush.lua documents it). Returns the index after it.
-- A coarser slice whose interval has ended by `now` is made at once; one still open is left
-- pending (ZADD to pending:gauge:) for the next rollup run, which makes it from what the
-- finer archive holds then: a point every few seconds costs one rollup a run, not one each.
local function write_points(prefix, now, i)
  local n = tonumber(ARGV[i]) or 0
  i = i + 1
  if n == 0 then
    return i
  end
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

  local function write(series, method, xff_text, first, m)
    -- The common item, a point of the present (a sender's every few seconds): set, and the
    -- slice over it left pending, without the tables of a batch.
    if m == 1 then
      local a = tonumber(ARGV[first])
      local s = tonumber(ARGV[first + 1])
      local lower = archives[a + 1]
      local t = lower and s - s % lower.p
      if lower == nil or t + lower.p > now then
        set(prefix, archives, series, a, {ARGV[first + 1], ARGV[first + 2]}, members)
        if lower then
          defer(a + 1, t, method, xff_text, series)
        end
        return
      end
    end
    local xff = tonumber(xff_text)
    local last = first + 3 * m
    -- Each archive's points (the agent sent them archive by archive, slices in order), set,
    -- then carried down to the coarser archives, finest first, as whisper writes a batch.
    -- What the item wrote, by archive and slice: the points (as text, read as the hash's are),
    -- then what was made of them.
    local wrote = {}
    local j = first
    while j < last do
      local a_text = ARGV[j]
      local a = tonumber(a_text)
      local fields, slices, w, k = {}, {}, wrote[a] or {}, 0
      wrote[a] = w
      while j < last and ARGV[j] == a_text do
        local slice_text, value = ARGV[j + 1], ARGV[j + 2]
        local slice = tonumber(slice_text)
        k = k + 1
        fields[2 * k - 1], fields[2 * k] = slice_text, value
        slices[k] = slice
        w[slice] = value
        j = j + 3
      end
      set(prefix, archives, series, a, set_blocks(prefix, archives, a, series, fields, now), members)
      -- The points whose slice over them in some archive is left pending (that rollup's run
      -- carries them further down), and by level the slices such a run reaches anyway: none
      -- of their own is needed.
      local deferred, covered = {}, nil
      local higher = a
      for lower = a + 1, #archives do
        local p, seen, made = archives[lower].p, {}, {}
        for _, s in ipairs(slices) do
          local t = s - s % p
          local open = t + p > now
          if not seen[t] and not deferred[s] then
            seen[t] = true
            if open then
              if not (covered and covered[lower][t]) then
                defer(lower, t, method, xff_text, series)
                if covered == nil then
                  covered = {}
                  for l = lower + 1, #archives do
                    covered[l] = {}
                  end
                end
                for l = lower + 1, #archives do
                  covered[l][t - t % archives[l].p] = true
                end
              end
            else
              local v = propagate(prefix, now, archives, method, xff, t, higher, lower, series, wrote[higher] or {})
              if v ~= nil then
                made[#made + 1], made[#made + 2] = whole_text(t), point_text(v)
                wrote[lower] = wrote[lower] or {}
                wrote[lower][t] = v
              end
            end
          end
          if open then
            deferred[s] = true
          end
        end
        -- Written before the next archive reads them.
        if #made == 0 then
          break
        end
        set(prefix, archives, series, lower, set_blocks(prefix, archives, lower, series, made, now), members)
        higher = lower
      end
    end
  end

  for _ = 1, n do
    local series, method, xff, m = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
    local ok, err = pcall(write, series, method, xff, i + 4, m)
    if not ok then
      failed(prefix .. 'gauge:' .. archives[1].text .. ':' .. series, err)
    end
    i = i + 4 + 3 * m
  end
  for j = 1, #members, 1000 do
    try(index, 'ZADD', index, unpack(members, j, math.min(j + 999, #members)))
  end
  for j = 1, #pending, 1000 do
    try(pending_key, 'ZADD', pending_key, 'NX', unpack(pending, j, math.min(j + 999, #pending)))
  end
  return i
end
