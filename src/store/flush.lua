-- Applies one flush chunk atomically and exactly once (SPEC §3.1-§3.7).
--
-- Key names follow src/store/keys.rs (the prefix, then the book's names); the tests read every
-- key back through that module.
--
-- KEYS[1]  the chunk's token, flush:<agent id>.<run>:<window>:<chunk>
-- KEYS[2…] tokens of earlier chunks whose replies the agent received: those chunks are never
--          sent again, so their tokens are deleted instead of waiting for their expiry
-- ARGV     token lifetime (s), key prefix, sample count, hour (YYYY-MM-DDTHH:00:00),
--          asctime of the window, then sections, each a count followed by its items:
--          precisions: precision, slice, what to do with the counters at it (below);
--                      gauges and sets are written at every precision listed
--          counters:   series, integer increment
--          stats:      series, type (AccessTime|Histogram|Distribution), count, sum, sumsq, min, max
--          gauges:     series, value
--          sets:       series, member count m, m members
--          logs:       name, severity, message
--
-- Returns 1 when applied, 0 when the token shows the chunk was applied before.

if #KEYS > 1 then
  redis.call('DEL', unpack(KEYS, 2))
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end

local prefix, sample_count, hour, asctime = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local i = 6
local function count()
  local n = tonumber(ARGV[i])
  i = i + 1
  return n
end

-- The book's hourly rollover (update_stats / log_common, errata applied): a missing :start is
-- set; an older one moves the data to :last and the hour to :pstart. Returns the key to merge
-- into: a late window of the previous hour goes to :last.
local function hourly(dest)
  local start_key = dest .. ':start'
  local existing = redis.call('GET', start_key)
  if not existing then
    redis.call('SET', start_key, hour)
  elseif existing < hour then
    if redis.call('EXISTS', dest) == 1 then
      redis.call('RENAME', dest, dest .. ':last')
    else
      redis.call('DEL', dest .. ':last')
    end
    redis.call('RENAME', start_key, dest .. ':pstart')
    redis.call('SET', start_key, hour)
  elseif existing > hour and redis.call('GET', dest .. ':pstart') == hour then
    return dest .. ':last'
  end
  return dest
end

-- Per precision, what happens to the chunk's counters (CounterWrite in src/store/writer.rs):
-- 0 nothing, 1 written and indexed with a new slice, 2 written only, 3 indexed only.
local precisions, slices, written, index_new, index_all = {}, {}, {}, {}, {}
for p = 1, count() do
  precisions[p], slices[p] = ARGV[i], ARGV[i + 1]
  local mode = ARGV[i + 2]
  if mode == '1' or mode == '2' then
    written[#written + 1] = p
    index_new[p] = mode == '1'
  elseif mode == '3' then
    index_all[#index_all + 1] = p
  end
  i = i + 3
end

-- ZADD members collected and added in few calls: one redis.call costs about as much as the
-- write it carries. At most 1000 members a call (Lua's unpack has a stack limit).
-- Scores are best given as strings: Redis formats a number argument anew on every call, which
-- cost the index (score '0') a sixth of its time (scripts/script-cost.sh, modes 1:3).
local function zadder(key)
  local args, n = {}, 0
  local z = {}
  function z.flush()
    if n > 0 then
      redis.call('ZADD', key, unpack(args, 1, n))
      n = 0
    end
  end
  function z.add(score, member)
    args[n + 1], args[n + 2] = score, member
    n = n + 2
    if n >= 2000 then
      z.flush()
    end
  end
  return z
end

-- Counters (update_counter): count:<p>:<series> and the known: index (members
-- `<precision>:<series>`, score '0'). One loop per precision over the chunk's series: the body
-- is a single call, which is most of a flush's work.
-- An index member is added only with a new slice (the slice's total equals this increment): a
-- slice that existed means its hash existed, and an existing hash keeps its member (the cleaner
-- removes a member only with its emptied hash, atomically). For the coarse precisions that
-- skips all but the first write of a slice, and most of the index work.
local known = zadder(prefix .. 'known:')
local series_count = count()
local first = i
i = first + 2 * series_count
for _, p in ipairs(written) do
  local key, slice = prefix .. 'count:' .. precisions[p] .. ':', slices[p]
  if index_new[p] then
    local member = precisions[p] .. ':'
    for j = first, i - 1, 2 do
      local n = ARGV[j + 1]
      if redis.call('HINCRBY', key .. ARGV[j], slice, n) == tonumber(n) then
        known.add('0', member .. ARGV[j])
      end
    end
  else
    for j = first, i - 1, 2 do
      redis.call('HINCRBY', key .. ARGV[j], slice, ARGV[j + 1])
    end
  end
end
for _, p in ipairs(index_all) do
  local member = precisions[p] .. ':'
  for j = first, i - 1, 2 do
    known.add('0', member .. ARGV[j])
  end
end
known.flush()

-- Statistics (update_stats) and, for timers, slowest:AccessTime (access_time): one read of
-- the five members and one write of all five, instead of a call per member.
local slowest = prefix .. 'slowest:AccessTime'
local ranked, timers = zadder(slowest), 0
for _ = 1, count() do
  local series, kind = ARGV[i], ARGV[i + 1]
  local n, sum, sumsq = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local min, max = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  i = i + 7
  local current = prefix .. 'stats:' .. series .. ':' .. kind
  local dest = hourly(current)
  local old = redis.call('ZMSCORE', dest, 'min', 'max', 'count', 'sum', 'sumsq')
  if old[1] then min = math.min(min, tonumber(old[1])) end
  if old[2] then max = math.max(max, tonumber(old[2])) end
  if old[3] then n = n + tonumber(old[3]) end
  if old[4] then sum = sum + tonumber(old[4]) end
  if old[5] then sumsq = sumsq + tonumber(old[5]) end
  redis.call('ZADD', dest, min, 'min', max, 'max', n, 'count', sum, 'sum', sumsq, 'sumsq')
  if kind == 'AccessTime' and dest == current then
    ranked.add(sum / n, series)
    timers = timers + 1
  end
end
if timers > 0 then
  ranked.flush()
  redis.call('ZREMRANGEBYRANK', slowest, 0, -101)
end

-- Gauges: the current value, and the value per slice indexed like counters.
local known_gauges = zadder(prefix .. 'known:gauge:')
local gauges = prefix .. 'gauges:'
for _ = 1, count() do
  local series, value = ARGV[i], ARGV[i + 1]
  i = i + 2
  redis.call('HSET', gauges, series, value)
  for p = 1, #precisions do
    local member = precisions[p] .. ':' .. series
    -- Indexed with a new slice only, as the counters are.
    if redis.call('HSET', prefix .. 'gauge:' .. member, slices[p], value) == 1 then
      known_gauges.add('0', member)
    end
  end
end
known_gauges.flush()

-- Sets: one HyperLogLog per slice, expiring with the slice's retention.
-- PFADD takes at most this many members per call (Lua's unpack has a stack limit).
local batch = 1000
for _ = 1, count() do
  local series, m = ARGV[i], tonumber(ARGV[i + 1])
  local first = i + 2
  i = first + m
  for p = 1, #precisions do
    local key = prefix .. 'set:' .. precisions[p] .. ':' .. series .. ':' .. slices[p]
    for j = first, i - 1, batch do
      redis.call('PFADD', key, unpack(ARGV, j, math.min(j + batch - 1, i - 1)))
    end
    redis.call('EXPIREAT', key, tonumber(slices[p]) + sample_count * tonumber(precisions[p]))
  end
end

-- Logs (log_recent + log_common).
for _ = 1, count() do
  local name, severity, message = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  local base = name .. ':' .. severity
  redis.call('ZINCRBY', hourly(prefix .. 'common:' .. base), 1, message)
  local recent = prefix .. 'recent:' .. base
  redis.call('LPUSH', recent, asctime .. ' ' .. message)
  redis.call('LTRIM', recent, 0, 99)
end
return 1
