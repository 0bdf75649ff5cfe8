-- Trims hashes of one hash slot for the cleaner in a Redis Cluster (docs/topologies.md): as clean.lua, but the index lives on another node, so the script only reports
-- which hashes are gone and the cleaner removes their index members, then checks again. trim.lua
-- is put in front of it.
--
-- KEYS: the hashes (one slot). ARGV: now (epoch s), the retention (retention.lua), then each hash's precision
-- (0: unknown, the hash is only checked for existence).
-- Returns {slices removed, {positions in KEYS of the hashes that do not exist}}.

local now, kept = tonumber(ARGV[1]), retention(ARGV[2])
local slices, gone = 0, {}
for k = 1, #KEYS do
  local hash, precision = KEYS[k], tonumber(ARGV[k + 2])
  if precision > 0 then
    slices = slices + trim(hash, precision, now, kept)
  end
  if not is_hash(hash) then
    gone[#gone + 1] = k
  end
end
return {slices, gone}
