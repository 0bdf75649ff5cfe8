-- Applies one slot chunk of a flush in a Redis Cluster, atomically and exactly once: the writes
-- of one window whose keys hash to one slot (docs/topologies.md).
--
-- Every key is declared in KEYS, so the cluster routes the call and a moving slot answers ASK or
-- TRYAGAIN before anything runs; the script builds no key name of its own. hourly.lua is put in
-- front of it (failed, try, the rollover, merge_stats, log_common, log_recent).
--
-- KEYS[1]  this slot's guard, the hash flush:{<tag of the slot>}: per run (field <agent id>.<run>)
--          the number of its last chunk applied in this slot and when. Then the data keys, taken
--          in order by the sections below.
-- ARGV     the chunk's number, the run, 1 when the chunk may have been applied before (sent
--          without an answer) and Redis may evict keys (else 0), the agent's time (Unix s), how
--          long a run that writes nothing keeps its field (s), key prefix, hour
--          (YYYY-MM-DDTHH:00:00), idle lifetime of log keys (s, 0: none), the quantile buckets'
--          relative accuracy and the most buckets a hash keeps, then
--          sections, each a count followed by its items (keys taken from KEYS):
--          counters:  runs of one slice: slice, mode (below), n, then n increments
--                                                                   n keys count:<p>:<s>
--          gauges:    runs of one slice: slice, 0, n, then n values (a new slice reports
--                     its member)                                   n keys gauge:<p>:<s>
--          values:    series, value (the current gauge values)              1 key  gauges:
--                     (one key for the section; the section has 0 or 1 items of m pairs:
--                      m, then m series/value pairs)
--          sets:      expire at, member count m, m members                  1 key  set:<p>:<s>:<slice>
--          stats:     type, count, sum, sumsq, min, max                     4 keys stats:{<s>}:<type>,
--                                                                                  :start, :last, :pstart
--          recent:    entry ("<asctime> <message>")                         1 key  recent:<n>:<sev>
--          common:    message                                               4 keys common:{<n>}:<sev>, ...
--          buckets:   expire at, bucket count b, b pairs of field and weight  1 key hist:<p>:<s>:<type>:<slice>
--
-- Returns {1, counter members, gauge members, timers, failures} when applied: the index members
-- (`<precision>:<series>`) whose hash got a new slice, for known: and known:gauge: (other slots:
-- the agent adds them next); for slowest:AccessTime, the timers' stats keys and their hour's average;
-- failures as key, error pairs (writes Redis refused and skipped, the rest applied).
-- {0} when the chunk was applied before (a retry after a lost reply, a late copy): the agent then
-- adds the index member of every counter and gauge key the chunk holds (more than it added,
-- which costs a ZADD each; the cleaner removes a member whose hash is gone) and reads its
-- timers' averages back from their stats keys.
--
-- Why a copy is never applied twice, in any order of arrival: a chunk is applied only when its
-- number is above the run's last one in the slot, which it then becomes; the numbers only grow.
-- Why none is skipped: the chunks of a slot are sent one at a time, each once the one before it
-- is acknowledged. (One server checks the number in the agent instead, around a MULTI/EXEC:
-- src/store/write/standalone.rs.)
--
-- The guard has no TTL, as one server's: an evicting policy takes a key with one first, and
-- 16 384 keys with one would put the expiry lookup that every write makes (is this key
-- expired?) into a large table; with the reply the old guard stored, that cost a cluster node
-- 11 % of its time (docs/benchmarks.md, "Redis Cluster"). A run's field goes instead when a
-- run's first chunk in the slot finds it idle for the lifetime.

-- The slot's exactly-once guard: the HASH `guard` holds a field per run, "<number of its last
-- chunk applied> <Redis's time>", and no TTL (a key with one is what a volatile-*
-- maxmemory-policy evicts first). The run's last number, or nil when the run has no field: its
-- first chunk here, or a guard lost with Redis's data or evicted. Then the fields of runs idle
-- for `idle` seconds are dropped (the guard holds only live runs).
local function guard_last(guard, run, now, idle)
  local stored = redis.call('HGET', guard, run)
  if stored then
    return tonumber(string.match(stored, '^%d+'))
  end
  local runs = redis.call('HGETALL', guard)
  for j = 1, #runs, 2 do
    if (tonumber(string.match(runs[j + 1], '^%d+ (%d+)')) or 0) < now - idle then
      redis.call('HDEL', guard, runs[j])
    end
  end
  return nil
end

-- A marked chunk (in doubt, under an evicting policy) that finds no field may have been
-- applied: {-2}, nothing written.
local guard, seq, run, in_doubt = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
local now = tonumber(redis.call('TIME')[1])
skew = now - tonumber(ARGV[4])
local last = guard_last(guard, run, now, tonumber(ARGV[5]))
if not last and in_doubt then
  return {-2}
end
if last and last >= seq then
  -- A write all the same: a WAIT after it covers the earlier copy, even on a new connection.
  redis.call('HSET', guard, run, last .. ' ' .. now)
  return {0}
end
-- The first write: an out-of-memory Redis refuses it, before anything else is written.
redis.call('HSET', guard, run, seq .. ' ' .. now)

local prefix = ARGV[6]
hour, log_ttl = ARGV[7], tonumber(ARGV[8])
local hist = {alpha = ARGV[9], max = tonumber(ARGV[10])}
local i, k = 11, 2
local function count()
  local n = tonumber(ARGV[i])
  i = i + 1
  return n
end
local function key()
  k = k + 1
  return KEYS[k - 1]
end
local function family()
  return {key(), key(), key(), key()}
end
-- The item's bucket count and pairs into `hist`.
local function buckets()
  local b = tonumber(ARGV[i])
  set_buckets(hist, i + 1, b)
  i = i + 1 + 2 * b
end

local members, gauge_members, timers = {}, {}, {}

local function apply()
  -- Counters (modes of CounterWrite in src/store/write/chunk.rs): 1 HINCRBY, and a new slice (the
  -- total equals the increment) reports its index member; 2 HINCRBY only; 3 the member only.
  local skip = #prefix + #'count:' + 1
  for _ = 1, count() do
    -- The loop is most of the script's work: one per mode, the key taken inline.
    local slice, mode, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    i = i + 3
    local offset = k - i
    if mode == '3' then
      for j = k, k + n - 1 do
        members[#members + 1] = string.sub(KEYS[j], skip)
      end
    elseif mode == '1' then
      for j = i, i + n - 1 do
        local name, by = KEYS[j + offset], ARGV[j]
        local r = redis.pcall('HINCRBY', name, slice, by)
        if r == tonumber(by) then
          members[#members + 1] = string.sub(name, skip)
        elseif type(r) == 'table' then
          failed(name, r.err)
        end
      end
    else
      for j = i, i + n - 1 do
        local r = redis.pcall('HINCRBY', KEYS[j + offset], slice, ARGV[j])
        if type(r) == 'table' then
          failed(KEYS[j + offset], r.err)
        end
      end
    end
    k = k + n
    i = i + n
  end

  -- Gauges per slice: HSET; a new field reports its index member.
  skip = #prefix + #'gauge:' + 1
  for _ = 1, count() do
    local slice, n = ARGV[i], tonumber(ARGV[i + 2])
    i = i + 3
    for j = i, i + n - 1 do
      local name = key()
      if try(name, 'HSET', name, slice, ARGV[j]) == 1 then
        gauge_members[#gauge_members + 1] = string.sub(name, skip)
      end
    end
    i = i + n
  end

  -- Current gauge values: one HSET of every pair (at most one chunk's worth).
  for _ = 1, count() do
    local name, m = key(), tonumber(ARGV[i])
    local first = i + 1
    i = first + 2 * m
    for j = first, i - 1, 1000 do
      try(name, 'HSET', name, unpack(ARGV, j, math.min(j + 999, i - 1)))
    end
  end

  -- Sets: a HyperLogLog per slice, expiring with the slice's retention (not on a foreign key).
  for _ = 1, count() do
    local name, expire_at, m = key(), ARGV[i], tonumber(ARGV[i + 1])
    local first = i + 2
    i = first + m
    local ok = true
    for j = first, i - 1, 1000 do
      ok = ok and try(name, 'PFADD', name, unpack(ARGV, j, math.min(j + 999, i - 1))) ~= nil
    end
    if ok then
      expire_by(name, expire_at)
    end
  end

  -- Statistics: the hour's ZSET read whole, then written whole (or not at all).
  for _ = 1, count() do
    local keys, kind = family(), ARGV[i]
    local ok, average = pcall(merge_stats, keys, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
      tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]))
    i = i + 6
    if not ok then
      failed(keys[1], average)
    elseif kind == 'AccessTime' and average then
      timers[#timers + 1] = keys[1]
      timers[#timers + 1] = tostring(average)
    end
  end

  -- Logs: the recent list and the common ZSET live in two slots, each entry's part here whole.
  for _ = 1, count() do
    local name, entry = key(), ARGV[i]
    i = i + 1
    local ok, err = pcall(log_recent, name, entry)
    if not ok then
      failed(name, err)
    end
  end
  for _ = 1, count() do
    local keys, message = family(), ARGV[i]
    i = i + 1
    local ok, err = pcall(log_common, keys, message)
    if not ok then
      failed(keys[1], err)
    end
  end

  -- Quantile buckets, a slice's hash each: read, then written.
  for _ = 1, count() do
    local name, expire_at = key(), ARGV[i]
    i = i + 1
    buckets()
    local ok, err = pcall(add_buckets, name, hist, expire_at)
    if not ok then
      failed(name, err)
    end
  end
end
local ok, err = pcall(apply)
if not ok then
  failed('(script)', err)
end
return {1, members, gauge_members, timers, failures}
