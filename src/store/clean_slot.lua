-- Trims hashes of one hash slot for the cleaner in a Redis Cluster (README, "Redis Sentinel and
-- Redis Cluster"): as clean.lua, but the index lives on another node, so the script only reports
-- which hashes are gone and the cleaner removes their index members, then checks again.
--
-- KEYS: the hashes (one slot). ARGV: now (epoch s), sample count, then each hash's precision
-- (0: unknown, the hash is only checked for existence).
-- Returns {slices removed, {positions in KEYS of the hashes that do not exist}}.

local now, sample_count = tonumber(ARGV[1]), tonumber(ARGV[2])
local slices, gone = 0, {}
for k = 1, #KEYS do
  local hash, precision = KEYS[k], tonumber(ARGV[k + 2])
  if precision > 0 then
    local cutoff = now - sample_count * precision
    local old = {}
    for _, slice in ipairs(redis.call('HKEYS', hash)) do
      local t = tonumber(slice)
      if t and t <= cutoff then
        old[#old + 1] = slice
      end
    end
    for j = 1, #old, 1000 do
      redis.call('HDEL', hash, unpack(old, j, math.min(j + 999, #old)))
    end
    slices = slices + #old
  end
  if redis.call('EXISTS', hash) == 0 then
    gone[#gone + 1] = k
  end
end
return {slices, gone}
