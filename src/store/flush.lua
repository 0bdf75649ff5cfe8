-- Applies the part of one flush chunk that is not counters or gauges: statistics and quantile
-- buckets, sets, logs and carbon's points (the layout: docs/layout.md). The chunk's counters and
-- gauges are sent beside this call as bare commands, and the exactly-once check is made by the
-- agent: the call is one command of the chunk's MULTI/EXEC, which runs only when the run's guard
-- is still what the agent read (src/store/write/standalone.rs, where the argument for exactly once is
-- written).
--
-- Key names follow src/store/keys.rs (the prefix, then the book's names); the tests read every
-- key back through that module. hourly.lua is put in front of it (failed, try, the rollover,
-- merge_stats, log_common, log_recent).
--
-- ARGV     the agent's time (Unix s), key prefix, the retention (retention.lua), hour (YYYY-MM-DDTHH:00:00),
--          asctime of the window, idle lifetime of log keys (s, 0: none), then sections, each a
--          count followed by its items:
--          precisions: precision, slice, what the chunk does with its counters there (sent
--                      bare; gauges and sets are written at every precision listed)
--          (then, not a section) the quantile buckets' relative accuracy, the most buckets a
--          hash keeps, and a count of slice precisions, each: precision, slice, expire at
--          counters:   series, integer increment (skipped here: they go bare)
--          stats:      series, type (AccessTime|Histogram|Distribution), count, sum, sumsq, min,
--                      max, bucket count b, b pairs of bucket field and weight (added to
--                      hist:<p>:<series>:<type>:<slice> at each slice precision); a count of 0
--                      writes the buckets only
--          gauges:     series, value (skipped here: they go bare)
--          sets:       series, member count m, m members
--          logs:       name, severity, message
--          points:     (carbon's, points.lua; `0`, or `plan` and a count; the writer sends a
--                      point of the present, its `p` item, bare) a count of archives,
--                      each: precision, seconds kept, slots a block (0: none); then each
--                      series: series, aggregation method, xFilesFactor, the count of the
--                      arguments after it, then the agent's plan of its points
--                      (points.lua, write_points; src/store/write/points.rs). One such section a schema
--                      (storage_schemas) the chunk's points use, to the end of the arguments
--
-- Returns {key, error, key, error, ...}: each pair a write that Redis refused (a key of another
-- type, a value that would not be a number) and that was skipped, the rest applied.

skew = tonumber(redis.call('TIME')[1]) - tonumber(ARGV[1])
local prefix, kept, asctime = ARGV[2], retention(ARGV[3]), ARGV[5]
hour, log_ttl = ARGV[4], tonumber(ARGV[6])
local i = 7
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
  -- Per precision its slice (what it does with the counters is the agent's business).
  local precisions, slices = {}, {}
  for p = 1, count() do
    precisions[p], slices[p] = ARGV[i], ARGV[i + 1]
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

  -- The counters went bare beside this call.
  local counters = count()
  i = i + 2 * counters

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

  -- The gauges went bare beside this call, as the counters did.
  local gauges = count()
  i = i + 2 * gauges

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
        expire_by(key, tonumber(slices[p]) + kept(tonumber(precisions[p])))
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

  -- Carbon points, a section a schema (a spool written before them has no such section).
  repeat
    i = write_points(prefix, tonumber(ARGV[1]), i)
  until ARGV[i] == nil
end
local ok, err = pcall(apply)
if not ok then
  failed('(script)', err)
end
return failures
