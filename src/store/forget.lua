-- Removes the `gauges:` fields of gauges the cleaner found idle (docs/layout.md, "The cleaner"),
-- each only if it still holds the value the cleaner read: a gauge written again meanwhile with
-- another value keeps its field; one written with the same value is put back by the cleaner's
-- check that follows.
--
-- KEYS[1] gauges:. ARGV: series, value pairs. Returns the series whose field was removed.

local removed = {}
for j = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[j]) == ARGV[j + 1] then
    redis.call('HDEL', KEYS[1], ARGV[j])
    removed[#removed + 1] = ARGV[j]
  end
end
return removed
