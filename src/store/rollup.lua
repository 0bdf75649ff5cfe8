-- A rollup run (src/store/rollup.rs): the coarser slices carbon points left pending
-- (points.lua, write_points) made from what the finer archives hold now, each carried down
-- through the coarser archives, then their members removed, in one script: a run killed
-- half-way leaves what it did not reach pending. Making a slice again is idempotent, so two
-- agents' runs over the same members change nothing twice. hourly.lua and points.lua are put
-- in front of it.
--
-- ARGV     the agent's time (Unix s), key prefix, the most members a run takes
--
-- Returns {members taken, key, error, key, error, ...}.

local now, prefix, most = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local key = prefix .. 'pending:gauge:'
local taken = redis.call('ZRANGE', key, 0, most - 1)
local members, by_spec = {}, {}
for _, member in ipairs(taken) do
  local lower, t, method, xff, spec, series =
    string.match(member, '^(%d+)|(%d+)|([%a_]+)|([^|]+)|([%d:,]+)|(.+)$')
  local archives = spec and by_spec[spec]
  if spec and not archives then
    archives = {}
    for p, kept, slots in string.gmatch(spec, '(%d+):(%d+):(%d+)') do
      archives[#archives + 1] = archive(p, kept, slots)
    end
    by_spec[spec] = archives
  end
  lower = tonumber(lower)
  -- A member this agent did not write (no such method, no such archive) is dropped.
  if lower and aggregations[method] and tonumber(xff) and lower > 1 and lower <= #archives then
    local ok, err = pcall(roll, prefix, now, archives, series, method, tonumber(xff), lower, tonumber(t), members)
    if not ok then
      failed(hash_of(prefix, archives, series, lower), err)
    end
  end
end
for j = 1, #taken, 1000 do
  redis.call('ZREM', key, unpack(taken, j, math.min(j + 999, #taken)))
end
local index = prefix .. 'known:gauge:'
for j = 1, #members, 1000 do
  try(index, 'ZADD', index, unpack(members, j, math.min(j + 999, #members)))
end
local reply = {#taken}
for _, f in ipairs(failures) do
  reply[#reply + 1] = f
end
return reply
