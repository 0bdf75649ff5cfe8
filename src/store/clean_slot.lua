-- Trims hashes of one hash slot for the cleaner in a Redis Cluster (docs/topologies.md): as clean.lua, but the index lives on another node, so the script only reports
-- which hashes are gone and the cleaner removes their index members, then checks again. trim.lua
-- is put in front of it.
--
-- KEYS: the hashes (one slot). ARGV: now (epoch s), the retention (retention.lua), the long
-- archives' cuts (history.lua), 1 for gauges, the quick visits' `precision:since` pairs
-- (trim.lua), then each hash's precision (0: unknown, the hash is
-- only checked for existence) and its blocks' base name (`Keys::history_base`: with the slot's
-- hash tag, so that its blocks share the hash's slot).
-- Returns {slices removed, {positions in KEYS of the hashes that do not exist}, slices moved}.

local now, kept, cut = tonumber(ARGV[1]), retention(ARGV[2]), cuts(ARGV[3])
local gauge, since = ARGV[4] == '1', cuts(ARGV[5])
local slices, gone, moved = 0, {}, 0
for k = 1, #KEYS do
  local hash, precision, base = KEYS[k], tonumber(ARGV[4 + 2 * k]), ARGV[5 + 2 * k]
  local left = 0
  if precision > 0 then
    local deleted, into
    deleted, into, left = trim(hash, precision, now, kept, cut(precision), base, gauge,
      since(precision))
    slices, moved = slices + deleted, moved + into
  end
  if left <= 0 and not is_hash(hash) then
    gone[#gone + 1] = k
  end
end
return {slices, gone, moved}
