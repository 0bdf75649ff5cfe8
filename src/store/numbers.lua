-- Put in front of points.lua (flush.lua) and history.lua (clean.lua, clean_slot.lua): whole
-- numbers as the text Redis is given. Redis 7.0 formats a number argument of redis.call with
-- printf's %.17g, and Lua a number joined to a string with %.14g: each several times what %d
-- costs, most of a carbon point's cost when its coarser slices read a few dozen fields, and a
-- tenth of a cleaner's visit (docs/benchmarks.md, "The cleaner's numbers as text"). So slices,
-- offsets, lengths and precisions go to Redis as text, each number written once a call (the
-- items of a chunk share their slices): %d, which gives the same digits for these whole
-- numbers.
local whole_texts = {}
local function whole_text(n)
  local s = whole_texts[n]
  if s == nil then
    s = string.format('%d', n)
    whole_texts[n] = s
  end
  return s
end
