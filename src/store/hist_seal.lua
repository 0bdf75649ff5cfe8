-- A quantile slice's hash sealed for its move into its block (src/store/quantile_blocks.rs):
-- KEYS[1] the slice's hash, ARGV[1] a token for it (kept if it has one already: a move tried
-- before). Returns the hash's fields and values, its token among them (`m`), or false for a key
-- that is not a hash (gone since the walk found it, or another program's).
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return false
end
redis.call('HSETNX', KEYS[1], 'm', ARGV[1])
return redis.call('HGETALL', KEYS[1])
