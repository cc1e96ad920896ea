-- CANCEL: end a run CANCELLED, and the zip/any branches its open join waits for, and theirs
-- (``end_runs`` in ending: a run holding compensations runs them instead of ending).
-- Returns false when there is no such run, else {the status it had, messages to publish}.
--
-- ARGV, as scripts.CANCEL lays it out (a test holds this list to it):
--   ARGV[1]  prefix       P, before every key
--   ARGV[2]  trace        the run id
--   ARGV[3]  now          seconds
--   ARGV[4]  ttl_ms       how long a finished run is kept
--   ARGV[5]  redispatch   seconds before an unclaimed outbox message is published again
--   ARGV[6]  stream       the stream step messages go to ('' for the outbox)
--   ARGV[7]  error        the error recorded on each cancelled run (msgpack)
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, t = prefix, trace
local ttl
now, ttl, redispatch = tonumber(now), tonumber(ttl_ms), tonumber(redispatch)
STREAM = stream
local err = error
local rk = P..':r:'..t
local status = redis.call('HGET', rk, 'status')
if not status then return false end
local out = {}
if not going(status) then return {status, out} end  -- it has ended

end_runs(P, t, 'cancelled', err, now, redispatch, ttl, out)
return {status, out}
