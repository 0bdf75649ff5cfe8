-- Quantile slices' hashes deleted once their records are in their blocks
-- (src/store/quantile_blocks.rs), a call for many (all of one slot in a cluster): KEYS the
-- hashes; ARGV for each in turn, the number of its arguments, then its fields and values as
-- hist_seal.lua returned them and its record holds them. A hash written since (a late value)
-- is kept, and the next walk moves it again under the same token. Returns how many were
-- deleted.
local deleted, at = 0, 1
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  local moved = {}
  for i = at + 1, at + n, 2 do
    moved[ARGV[i]] = ARGV[i + 1]
  end
  at = at + n + 1
  -- Another program's key by now: an error reply, which holds no fields.
  local now = redis.pcall('HGETALL', key)
  local same = #now == n
  for i = 1, #now, 2 do
    same = same and moved[now[i]] == now[i + 1]
  end
  if same then
    redis.call('DEL', key)
    deleted = deleted + 1
  end
end
return deleted
