-- The cleaner's look at gauges (docs/layout.md, "The cleaner"): whether the history of each
-- gauge shows a write in the last `forget` seconds, one precision's hash a key.
--
-- KEYS: gauge:<p>:<series> hashes (one slot in a cluster). ARGV: now (epoch s), forget (s), then
-- each hash's precision p.
-- Returns per key: 0 when the gauge may have been written since now - forget, 1 when not (its
-- newest slice ends forget or more before now: every write of a gauge reaches every precision,
-- so the newest slice holds its last write), 2 when there is no such hash to judge by.

local now, forget = tonumber(ARGV[1]), tonumber(ARGV[2])
local verdicts = {}
for k = 1, #KEYS do
  local hash, p = KEYS[k], tonumber(ARGV[k + 2])
  local verdict = 2
  if redis.call('TYPE', hash).ok == 'hash' then
    -- A gauge written in the current slice: the common answer, without reading the hash whole.
    if redis.call('HEXISTS', hash, string.format('%d', now - now % p)) == 1 then
      verdict = 0
    else
      local newest
      for _, field in ipairs(redis.call('HKEYS', hash)) do
        local slice = tonumber(field)
        if slice and (not newest or slice > newest) then
          newest = slice
        end
      end
      if newest then
        verdict = newest + p + forget <= now and 1 or 0
      end
    end
  end
  verdicts[k] = verdict
end
return verdicts
