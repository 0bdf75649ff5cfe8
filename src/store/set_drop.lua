-- A set's slice's HyperLogLog deleted once its count is in its block (set_move.lua gave that
-- count): KEYS[1] the slice's key, ARGV[1] the count its slot holds. Members that raised its
-- count since keep it (the cleaner's next walk moves it again). Returns 1 if deleted.
local n = redis.pcall('PFCOUNT', KEYS[1])
if type(n) == 'number' and n <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
