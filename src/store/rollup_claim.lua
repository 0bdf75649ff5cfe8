-- A rollup run's claim (src/store/rollup.rs): takes a batch of carbon's pending rollups out of
-- `pending:gauge:` into `rolling:gauge:`, scored with the run's claim, and answers them. A point
-- written while the run makes them adds its member to `pending:gauge:` again (points.lua and the
-- writer add with NX, to a set the member has left), so the next run makes that slice again
-- from what the finer archive holds then. A member a run claimed and did not finish (its agent
-- killed, its connection lost) is claimed again once its claim is older than ARGV[2].
-- A claim that takes any member counts itself in `claims:gauge:` (GET and SET: the ACL has no
-- INCR): a writer that watched that count unchanged from its check to its EXEC knows the
-- members it added since are pending still, and adds them no more (src/store/write/standalone.rs,
-- `Pending`).
--
-- KEYS     `pending:gauge:`, `rolling:gauge:`, `claims:gauge:`
-- ARGV     the claim's score, the oldest claim still in progress (a score), the most members a
--          run takes
--
-- Returns the members claimed: those claimed again first, then the pending ones, oldest first;
-- nil when another claim in progress holds the number.

local pending, rolling, claims = KEYS[1], KEYS[2], KEYS[3]
local claim, most = ARGV[1], tonumber(ARGV[3])
-- A number another claim in progress holds: nil, and the agent draws another.
if redis.call('ZCOUNT', rolling, claim, claim) > 0 then
  return nil
end
local out = redis.call('ZRANGEBYSCORE', rolling, '-inf', '(' .. ARGV[2], 'LIMIT', 0, most)
local fresh = {}
if #out < most then
  fresh = redis.call('ZRANGE', pending, 0, most - #out - 1)
end
for _, member in ipairs(fresh) do
  out[#out + 1] = member
end
local scored = {}
for _, member in ipairs(out) do
  scored[#scored + 1] = claim
  scored[#scored + 1] = member
end
for j = 1, #scored, 1000 do
  redis.call('ZADD', rolling, unpack(scored, j, math.min(j + 999, #scored)))
end
for j = 1, #fresh, 1000 do
  redis.call('ZREM', pending, unpack(fresh, j, math.min(j + 999, #fresh)))
end
-- (A key of another type under the name, another program's: not counted; the writers cannot
-- read it either, so they remember nothing.)
if #out > 0 then
  local n = redis.pcall('GET', claims)
  if type(n) ~= 'table' then
    redis.call('SET', claims, (tonumber(n) or 0) + 1)
  end
end
return out
