-- What flush.lua (one server) and flush_slot.lua (a cluster's slot) do alike, put in front of
-- each when it is loaded (src/store/writer.rs): refused writes, the book's hourly rollover,
-- update_stats and log_common / log_recent. Keys come in as a family: the hour's key and its
-- `:start`, `:last` and `:pstart`, names the caller builds (flush_slot.lua gets them declared).

-- The window's hour (YYYY-MM-DDTHH:00:00) and the idle lifetime of log keys (s, 0: none); the
-- script sets both from its arguments.
local hour, log_ttl

-- Writes Redis refused, as key, error pairs. Every write goes through redis.pcall (`try`), or
-- belongs to an item whose reads (which fail on a key of the wrong type) come before its writes:
-- nothing can stop a script half-way through a chunk.
local failures = {}
local function failed(key, err)
  if type(err) == 'table' then
    err = err.err
  end
  failures[#failures + 1] = key
  failures[#failures + 1] = tostring(err)
end
local function try(key, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    failed(key, r.err)
    return nil
  end
  return r
end

-- The book's hourly rollover (update_stats / log_common, errata applied), in two steps so that
-- an item reads everything before it writes: where a write for this hour goes (a late window of
-- the previous hour goes to :last) and what the rollover must do, then the rollover itself.
local function hourly(family)
  local existing = redis.call('GET', family[2])
  if not existing then
    return family[1], 'start'
  elseif existing < hour then
    return family[1], 'roll'
  elseif existing > hour and redis.call('GET', family[4]) == hour then
    return family[3]
  end
  return family[1]
end
local function roll(family, action)
  if action == 'roll' then
    if redis.call('EXISTS', family[1]) == 1 then
      redis.call('RENAME', family[1], family[3])
    else
      redis.call('DEL', family[3])
    end
    redis.call('RENAME', family[2], family[4])
  end
  if action then
    redis.call('SET', family[2], hour)
  end
end

-- Quantile buckets (src/aggregate/sketch.rs): a HASH of bucket -> weighted count, with `a` the
-- relative accuracy they were made with. `hist` is {alpha, max (buckets a hash keeps), fields,
-- weights}; the chunk's header and item give them.
local function bucket_order(field)
  if field == 'z' then
    return 0
  elseif string.sub(field, 1, 1) == 'n' then
    return -1e9 - tonumber(string.sub(field, 2))
  end
  return 1e9 + tonumber(field)
end

-- Reads what `key` holds of the item's buckets (fails on a key of another type, or buckets of
-- another accuracy or not numbers): {alpha, count per field}.
local function read_buckets(key, hist)
  local old = redis.call('HMGET', key, 'a', unpack(hist.fields))
  if old[1] and old[1] ~= hist.alpha then
    error({err = 'ERR buckets of another relative accuracy (' .. old[1] .. ') at ' .. key})
  end
  for j = 2, #old do
    if old[j] and not tonumber(old[j]) then
      error({err = 'ERR bucket count is not a number at ' .. key})
    end
  end
  return old
end

-- Adds the item's counts to what read_buckets found; a new key gets `expire_at` (if any). Past
-- `hist.max` buckets the lowest are folded into the lowest one kept, as the agent does.
local function write_buckets(key, old, hist, expire_at)
  local args, n = {'a', hist.alpha}, 2
  for j, field in ipairs(hist.fields) do
    args[n + 1] = field
    args[n + 2] = tostring((tonumber(old[j + 1]) or 0) + tonumber(hist.weights[j]))
    n = n + 2
  end
  local added = redis.call('HSET', key, unpack(args, 1, n))
  if expire_at and not old[1] then
    redis.call('EXPIREAT', key, expire_at)
  end
  if added > 0 and redis.call('HLEN', key) > hist.max + 1 then
    local all, buckets = redis.call('HGETALL', key), {}
    for j = 1, #all, 2 do
      if all[j] ~= 'a' then
        buckets[#buckets + 1] = {all[j], tonumber(all[j + 1]), bucket_order(all[j])}
      end
    end
    table.sort(buckets, function(x, y) return x[3] < y[3] end)
    local excess, folded, gone = #buckets - hist.max, 0, {}
    for j = 1, excess do
      folded = folded + buckets[j][2]
      gone[j] = buckets[j][1]
    end
    redis.call('HDEL', key, unpack(gone))
    local kept = buckets[excess + 1]
    redis.call('HSET', key, kept[1], tostring(kept[2] + folded))
  end
end

-- update_stats: one read of the five members and one write of all five, instead of a call per
-- member, and the hour's quantile buckets beside them (`hour`: the family's hist key and its
-- :last; nil without buckets), rolled over with them. `slices` are more bucket keys written
-- with the item, {key, expire at} each (one server; a cluster writes them in their own slots).
-- Everything is read before anything is written. Returns the hour's average when the window
-- went to the current hour.
local function merge_stats(family, n, sum, sumsq, min, max, hist, hour, slices)
  local target, action = hourly(family)
  if action ~= 'roll' then
    local old = redis.call('ZMSCORE', target, 'min', 'max', 'count', 'sum', 'sumsq')
    if old[1] then min = math.min(min, tonumber(old[1])) end
    if old[2] then max = math.max(max, tonumber(old[2])) end
    if old[3] then n = n + tonumber(old[3]) end
    if old[4] then sum = sum + tonumber(old[4]) end
    if old[5] then sumsq = sumsq + tonumber(old[5]) end
  end
  -- Only what another writer stored can make these NaN (inf - inf): ZADD would refuse it.
  if min ~= min or max ~= max or n ~= n or sum ~= sum or sumsq ~= sumsq then
    error({err = 'ERR statistics would not be a number (NaN)'})
  end
  local hour_key, hour_old, slice_old = nil, {}, {}
  if hour then
    hour_key = target == family[3] and hour[2] or hour[1]
    -- At a rollover the hour's key is renamed away first: the new hour starts empty.
    if action ~= 'roll' then
      hour_old = read_buckets(hour_key, hist)
    end
    for j, slice in ipairs(slices) do
      slice_old[j] = read_buckets(slice[1], hist)
    end
  end
  roll(family, action)
  if hour and action == 'roll' then
    if redis.call('EXISTS', hour[1]) == 1 then
      redis.call('RENAME', hour[1], hour[2])
    else
      redis.call('DEL', hour[2])
    end
  end
  redis.call('ZADD', target, min, 'min', max, 'max', n, 'count', sum, 'sum', sumsq, 'sumsq')
  if hour then
    write_buckets(hour_key, hour_old, hist)
    for j, slice in ipairs(slices) do
      write_buckets(slice[1], slice_old[j], hist, slice[2])
    end
  end
  return target == family[1] and sum / n
end

-- log_common: reads (a key of the wrong type fails here), then writes. Keys of logs nobody
-- writes any more expire after log_ttl seconds (names come from events: a flood of sources must
-- not leave keys behind for ever).
local function log_common(family, message)
  local target, action = hourly(family)
  if action ~= 'roll' then
    redis.call('ZSCORE', target, message)
  end
  roll(family, action)
  redis.call('ZINCRBY', target, 1, message)
  if log_ttl > 0 then
    for _, key in ipairs(family) do
      redis.call('EXPIRE', key, log_ttl)
    end
  end
end

-- log_recent: the newest 100 entries.
local function log_recent(key, entry)
  redis.call('LPUSH', key, entry)
  redis.call('LTRIM', key, 0, 99)
  if log_ttl > 0 then
    redis.call('EXPIRE', key, log_ttl)
  end
end

