-- Trims one batch of index members (docs/layout.md, "The cleaner", the book's clean_counters); trim.lua is put in
-- front of it.
--
-- ARGV: index key, hash prefix, now (epoch s), the retention (retention.lua), the long archives'
-- cuts (history.lua), the blocks' prefix (`<prefix>history:count:`), 1 for gauges, the
-- precisions whose long archives' visits are quick (`precision:since` pairs: trim.lua), then
-- members `<precision>:<series>`.
-- For each member: move a long archive's older slices into blocks (history.lua); delete the
-- slices older than its precision keeps; if the hash
-- is then empty (or was already gone, or the key is another program's, of another type), remove
-- the member from the index. Both happen in this one atomic call, so a writer's new slice
-- either lands before (the hash is not empty) or after (the writer adds the member unless it
-- wrote a slice there within half the retention, which this call would not have deleted:
-- src/store/write/standalone.rs, `Indexed`).
-- Returns {slices removed, members removed, slices moved}.

local index, hash_prefix = ARGV[1], ARGV[2]
local now, kept, cut = tonumber(ARGV[3]), retention(ARGV[4]), cuts(ARGV[5])
local block_prefix, gauge, since = ARGV[6], ARGV[7] == '1', cuts(ARGV[8])
local slices, removed, moved = 0, 0, 0
for i = 9, #ARGV do
  local member, left = ARGV[i], 0
  local hash = hash_prefix .. member
  local precision = tonumber(string.match(member, '^(%d+):'))
  if precision then
    local deleted, into
    deleted, into, left = trim(hash, precision, now, kept, cut(precision), block_prefix .. member,
      gauge, since(precision))
    slices, moved = slices + deleted, moved + into
  end
  if left <= 0 and not is_hash(hash) then
    redis.call('ZREM', index, member)
    removed = removed + 1
  end
end
return {slices, removed, moved}
