-- Applies one flush chunk atomically and exactly once (the layout: README, "The Redis layout").
--
-- Key names follow src/store/keys.rs (the prefix, then the book's names); the tests read every
-- key back through that module. hourly.lua is put in front of it (failed, try, the rollover,
-- merge_stats, log_common, log_recent).
--
-- KEYS[1]  the exactly-once guard, the hash flush: (hourly.lua, guard_last): per run (field
--          <agent id>.<run>) the number of its last chunk applied and when. Chunks are numbered
--          in the order the agent sends them.
-- KEYS[2]  the run's string key flush:<agent id>.<run>, where versions before the hash kept
--          its number: read when the run has no field (a spool written by such a version).
-- ARGV     the chunk's number; the number of the chunk sent just before it in the same
--          pipeline, or 0 for a pipeline's first chunk (every chunk before it was acknowledged);
--          the run (the field); 1 when the chunk may have been applied before (it was sent
--          before without an answer) and Redis may evict keys, else 0; the agent's time (Unix
--          s); how long a run that writes nothing keeps its field (s);
--          key prefix, sample count, hour (YYYY-MM-DDTHH:00:00),
--          asctime of the window, idle lifetime of log keys (s, 0: none), then sections, each a
--          count followed by its items:
--          precisions: precision, slice, what to do with the counters at it (below);
--                      gauges and sets are written at every precision listed
--          (then, not a section) the quantile buckets' relative accuracy, the most buckets a
--          hash keeps, and a count of slice precisions, each: precision, slice, expire at
--          counters:   series, integer increment
--          stats:      series, type (AccessTime|Histogram|Distribution), count, sum, sumsq, min,
--                      max, bucket count b, b pairs of bucket field and weight (added to
--                      hist:<p>:<series>:<type>:<slice> at each slice precision); a count of 0
--                      writes the buckets only
--          gauges:     series, value
--          sets:       series, member count m, m members
--          logs:       name, severity, message
--
-- Returns {1, key, error, key, error, ...} when applied: each pair is a write that Redis refused
-- (a key of another type, a count that would overflow) and that was skipped, the rest applied;
-- {0} when the chunk was applied before (a late copy or a retry); {-1} when the chunk sent
-- before it in the pipeline was not applied, so this one is not either (nothing written); {-2}
-- when the run's guard is gone although the chunk may have been applied before (nothing
-- written: see below).
--
-- Why a copy is never applied twice, in any order of arrival: a chunk is applied only when its
-- number is above the run's last one, which it then becomes; the numbers only grow. Why none is
-- skipped: a pipeline's first chunk follows only acknowledged ones, and each later chunk is
-- applied only right after the one before it.
--
-- Both need the guard to live as long as the data it guards. It has no TTL, so only Redis
-- losing data (a restart without persistence, a failover to a replica that lagged: the data
-- went with it, so applying again is right), an allkeys-* maxmemory-policy or a hand can take
-- it. Under an evicting policy the agent marks the chunks it sent before without an answer: a
-- marked chunk that finds no guard may have been applied, and is not applied again.

local seq, prev, run, in_doubt = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
local now = tonumber(redis.call('TIME')[1])
skew = now - tonumber(ARGV[5])
local last = guard_last(KEYS[1], run, now, tonumber(ARGV[6]))
  or tonumber(redis.call('GET', KEYS[2]) or '')
if not last and in_doubt then
  return {-2}
end
last = last or 0
if last >= seq then
  -- A write all the same: a WAIT for replicas after this reply then waits for everything the
  -- master had so far, the earlier copy of this chunk included, even on a new connection.
  redis.call('HSET', KEYS[1], run, last .. ' ' .. now)
  return {0}
end
if prev > 0 and last ~= prev then
  return {-1}
end
-- The first write of the chunk: a Redis out of memory refuses it, before anything else is
-- written; after it, Redis lets the script finish.
redis.call('HSET', KEYS[1], run, seq .. ' ' .. now)

local prefix, sample_count, asctime = ARGV[7], tonumber(ARGV[8]), ARGV[10]
hour, log_ttl = ARGV[9], tonumber(ARGV[11])
local i = 12
local function count()
  local n = tonumber(ARGV[i])
  i = i + 1
  return n
end

local function family(key)
  return {key, key .. ':start', key .. ':last', key .. ':pstart'}
end

-- The chunk's writes. Every error that can be foreseen is caught closer to where it happens;
-- one that could not (a bug) still cannot leave the chunk half-applied unreported.
local function apply()
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
  local hist = {alpha = ARGV[i], max = tonumber(ARGV[i + 1])}
  i = i + 2
  local hist_precisions = {}
  for p = 1, count() do
    hist_precisions[p] = {ARGV[i], ARGV[i + 1], ARGV[i + 2]}
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
        try(key, 'ZADD', key, unpack(args, 1, n))
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
        local r = redis.pcall('HINCRBY', key .. ARGV[j], slice, n)
        if r == tonumber(n) then
          known.add('0', member .. ARGV[j])
        elseif type(r) == 'table' then
          failed(key .. ARGV[j], r.err)
        end
      end
    else
      for j = first, i - 1, 2 do
        local r = redis.pcall('HINCRBY', key .. ARGV[j], slice, ARGV[j + 1])
        if type(r) == 'table' then
          failed(key .. ARGV[j], r.err)
        end
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

  -- Statistics (update_stats) and, for timers, slowest:AccessTime (access_time). An item reads
  -- all it needs first (a key of the wrong type fails there), so it is written whole or not at
  -- all.
  local slowest = prefix .. 'slowest:AccessTime'
  local ranked, timers = zadder(slowest), 0
  for _ = 1, count() do
    local series, kind, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    -- A count of 0 carries the buckets of a group of windows alone (quantile_write_secs).
    local ok, average = true, nil
    if n > 0 then
      ok, average = pcall(merge_stats, family(prefix .. 'stats:' .. series .. ':' .. kind), n,
        tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]),
        tonumber(ARGV[i + 6]))
    end
    local b = tonumber(ARGV[i + 7])
    set_buckets(hist, i + 8, b)
    i = i + 8 + 2 * b
    -- The quantile buckets of each slice, a key at a time (as sets are).
    for _, h in ipairs(b > 0 and hist_precisions or {}) do
      local key = prefix .. 'hist:' .. h[1] .. ':' .. series .. ':' .. kind .. ':' .. h[2]
      local written, err = pcall(add_buckets, key, hist, h[3])
      if not written then
        failed(key, err)
      end
    end
    if not ok then
      failed(prefix .. 'stats:' .. series .. ':' .. kind, average)
    elseif kind == 'AccessTime' and average then
      ranked.add(average, series)
      timers = timers + 1
    end
  end
  if timers > 0 then
    ranked.flush()
    try(slowest, 'ZREMRANGEBYRANK', slowest, 0, -101)
  end

  -- Gauges: the current value, and the value per slice indexed like counters.
  local known_gauges = zadder(prefix .. 'known:gauge:')
  local gauges = prefix .. 'gauges:'
  for _ = 1, count() do
    local series, value = ARGV[i], ARGV[i + 1]
    i = i + 2
    try(gauges, 'HSET', gauges, series, value)
    for p = 1, #precisions do
      local member = precisions[p] .. ':' .. series
      -- Indexed with a new slice only, as the counters are.
      if try(prefix .. 'gauge:' .. member, 'HSET', prefix .. 'gauge:' .. member, slices[p], value) == 1 then
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
      local ok = true
      for j = first, i - 1, batch do
        ok = ok and try(key, 'PFADD', key, unpack(ARGV, j, math.min(j + batch - 1, i - 1))) ~= nil
      end
      -- Not on a key of another program's.
      if ok then
        expire_by(key, tonumber(slices[p]) + sample_count * tonumber(precisions[p]))
      end
    end
  end

  -- Logs (log_recent + log_common), each entry written whole or not at all: the list's read
  -- comes before log_common's reads and writes.
  local function log(name, severity, message)
    local base = name .. ':' .. severity
    local recent = prefix .. 'recent:' .. base
    redis.call('LLEN', recent)
    log_common(family(prefix .. 'common:' .. base), message)
    log_recent(recent, asctime .. ' ' .. message)
  end
  for _ = 1, count() do
    local name, severity, message = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    i = i + 3
    local ok, err = pcall(log, name, severity, message)
    if not ok then
      failed(prefix .. 'recent:' .. name .. ':' .. severity, err)
    end
  end
end
local ok, err = pcall(apply)
if not ok then
  failed('(script)', err)
end
table.insert(failures, 1, 1)
return failures
