-- INIT_DONE: the ``on_init`` of a waiting step ran: its lease goes.
--
-- ARGV, as scripts.INIT_DONE lays it out (a test holds this list to it):
--   ARGV[1]  prefix   P, before every key
--   ARGV[2]  trace    the run id
--   ARGV[3]  seq      the step that is waiting
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local rk = prefix..':r:'..trace
local r = redis.call('HMGET', rk, 'seq', 'init_pending')
if r[1] == seq and r[2] == '1' then
  redis.call('HSET', rk, 'init_pending', '0')
  redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
  redis.call('ZREM', prefix..':leases', trace)
end
return 1
