-- Quantile slices packed into their block (src/store/quantile_blocks.rs), in the block's slot.
-- KEYS[1]: the block. ARGV[1]: the block's header (its accuracy), ARGV[2]: when it expires
-- (EXPIREAT), then one record a slice (a varint length, the slot, the part's token, the
-- buckets). A record replaces the block's record of the same slot and token (a move tried
-- before, whose hash was not deleted), so a move repeated changes nothing; any other is added.
-- Returns the records written, -1 for another program's key under the block's name, -2 for a
-- block of another accuracy (nothing written).
local key, header, at = KEYS[1], ARGV[1], ARGV[2]
local kind = redis.call('TYPE', key).ok
if kind ~= 'none' and kind ~= 'string' then
  return -1
end
local block = kind == 'string' and redis.call('GET', key) or header
if string.sub(block, 1, #header) ~= header then
  return -2
end
-- A record's id (slot and token; the slot's high bit, which says how its buckets are coded,
-- left out: a record written again by a later release replaces an earlier one's) and where its
-- body starts, from its length at `pos`.
local function at_record(s, pos)
  local len, mul = 0, 1
  while true do
    local b = string.byte(s, pos)
    if not b then
      return nil
    end
    len, pos, mul = len + (b % 128) * mul, pos + 1, mul * 128
    if b < 128 then
      local slot = string.byte(s, pos)
      return slot and string.char(slot % 128) .. string.sub(s, pos + 1, pos + 4), pos + len
    end
  end
end
local new, order = {}, {}
for i = 3, #ARGV do
  local id = at_record(ARGV[i], 1)
  new[id], order[#order + 1] = ARGV[i], id
end
local parts, pos = {header}, #header + 1
while pos <= #block do
  local id, after = at_record(block, pos)
  if not id or after > #block + 1 then
    return -1
  end
  parts[#parts + 1] = new[id] or string.sub(block, pos, after - 1)
  new[id], pos = nil, after
end
for _, id in ipairs(order) do
  parts[#parts + 1] = new[id]
end
-- Written whole by SET, never APPENDed to: Redis grows an appended string to twice its length.
redis.call('SET', key, table.concat(parts))
redis.call('EXPIREAT', key, at)
return #ARGV - 2
