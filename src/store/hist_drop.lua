-- A quantile slice's hash deleted once its record is in its block (src/store/quantile_blocks.rs):
-- KEYS[1] the hash, ARGV its fields and values as hist_seal.lua returned them and the record
-- holds them. A hash written since (a late value) keeps it, and the next walk moves it again
-- under the same token. Returns 1 if deleted.
local now = redis.call('HGETALL', KEYS[1])
if #now ~= #ARGV then
  return 0
end
local moved = {}
for i = 1, #ARGV, 2 do
  moved[ARGV[i]] = ARGV[i + 1]
end
for i = 1, #now, 2 do
  if moved[now[i]] ~= now[i + 1] then
    return 0
  end
end
redis.call('DEL', KEYS[1])
return 1
