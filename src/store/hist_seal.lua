-- Quantile slices' hashes sealed for their move into their blocks (src/store/quantile_blocks.rs),
-- a call for many (all of one slot in a cluster): KEYS the slices' hashes, ARGV a token for
-- each (kept where a hash has one already: a move tried before). Returns for each its fields
-- and values, its token among them (`m`), or false for a key that is not a hash (gone since the
-- walk found it, or another program's).
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'hash' then
    redis.call('HSETNX', key, 'm', ARGV[i])
    out[i] = redis.call('HGETALL', key)
  else
    out[i] = false
  end
end
return out
