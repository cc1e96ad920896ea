-- STATE_WAITS_LEASE: the lease that lets one deadlock detector at a time, across every process,
-- look for cycles: take it when free, renew it when held by the same token, give it up
-- with a time of 0. Returns 1 when the token holds it now, else 0.
--
-- KEYS[1]  the lease (string: the holder's token), P:{waits}:lease
-- ARGV[1]  token   the detector's token
-- ARGV[2]  ms      how long to hold it; 0: give it up
local holder = redis.call('GET', KEYS[1])
local ms = tonumber(ARGV[2])
if ms <= 0 then
  if holder == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ms)
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
return 1
