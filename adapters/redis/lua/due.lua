-- DUE: what is due at ``now``: timers that fired, outbox messages published and never
-- claimed, leases that ran out (their steps run again), runs whose deadline passed (they end
-- 'timed_out', with the branches they wait for: ``end_runs`` in ending), and finished runs
-- whose keys expired (out of the listings and the indexes of business keys). Returns {messages to publish, the next due time or false, unreadable entries}.
--
-- ARGV, as scripts.DUE lays it out (a test holds this list to it):
--   ARGV[1]  prefix       P, before every key
--   ARGV[2]  now          seconds
--   ARGV[3]  limit        at most this many entries of each kind
--   ARGV[4]  redispatch   seconds before an unclaimed outbox message is published again
--   ARGV[5]  stream       the stream step messages go to ('' for the outbox)
--   ARGV[6]  ttl_ms       how long a finished run is kept (a run whose deadline passed ends)
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- Entries that cannot be read (written by hand, or by another program) are dropped and
-- counted, never allowed to stall the timers of every worker.
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P = prefix
now, limit, redispatch = tonumber(now), tonumber(limit), tonumber(redispatch)
local ttl = tonumber(ttl_ms)
STREAM = stream
local out = {}
local bad = 0
-- The soonest entry of each set first: an idle store costs six reads, and a set with
-- nothing due is not scanned.
local first = {}
local function soonest(z)
  local f = redis.call('ZRANGE', P..':'..z, 0, 0, 'WITHSCORES')
  first[z] = f[2] and tonumber(f[2]) or false
end
local function due(z) return first[z] and first[z] <= now end
local SETS = {'timers', 'outbox', 'leases', 'deadlines', 'expiry', 'expiryp'}
for _, z in ipairs(SETS) do soonest(z) end
if due('timers') then
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':timers', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':timers', m)
  emit(P, now, redispatch, m, out)
end
soonest('timers')
end
if due('outbox') then
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':outbox', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':outbox', m)
  local ok, f = pcall(cmsgpack.unpack, m)
  if ok and type(f) == 'table' and type(f[1]) == 'string' then
    local r = redis.call('HMGET', P..':r:'..f[1], 'seq', 'attempt', 'status')
    local live = r[3] == 'running' or r[3] == 'sleeping' or r[3] == 'waiting'
    if live and tonumber(r[1]) == f[2] and tonumber(r[2]) == f[4] then
      emit(P, now, redispatch, m, out)  -- published and never claimed: publish again
    end
  else
    bad = bad + 1
  end
end
soonest('outbox')
end
if due('leases') then
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P..':leases', '-inf', now, 'LIMIT', 0, limit)) do
  local rk = P..':r:'..t
  local r = redis.call('HMGET', rk, 'lease_until', 'lease_msg', 'attempt')
  redis.call('ZREM', P..':leases', t)
  if r[1] and tonumber(r[1]) > now then
    redis.call('ZADD', P..':leases', r[1], t)  -- renewed meanwhile: keep watching it
  elseif r[1] then
    local ok, f = pcall(cmsgpack.unpack, r[2] or '')
    redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
    if ok and type(f) == 'table' then
      local attempt = tonumber(r[3]) + 1
      f[4] = attempt
      redis.call('HSET', rk, 'attempt', tostring(attempt))
      emit(P, now, redispatch, cmsgpack.pack(f), out)
    else
      bad = bad + 1
    end
  end
end
soonest('leases')
end
-- runs whose deadline passed (create set it: the run's field 'deadline', in seconds) end timed out
if due('deadlines') then
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P..':deadlines', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':deadlines', t)
  local r = redis.call('HMGET', P..':r:'..t, 'status', 'key', 'deadline')
  if going(r[1]) and r[3] then
    local err = cmsgpack.pack({type = 'dflow.RunTimedOut', step = r[2], deadline = tonumber(r[3]),
      message = 'its deadline of '..r[3]..' s passed at step \''..r[2]..'\''})
    end_runs(P, t, 'timed_out', err, now, redispatch, ttl, out)
  end
end
soonest('deadlines')
end
-- finished runs whose keys expired leave the runs index and the listings
if due('expiry') then
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P..':expiry', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':expiry', t)
  local left = redis.call('PTTL', P..':r:'..t)
  if left == -2 then
    redis.call('ZREM', P..':runs', t)  -- gone
    unlisted(P, t, false)
  elseif left >= 0 then
    redis.call('ZADD', P..':expiry', now + left / 1000 + 1, t)  -- not yet (our clock runs ahead)
  end  -- no expiry at all: started again under this id, it stays listed
end
soonest('expiry')
end
-- the same for listed runs of a pipeline and runs with a business key (see listed), whose
-- entries name the pipeline ('' for none) and the key too
if due('expiryp') then
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':expiryp', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':expiryp', m)
  local ok, f = pcall(cmsgpack.unpack, m)
  if ok and type(f) == 'table' and type(f[1]) == 'string' and type(f[2]) == 'string' then
    local t, pl, bkey = f[1], f[2] ~= '' and f[2], type(f[3]) == 'string' and f[3]
    local rk = P..':r:'..t
    local left = redis.call('PTTL', rk)
    if left == -2 then
      redis.call('ZREM', P..':runs', t)  -- gone
      unlisted(P, t, pl)
      if bkey then redis.call('ZREM', P..':bk:'..bkey, t) end  -- (an index left empty goes)
    elseif left >= 0 then
      redis.call('ZADD', P..':expiryp', now + left / 1000 + 1, m)  -- not yet
    else  -- started again under this id: by another pipeline, without this key?
      if pl and redis.call('HGET', rk, 'pipeline') ~= pl then redis.call('ZREM', P..':ixp:'..pl, t) end
      if bkey and redis.call('HGET', rk, 'bkey') ~= bkey then redis.call('ZREM', P..':bk:'..bkey, t) end
    end
  else
    bad = bad + 1
  end
end
soonest('expiryp')
end
if #out > 0 then soonest('outbox') end  -- (what was emitted waits there to be claimed)
local nxt = false
for _, z in ipairs(SETS) do
  if first[z] and ((not nxt) or first[z] < nxt) then nxt = first[z] end
end
return {out, nxt and tostring(nxt) or false, bad}
