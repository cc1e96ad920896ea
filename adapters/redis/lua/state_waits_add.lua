-- STATE_WAITS_ADD: declare edges of the deadlock detector's waits-for graph (dflow.deadlock):
-- a run, waiting at a step for a call, waits for other runs. An edge declared again keeps
-- its first time. Each edge is a field 'WAITER SEQ TARGET' (run ids have no space) whose
-- value is 'SINCE CALL_TYPE', SINCE the server's time in seconds.
--
-- KEYS[1]  the declared edges (hash), P:{waits}:e
-- ARGV[1]  waiter      the waiting run
-- ARGV[2]  seq         the step it waits at
-- ARGV[3]  call_type   the call it waits for
-- ARGV[4]  n           how many runs it waits for
-- ARGV[5]  targets...  those runs, ARGV[5] to ARGV[4 + n]
local t = redis.call('TIME')
local since = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local n = tonumber(ARGV[4])
for i = 5, 4 + n do
  redis.call('HSETNX', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[i], since .. ' ' .. ARGV[3])
end
return n
