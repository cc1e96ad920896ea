-- SCHED_PAUSE: pause a schedule (ARGV[2] is '') or resume a paused one, firing first at
-- ARGV[2]; one not paused goes on as it was. Returns 1 when the schedule exists, else 0.
--
-- KEYS[1]  P:{schedules}:specs, KEYS[2] P:{schedules}:due, KEYS[3] P:{schedules}:holds
-- ARGV[1]  name
-- ARGV[2]  next_ms    '' to pause
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
elseif not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
end
return 1
