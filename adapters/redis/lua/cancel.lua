-- CANCEL: end a run CANCELLED, and the zip/any branches its open join waits for, and theirs:
-- each gets the status and the error, its join is closed (so no branch arrives at it), its
-- timer goes, and ``finished`` drops its lease, its wait and its frames, tells its waiters,
-- and hands the cancelled run to its own parent's join (where it counts as failed). Queued
-- messages of these runs are dropped when they come: the run no longer expects them. A run whose
-- compensations flag is 'held' runs them instead of ending, one whose flag is 'running' is left
-- as it is (see ``compensates`` in finish).
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
if status == 'done' or status == 'failed' or status == 'cancelled' or status == 'compensated' then
  return {status, out}
end

local function drop_timer(ct, due)
  -- the timer's entry: near its due time (the score went through a string), naming this run
  local at = tonumber(due)
  if not at then return end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':timers', at - 0.001, at + 0.001)) do
    local ok, f = pcall(cmsgpack.unpack, m)
    if ok and type(f) == 'table' and f[1] == ct then redis.call('ZREM', P..':timers', m) end
  end
end

local todo = {t}
local i = 1
while i <= #todo do
  local ct = todo[i]
  i = i + 1
  local crk = P..':r:'..ct
  -- a run running its compensations goes on: a cancel (a second one, say) must not cut them short
  if compensations_of(P, ct, crk) ~= 'running' then
    local r = redis.call('HMGET', crk, 'due', 'ix', 'pipeline')
    if r[1] then drop_timer(ct, r[1]) end
    local comp = compensates(P, ct, crk, err, now, redispatch, out)  -- it runs its compensations first
    if not comp then
      redis.call('HSET', crk, 'status', 'cancelled', 'error', err, 'updated', tostring(now))
      listed(P, ct, r[2], r[3], 'cancelled')
    end
    local jk = P..':j:'..ct
    if redis.call('HGET', jk, 'closed') == '0' then
      redis.call('HSET', jk, 'closed', '1')
      for _, child in ipairs(redis.call('LRANGE', P..':jc:'..ct, 0, -1)) do
        local st = redis.call('HGET', P..':r:'..child, 'status')
        if st == 'running' or st == 'waiting' or st == 'sleeping' then todo[#todo + 1] = child end
      end
    end
    if not comp then finished(P, ct, crk, now, redispatch, ttl, out, r[2] and r[3]) end
  end
end
return {status, out}
