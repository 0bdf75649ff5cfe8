-- Applies one flush chunk atomically and exactly once (SPEC §3.1, §3.7).
--
-- KEYS[1]  the chunk's token, flush:<agent>:<window>:<chunk>
-- ARGV[1]  token lifetime in seconds
-- ARGV[2]  counter key prefix ("<key_prefix>count:")
-- ARGV[3]  the known: index key
-- ARGV[4]  number of precisions P, then P pairs: precision, slice of this window
-- then     number of counters C, then C pairs: series, integer increment
--
-- Returns 1 when applied, 0 when the token shows the chunk was applied before.

if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end

local count_prefix, known = ARGV[2], ARGV[3]
local precisions = tonumber(ARGV[4])
local i = 5 + 2 * precisions

local counters = tonumber(ARGV[i])
i = i + 1
for _ = 1, counters do
  local series, n = ARGV[i], ARGV[i + 1]
  i = i + 2
  for p = 0, precisions - 1 do
    local member = ARGV[5 + 2 * p] .. ':' .. series
    redis.call('HINCRBY', count_prefix .. member, ARGV[6 + 2 * p], n)
    redis.call('ZADD', known, 0, member)
  end
end
return 1
