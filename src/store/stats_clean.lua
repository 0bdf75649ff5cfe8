-- The cleaner's look at one family of hourly statistics (docs/layout.md, "The cleaner"): the
-- hour's ZSET and its `:start`, the previous hour's `:last` and `:pstart`. Each pair is deleted
-- once the hour after the one it holds has ended, so the book's readers find an hour through
-- that hour and the next, and a series that stops leaves nothing. A pair without its hour (no
-- writer of ours makes one) is left alone.
--
-- KEYS: the hour's ZSET, :start, :last, :pstart (one slot). ARGV[1]: now (epoch s, the agent's
-- clock, as the hours were written). Returns how many keys it deleted.

-- When the statistics of `text`'s hour (YYYY-MM-DDTHH:00:00, UTC) stop being readable: the end of
-- the hour after it, epoch seconds (days from the civil date, proleptic Gregorian).
local function readable_until(text)
  local y, m, d, h = string.match(text, '^(%d+)-(%d+)-(%d+)T(%d+)')
  if not y then
    return nil
  end
  y, m, d, h = tonumber(y), tonumber(m), tonumber(d), tonumber(h)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * (m > 2 and m - 3 or m + 9) + 2) / 5) + d - 1
  local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    - 719468
  return days * 86400 + (h + 2) * 3600
end

local now = tonumber(ARGV[1])
local deleted = 0
for _, pair in ipairs({{1, 2}, {3, 4}}) do
  local ok, held = pcall(redis.call, 'GET', KEYS[pair[2]])
  local ends = ok and type(held) == 'string' and readable_until(held)
  if ends and ends <= now then
    deleted = deleted + redis.call('DEL', KEYS[pair[1]], KEYS[pair[2]])
  end
end
return deleted
