-- The cleaner's lease (docs/layout.md, "The cleaner"): one agent cleans at a time.
--
-- KEYS[1] cleaner:lock; ARGV[1] this agent's id; ARGV[2] lease time in ms; ARGV[3] 'hold' or
-- 'release'. 'hold' takes a free lease or renews our own and returns 1; returns 0 while another
-- agent holds it. 'release' frees the lease only if it is ours.

local holder = redis.call('GET', KEYS[1])
if ARGV[3] == 'release' then
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
  return 0
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
