-- Put in front of flush.lua, clean.lua and clean_slot.lua: the agent's retention as it sends it
-- (src/retention.rs, `Retention::encode`): one count for every precision (the book's
-- sample_count), or `precision:count` pairs, finest first. Returns a function giving how long a
-- slice of a precision is kept, in seconds; a precision not listed keeps as long as the
-- coarsest listed one at most as coarse as it (the finest when none is), as `Retention::samples`.
local function retention(text)
  local uniform = tonumber(text)
  if uniform then
    return function(p) return uniform * p end
  end
  local archives = {}
  for p, n in string.gmatch(text, '(%d+):(%d+)') do
    archives[#archives + 1] = {tonumber(p), tonumber(n)}
  end
  return function(p)
    local holder = archives[1]
    for _, a in ipairs(archives) do
      if a[1] == p then
        return a[2] * p
      end
      if a[1] <= p then
        holder = a
      end
    end
    return math.max(math.ceil(holder[1] * holder[2] / p), 2) * p
  end
end

