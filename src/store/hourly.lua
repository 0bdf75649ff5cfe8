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

-- update_stats: one read of the five members and one write of all five, instead of a call per
-- member. Returns the hour's average when the window went to the current hour.
local function merge_stats(family, n, sum, sumsq, min, max)
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
  roll(family, action)
  redis.call('ZADD', target, min, 'min', max, 'max', n, 'count', sum, 'sum', sumsq, 'sumsq')
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

