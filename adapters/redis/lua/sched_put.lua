-- SCHED_PUT: keep a schedule. A new one fires first at next_ms; one kept the same is left
-- as it is; one kept with other settings takes these, and fires next at next_ms unless it
-- is paused (then it stays paused). Returns 1 when it wrote, else 0.
--
-- KEYS[1]  the schedules (hash: name -> schedule), P:{schedules}:specs
-- KEYS[2]  the next fire times of those not paused (zset: name -> ms), P:{schedules}:due
-- KEYS[3]  the holds (hash: name -> "worker until_ms"), P:{schedules}:holds
-- ARGV[1]  name
-- ARGV[2]  schedule   as dflow.schedules.Schedule.dump writes it
-- ARGV[3]  next_ms    its first (or next) fire time
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old == ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if (not old) or redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return 1
