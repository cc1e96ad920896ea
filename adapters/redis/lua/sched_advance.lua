-- SCHED_ADVANCE: move a schedule from tick_ms on to next_ms, record what it fired (unless
-- ARGV[4] is ''), and end its hold. Returns 1 when it stood at tick_ms (not paused), else
-- 0 and nothing changes.
--
-- KEYS[1]  P:{schedules}:due, KEYS[2] P:{schedules}:holds, KEYS[3] P:{schedules}:last
-- ARGV[1]  name
-- ARGV[2]  tick_ms
-- ARGV[3]  next_ms
-- ARGV[4]  fired      as dflow.schedules.Fired.dump writes it, or ''
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not at) or tonumber(at) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[4]) end
return 1
