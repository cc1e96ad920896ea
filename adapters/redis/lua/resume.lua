-- RESUME: the call a waiting run waits for has come: the run goes on with its payload (or
-- fails with it). Returns {'missing'}, {'not', status, waiting for, joining} when the run is
-- not waiting for it, else {'ok', messages to publish}. With ``per_run`` given, a call to a
-- run that goes on but does not wait for it is kept in its mailbox (mailbox.lua): {'kept'},
-- or {'full', status, calls held, calls of the type held} over the bounds.
--
-- ARGV, as scripts.RESUME lays it out (a test holds this list to it):
--   ARGV[1]  prefix       P, before every key
--   ARGV[2]  trace        the run id
--   ARGV[3]  call_type    what the run must be waiting for
--   ARGV[4]  payload      the step's output
--   ARGV[5]  failed       '1': the run fails with the payload
--   ARGV[6]  now          seconds
--   ARGV[7]  redispatch   seconds before an unclaimed outbox message is published again
--   ARGV[8]  seq          the step it must be waiting at ('' for any)
--   ARGV[9]  stream       the stream step messages go to ('' for the outbox)
--   ARGV[10] per_run      keep an early call within these bounds of the mailbox ('' to refuse it)
--   ARGV[11] per_type
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, t = prefix, trace
STREAM = stream
local rk = P..':r:'..t
local r = redis.call('HMGET', rk, 'status', 'waiting', 'seq', 'key', 'ix', 'pipeline')
if not r[1] then return {'missing'} end
if r[1] ~= 'waiting' or r[2] ~= call_type or (seq ~= '' and seq ~= r[3]) then
  local ended = r[1] == 'done' or r[1] == 'failed' or r[1] == 'cancelled' or r[1] == 'compensated'
                or r[1] == 'timed_out'
  if per_run ~= '' and seq == '' and not ended then
    local full = keep_mail(P, t, call_type, payload, failed, tonumber(per_run), tonumber(per_type))
    if full then return {'full', r[1], full[2], full[3]} end
    return {'kept'}
  end
  local joining = redis.call('HGET', P..':j:'..t, 'closed') == '0'
  return {'not', r[1], r[2] or '', joining and '1' or '0'}
end
local next_seq = tonumber(r[3]) + 1
local kind = 1
if failed == '1' then kind = 3 end
local msg = cmsgpack.pack({t, next_seq, r[4], 0, kind})
redis.call('HSET', rk, 'status', 'running', 'seq', tostring(next_seq), 'attempt', '0', 'kind', tostring(kind),
           'value', payload, 'updated', now)
listed(P, t, r[5], r[6], 'running')
redis.call('HDEL', rk, 'waiting', 'init_pending', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'due')
redis.call('ZREM', P..':leases', t)
local out = {}
emit(P, tonumber(now), tonumber(redispatch), msg, out)
return {'ok', out}
