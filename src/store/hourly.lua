-- What flush.lua (one server) and flush_slot.lua (a cluster's slot) do alike, put in front of
-- each when it is loaded (src/store/write/mod.rs): the clock skew of expiry times, refused
-- writes, the book's hourly rollover, update_stats and log_common / log_recent. Keys come in as a family: the hour's key and its
-- `:start`, `:last` and `:pstart`, names the caller builds (flush_slot.lua gets them declared).

-- The window's hour (YYYY-MM-DDTHH:00:00) and the idle lifetime of log keys (s, 0: none); the
-- script sets both from its arguments.
local hour, log_ttl

-- The agent's clock against Redis's (Redis's time minus the agent's, s): the expiry times the
-- agent computes (a slice's start plus its retention, on the agent's clock, as the slice itself)
-- are moved by it, so a key lives as long as its slice is kept whatever the two clocks say. The
-- script sets it from TIME and the agent's time sent with the call.
local skew = 0
local function expire_by(key, at)
  redis.call('EXPIREAT', key, tonumber(at) + skew)
end

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
-- weights (numbers), texts (the weights as sent)}; set_buckets fills the last three.
local function set_buckets(hist, first, b)
  hist.fields, hist.weights, hist.texts = {}, {}, {}
  for j = 1, b do
    local text = ARGV[first + 2 * j - 1]
    hist.fields[j], hist.weights[j], hist.texts[j] = ARGV[first + 2 * j - 2], tonumber(text), text
  end
end
-- A bucket field's place in value order; nil for a field not written by us.
local function bucket_order(field)
  if field == 'z' then
    return 0
  elseif string.sub(field, 1, 1) == 'n' then
    local i = tonumber(string.sub(field, 2))
    return i and -1e9 - i
  end
  local i = tonumber(field)
  return i and 1e9 + i
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
-- A count as Redis keeps it: whole counts in integer form (string.format's %d, which costs a
-- fraction of the float formatting that tostring does), others to 14 digits.
local function count_text(c)
  if c == math.floor(c) and math.abs(c) < 1e15 then
    return string.format('%d', c)
  end
  return tostring(c)
end

local function write_buckets(key, old, hist, expire_at)
  local args, n, weights = {'a', hist.alpha}, 2, hist.weights
  for j, field in ipairs(hist.fields) do
    local before = old[j + 1]
    args[n + 1] = field
    args[n + 2] = before and count_text(tonumber(before) + weights[j]) or hist.texts[j]
    n = n + 2
  end
  local added = redis.call('HSET', key, unpack(args, 1, n))
  if expire_at and not old[1] then
    expire_by(key, expire_at)
  end
  if added > 0 and redis.call('HLEN', key) > hist.max + 1 then
    local all, buckets = redis.call('HGETALL', key), {}
    -- Fields someone else put there (not a bucket, or not a count) are left alone.
    for j = 1, #all, 2 do
      local order, count = bucket_order(all[j]), tonumber(all[j + 1])
      if order and count then
        buckets[#buckets + 1] = {all[j], count, order}
      end
    end
    if #buckets <= hist.max then
      return
    end
    table.sort(buckets, function(x, y) return x[3] < y[3] end)
    -- As the agent's Buckets::collapse: the side with more buckets folds those of its smallest
    -- magnitudes (next to zero) into the next one out.
    local negatives, zero = 0, 0
    for _, b in ipairs(buckets) do
      if b[3] < 0 then negatives = negatives + 1 elseif b[3] == 0 then zero = 1 end
    end
    -- A window can bring many new buckets at once: the larger side gives all it can (keeping
    -- one), the other side the rest.
    local positives, excess = #buckets - negatives - zero, #buckets - hist.max
    local from_pos
    if positives >= negatives then
      from_pos = math.min(excess, positives - 1)
    else
      from_pos = excess - math.min(excess, negatives - 1)
    end
    local gone = {}
    -- Folds `n` buckets from index `first` on into the bucket at `into`.
    local function fold(first, n, into)
      if n <= 0 then return end
      local folded = 0
      for j = first, first + n - 1 do
        folded = folded + buckets[j][2]
        gone[#gone + 1] = buckets[j][1]
      end
      redis.call('HSET', key, buckets[into][1], count_text(buckets[into][2] + folded))
    end
    local from_neg = excess - from_pos
    fold(negatives + zero + 1, from_pos, negatives + zero + from_pos + 1)
    fold(negatives - from_neg + 1, from_neg, negatives - from_neg)
    redis.call('HDEL', key, unpack(gone))
  end
end

-- Adds the item's buckets (set_buckets) to the hash `key`, which expires at `expire_at` once
-- made: read first (a key of another type, buckets of another accuracy or that are not numbers
-- fail there, before anything is written), then written.
local function add_buckets(key, hist, expire_at)
  write_buckets(key, read_buckets(key, hist), hist, expire_at)
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

