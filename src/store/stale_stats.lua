-- Gives the keys of one `stats:` family that have no expiry (written by a release that set none)
-- the one they would have had: the end of the hour after the one they hold (hourly.lua's
-- stats_end, put in front), at once when that is past. The cleaner runs it once over every
-- family (docs/layout.md, "The cleaner").
--
-- KEYS: the hour's ZSET, its :start, :last and :pstart. Returns how many keys it gave an expiry.

-- Both hours read before any key is touched: an expiry in the past deletes at once.
local function hour_of(key)
  local ok, held = pcall(redis.call, 'GET', key)
  if ok and type(held) == 'string' and string.match(held, '^%d+%-%d+%-%d+T%d+') then
    return held
  end
end
local hours = {hour_of(KEYS[2]), hour_of(KEYS[4])}
local given = 0
for k = 1, 4 do
  if redis.call('TTL', KEYS[k]) == -1 then
    local held = hours[k <= 2 and 1 or 2]
    if held then
      redis.call('EXPIREAT', KEYS[k], stats_end(held))
    else
      -- No hour to go by: as long as a key made now would live, at most.
      redis.call('EXPIRE', KEYS[k], 7200)
    end
    given = given + 1
  end
end
return given
