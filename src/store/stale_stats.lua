-- Gives a key of the hourly statistics that has no expiry (written by a release that set none)
-- the one it would have had: the end of the hour after the one it holds (hourly.lua's
-- stats_end, put in front), at once when that is past. The cleaner runs it once over every
-- `stats:` key (docs/layout.md, "The cleaner").
--
-- KEYS[1] the key; KEYS[2] the key holding its hour (itself for `:start` and `:pstart`).
-- Returns 1 when it gave the key an expiry, else 0.

if redis.call('TTL', KEYS[1]) ~= -1 then
  return 0
end
local ok, held = pcall(redis.call, 'GET', KEYS[2])
if ok and type(held) == 'string' and string.match(held, '^%d+%-%d+%-%d+T%d+') then
  redis.call('EXPIREAT', KEYS[1], stats_end(held))
else
  -- No hour to go by: as long as a key made now would live, at most.
  redis.call('EXPIRE', KEYS[1], 7200)
end
return 1
