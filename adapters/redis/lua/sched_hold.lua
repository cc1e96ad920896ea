-- SCHED_HOLD: let a worker fire a schedule's tick, and no other worker until until_ms.
-- Returns 1 when it may (the schedule stands at tick_ms, not paused, and no other
-- worker's hold lasts past now_ms), else 0.
--
-- KEYS[1]  P:{schedules}:due, KEYS[2] P:{schedules}:holds
-- ARGV[1]  name
-- ARGV[2]  tick_ms
-- ARGV[3]  worker
-- ARGV[4]  now_ms
-- ARGV[5]  until_ms
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not at) or tonumber(at) ~= tonumber(ARGV[2]) then return 0 end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  local holder, untils = string.match(held, '^(.*) (%d+)$')
  if holder ~= ARGV[3] and tonumber(untils) > tonumber(ARGV[4]) then return 0 end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. ARGV[5])
return 1
