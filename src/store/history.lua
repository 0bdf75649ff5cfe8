-- Put after retention.lua and numbers.lua, in front of trim.lua (src/store/cleaner.rs): a long
-- archive's slices moved out of the book's hash into blocks of fixed slots
-- (src/store/history.rs, docs/layout.md "History: fixed slots").

-- The cleaner's `precision:slots` list (`Retention::encode_history`): a function giving a
-- precision's slots a block, or nil where the hash keeps every slice.
local function cuts(text)
  local slots = {}
  for p, n in string.gmatch(text or '', '(%d+):(%d+)') do
    slots[tonumber(p)] = tonumber(n)
  end
  return function(p) return slots[p] end
end

-- Slices the book's hash keeps of such an archive (history.rs, HASH_SLICES), those a gauge's
-- hash keeps (GAUGE_HASH_SLICES), a group of eight slots' bytes (a flag byte, then eight 8-byte
-- slots), and the most slices one call moves (a hash written by an earlier release moves over
-- several passes, none of which holds Redis long).
local HASH_SLICES, GAUGE_HASH_SLICES, GROUP, MOST_MOVED = 120, 16, 65, 20000
local moved_budget = MOST_MOVED

-- How many of its newest slices a long archive's hash keeps (a gauge's with `gauge`).
local function hash_slices(gauge)
  return gauge and GAUGE_HASH_SLICES or HASH_SLICES
end

-- The oldest slice of `precision` the hash keeps at `now` (a gauge's with `gauge`): its newest
-- slices, the one being written among them (history.rs, `keep_from`).
local function keep_from(now, precision, gauge)
  return now - now % precision - (hash_slices(gauge) - 1) * precision
end

-- Moves the `fields` (slice, value pairs, as HGETALL gives them) of `hash` older than the
-- newest slices its hash keeps at `now`, but its newest field (which keeps the hash, and its index
-- member, while the series has history), into the blocks named `block_prefix<member>:<slots>:<n>`:
-- a counter's value added to its slot, a gauge's set; each field deleted in the same call, so a
-- slice is in the hash or in a block, never counted twice. A counter slot that would overflow
-- keeps its field. Fields at or before `cutoff` (out of the retention) are not moved. With
-- `others` (the hash holds fields besides `fields`, which keep it), the newest of `fields` moves
-- too. `times[i]` holds `fields[i]` as a number (nil: not one), `newest` the newest of them.
-- Returns how many moved.
local function move(hash, block_base, precision, slots, fields, times, newest, now, cutoff, kept,
    gauge, others)
  local keep_from = keep_from(now, precision, gauge)
  if others then newest = nil end
  local made, moved, gone = {}, 0, {}
  for i = 1, #fields, 2 do
    local t = times[i]
    if moved_budget <= 0 then break end
    if t and t > cutoff and t < keep_from and t ~= newest and t % precision == 0 then
      local index = t / precision
      local block, slot = math.floor(index / slots), index % slots
      local key = block_base .. ':' .. whole_text(block)
      if made[key] == nil then
        -- Made whole at once (a string grown slot by slot would take twice its bytes), and
        -- kept until its newest slice leaves the retention. A key of another type under the
        -- name (another program's) takes nothing: the slices stay in the hash.
        local r = redis.pcall('BITFIELD', key, 'INCRBY', 'u8',
          whole_text((slots / 8 * GROUP - 1) * 8), '0')
        made[key] = not r.err
        if made[key] then
          redis.call('EXPIRE', key,
            whole_text(math.max((block + 1) * slots * precision + kept - now, 1)))
        end
      end
      local group = math.floor(slot / 8) * GROUP
      local at = (group + 1 + (slot % 8) * 8) * 8
      local ok
      if not made[key] then
        ok = false
      elseif gauge then
        local v = tonumber(fields[i + 1])
        if v then
          redis.call('SETRANGE', key, whole_text(at / 8), struct.pack('>d', v))
          ok = true
        end
      else
        local r = redis.pcall('BITFIELD', key, 'OVERFLOW', 'FAIL', 'INCRBY', 'i64', whole_text(at),
          fields[i + 1])
        ok = type(r) == 'table' and r[1] ~= nil and r[1] ~= false
      end
      if ok then
        redis.call('SETBIT', key, whole_text(group * 8 + slot % 8), '1')
        gone[#gone + 1] = fields[i]
        moved = moved + 1
        moved_budget = moved_budget - 1
      end
    end
  end
  for j = 1, #gone, 1000 do
    redis.call('HDEL', hash, unpack(gone, j, math.min(j + 999, #gone)))
  end
  return moved
end
