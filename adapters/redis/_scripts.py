"""Lua scripts of the Redis store: each store operation is one atomic script.

Keys, under a prefix P: ``P:r:<trace>`` run hash, ``P:d:<trace>`` data hash, ``P:s:<trace>``
step records (list), ``P:c:<trace>`` keys a branch run changed (set), ``P:j:<trace>`` join
state, ``P:js:<trace>`` branch results in arrival order, ``P:ja:<trace>`` arrived branch
indexes, ``P:w:<trace>`` channels of processes waiting for the run to finish; global sorted
sets ``P:outbox`` (published, not yet claimed), ``P:timers``, ``P:leases`` and ``P:runs``;
``P:b:<ref>`` signed flow blobs. With a stream (``dispatch_via``), step messages go onto it
inside the scripts and the outbox is not used.
Messages are msgpack arrays [trace, seq, key, attempt, kind]; scripts build them with cmsgpack.
"""

from __future__ import annotations

# Dispatch of a step message. With a stream (the last argument of the scripts that emit),
# the message goes onto it in the same atomic step; without one it is kept in the outbox
# and returned for the caller to publish.
_EMIT = r"""
local STREAM = ARGV[#ARGV]
local function emit(P, now, redispatch, msg, out)
  if STREAM ~= '' then
    redis.call('XADD', STREAM, '*', 'm', msg)
  else
    redis.call('ZADD', P..':outbox', now + redispatch, msg)
    out[#out + 1] = msg
  end
end
"""

# Shared helpers, prepended to the scripts that finish runs.
_FINISH = _EMIT + r"""
local function run_keys(P, t)
  return {P..':r:'..t, P..':d:'..t, P..':s:'..t, P..':c:'..t, P..':j:'..t, P..':js:'..t, P..':ja:'..t,
          P..':jc:'..t}
end

local CANCELLED = cmsgpack.pack({type = 'dflow.Cancelled', step = '',
  message = 'cancelled: its zip/any join closed without it (a winner was found, or a branch failed)'})
local finished


local function arrive(P, t, rk, now, redispatch, ttl, out)
  local link = redis.call('HMGET', rk, 'p_trace', 'p_seq', 'p_index', 'status', 'result', 'error')
  if not link[1] then return end
  local pt = link[1]
  local prk = P..':r:'..pt
  if redis.call('HGET', prk, 'seq') ~= link[2] then return end
  local jk = P..':j:'..pt
  local j = redis.call('HMGET', jk, 'kind', 'n', 'msg', 'closed')
  if not j[1] or j[4] == '1' then return end
  if redis.call('SADD', P..':ja:'..pt, link[3]) == 0 then return end
  local ok = link[4] == 'done'
  local changes = {}
  local dk = P..':d:'..t
  for _, k in ipairs(redis.call('SMEMBERS', P..':c:'..t)) do
    changes[k] = redis.call('HGET', dk, k) or false
  end
  local slot = cmsgpack.pack({tonumber(link[3]), ok, link[5] or false, link[6] or false, changes})
  redis.call('RPUSH', P..':js:'..pt, slot)
  local arrived = redis.call('SCARD', P..':ja:'..pt)
  local n = tonumber(j[2])
  local complete
  if j[1] == 'zip' then complete = (not ok) or arrived == n else complete = ok or arrived == n end
  if complete then
    redis.call('HSET', jk, 'closed', '1')
    redis.call('HSET', prk, 'status', 'running', 'updated', tostring(now))
    emit(P, now, redispatch, j[3], out)
    -- the other branches are no longer wanted
    for i, ct in ipairs(redis.call('LRANGE', P..':jc:'..pt, 0, -1)) do
      if redis.call('SISMEMBER', P..':ja:'..pt, tostring(i - 1)) == 0 then
        local crk = P..':r:'..ct
        local st = redis.call('HGET', crk, 'status')
        if st == 'running' or st == 'waiting' then
          redis.call('HSET', crk, 'status', 'failed', 'error', CANCELLED, 'updated', tostring(now))
          finished(P, ct, crk, now, redispatch, ttl, out)
        end
      end
    end
  end
end

finished = function(P, t, rk, now, redispatch, ttl, out)
  redis.call('HDEL', rk, 'frames', 'value', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'waiting',
             'init_pending', 'parked')
  redis.call('ZREM', P..':leases', t)
  arrive(P, t, rk, now, redispatch, ttl, out)
  local wk = P..':w:'..t
  -- pcall: a user without pub/sub rights (Redis 7 ACLs) must not break the commit; waiters poll.
  for _, channel in ipairs(redis.call('SMEMBERS', wk)) do redis.pcall('PUBLISH', channel, t) end
  redis.call('DEL', wk)
  for _, k in ipairs(run_keys(P, t)) do
    if ttl > 0 then redis.call('PEXPIRE', k, ttl) else redis.call('DEL', k) end
  end
end
"""

CREATE = (
    _FINISH
    + r"""
-- ARGV: P, trace, now, redispatch, ttl_ms, frames, value, msg, seq, key, result, parent_trace, parent_seq,
--       parent_index, n_records, records..., n_data, (field, value)...
local P, t = ARGV[1], ARGV[2]
local rk = P..':r:'..t
if redis.call('EXISTS', rk) == 1 then return false end
local now, redispatch, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('HSET', rk, 'frames', ARGV[6], 'value', ARGV[7], 'seq', ARGV[9], 'attempt', '0', 'key', ARGV[10],
           'created', ARGV[3], 'updated', ARGV[3])
if ARGV[12] ~= '' then
  redis.call('HSET', rk, 'p_trace', ARGV[12], 'p_seq', ARGV[13], 'p_index', ARGV[14])
end
local i = 15
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('RPUSH', P..':s:'..t, unpack(ARGV, i, i + n - 1)) end
i = i + n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('HSET', P..':d:'..t, unpack(ARGV, i, i + 2 * n - 1)) end
redis.call('ZADD', P..':runs', now, t)
local out = {}
if ARGV[8] ~= '' then
  redis.call('HSET', rk, 'status', 'running')
  emit(P, now, redispatch, ARGV[8], out)
else
  redis.call('HSET', rk, 'status', 'done', 'result', ARGV[11])
  finished(P, t, rk, now, redispatch, ttl, out)
end
return out
"""
)

# Claiming a step: check the message is current and take its lease.
_CLAIM_STEP = r"""
local function claim_step(P, t, msg, seq, attempt, key, kind, now, lease, token)
  local rk = P..':r:'..t
  local r = redis.call('HMGET', rk, 'status', 'seq', 'attempt', 'key', 'init_pending', 'lease_until', 'frames',
                       'value')
  if not r[1] then return false end
  if r[2] ~= seq or r[3] ~= attempt or r[4] ~= key then return false end
  local init_only = 0
  if r[1] ~= 'running' then
    if r[1] == 'waiting' and r[5] == '1' and kind == '0' then init_only = 1 else return false end
  end
  if r[6] and tonumber(r[6]) > now then return false end
  redis.call('ZREM', P..':outbox', msg)
  local until_ = tostring(now + tonumber(lease))  -- one rounding for the record and the index
  redis.call('HSET', rk, 'lease_token', token, 'lease_until', until_, 'lease_len', lease, 'lease_msg', msg)
  redis.call('ZADD', P..':leases', until_, t)
  local slots = false
  if kind == '2' then slots = redis.call('LRANGE', P..':js:'..t, 0, -1) end
  return {r[7] or '', r[8] or '', init_only, redis.call('HGETALL', P..':d:'..t), slots}
end
"""

CLAIM = (
    _CLAIM_STEP
    + r"""
-- ARGV: P, trace, msg, seq, attempt, key, kind, now, lease, token
return claim_step(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9],
                  ARGV[10])
"""
)

COMMIT = (
    _FINISH
    + _CLAIM_STEP
    + r"""
-- ARGV: P, trace, token, now, ttl_ms, redispatch, claim_kind, n_rec, rec..., n_set, (k, v)..., n_del, k...,
--       transition, fields..., group, receipt, taker, take_token, take_lease, stream
-- With a stream: the delivery ``receipt`` is acknowledged, and when ``taker`` is given the
-- next new message of the stream is read for that consumer and claimed (``take``).
local NA = #ARGV
local GROUP, RECEIPT, TAKER, TAKE_TOKEN, TAKE_LEASE = ARGV[NA - 5], ARGV[NA - 4], ARGV[NA - 3], ARGV[NA - 2],
  ARGV[NA - 1]
local P, t = ARGV[1], ARGV[2]
if RECEIPT ~= '' then
  redis.call('XACK', STREAM, GROUP, RECEIPT)
  redis.call('XDEL', STREAM, RECEIPT)
end
local rk = P..':r:'..t
local lease = redis.call('HMGET', rk, 'lease_token', 'lease_len', 'lease_msg', 'p_trace')
if lease[1] ~= ARGV[3] then return false end
local now, ttl, redispatch = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

-- A step message exactly as Message.decode accepts it (the same rules, tested on one table):
-- an array of 5 [trace, seq, key, attempt, kind]: a run id, a non-empty UTF-8 key, counts from
-- 0 below 2^53, kind 0-3, in the shortest encoding (as packing its fields again gives).
-- Anything else goes back to the worker, which dead-letters it.
local function utf8_ok(s)
  if not string.find(s, '[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local extra
    if c < 0x80 then extra = 0
    elseif c >= 0xC2 and c <= 0xDF then extra = 1
    elseif c >= 0xE0 and c <= 0xEF then extra = 2
    elseif c >= 0xF0 and c <= 0xF4 then extra = 3
    else return false end
    if i + extra > n then return false end
    for k = i + 1, i + extra do
      local b = string.byte(s, k)
      if b < 0x80 or b > 0xBF then return false end
    end
    local b2 = string.byte(s, i + 1)
    if (c == 0xE0 and b2 < 0xA0) or (c == 0xED and b2 > 0x9F) or (c == 0xF0 and b2 < 0x90)
       or (c == 0xF4 and b2 > 0x8F) then return false end
    i = i + extra + 1
  end
  return true
end

local function as_step(body)
  if #body > 16384 or string.byte(body, 1) ~= 0x95 then return nil end
  local ok, f = pcall(cmsgpack.unpack, body)
  if not ok or type(f) ~= 'table' or #f ~= 5 then return nil end
  if type(f[1]) ~= 'string' or type(f[3]) ~= 'string' or f[3] == '' then return nil end
  if #f[1] > 1024 or not string.find(f[1], '^[A-Za-z0-9_.:@/%-]+$') or not utf8_ok(f[3]) then return nil end
  for _, k in ipairs({2, 4, 5}) do
    if type(f[k]) ~= 'number' or f[k] ~= math.floor(f[k]) or f[k] < 0 or f[k] >= 9007199254740992 then
      return nil
    end
  end
  if f[5] > 3 or cmsgpack.pack(f) ~= body then return nil end
  return f
end

local function take()
  for _ = 1, 8 do
    local rep = redis.pcall('XREADGROUP', 'GROUP', GROUP, TAKER, 'COUNT', 1, 'STREAMS', STREAM, '>')
    if type(rep) ~= 'table' or rep.err or not rep[1] then return false end
    local entry = rep[1][2][1]
    local id, fields = entry[1], entry[2]
    local body
    for k = 1, #fields - 1, 2 do
      if fields[k] == 'm' then body = fields[k + 1] end
    end
    if not body then return {id, ''} end
    local f = as_step(body)
    if not f then return {id, body} end  -- not a step message: the worker sets it aside
    local c = claim_step(P, f[1], body, string.format('%d', f[2]), string.format('%d', f[4]), f[3],
                         string.format('%d', f[5]), now, TAKE_LEASE, TAKE_TOKEN)
    if c then return {id, body, c} end
    redis.call('XACK', STREAM, GROUP, id)  -- stale: its step was committed or is leased
    redis.call('XDEL', STREAM, id)
  end
  return false
end
local dk = P..':d:'..t
local child = lease[4] ~= false
local i = 8
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('RPUSH', P..':s:'..t, unpack(ARGV, i, i + n - 1)) end
i = i + n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then
  redis.call('HSET', dk, unpack(ARGV, i, i + 2 * n - 1))
  if child then
    for j = 0, n - 1 do redis.call('SADD', P..':c:'..t, ARGV[i + 2 * j]) end
  end
end
i = i + 2 * n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then
  redis.call('HDEL', dk, unpack(ARGV, i, i + n - 1))
  if child then redis.call('SADD', P..':c:'..t, unpack(ARGV, i, i + n - 1)) end
end
i = i + n
redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'parked')
redis.call('ZREM', P..':leases', t)
redis.call('HSET', rk, 'updated', ARGV[4])
if ARGV[7] == '2' then redis.call('DEL', P..':j:'..t, P..':js:'..t, P..':ja:'..t, P..':jc:'..t) end
local kind = ARGV[i]; i = i + 1
local out = {}
if kind == 'advance' then
  -- frames, value, msg, seq, attempt, key, at
  redis.call('HSET', rk, 'status', 'running', 'frames', ARGV[i], 'value', ARGV[i + 1], 'seq', ARGV[i + 3],
             'attempt', ARGV[i + 4], 'key', ARGV[i + 5])
  local at = tonumber(ARGV[i + 6])
  if at > now then
    redis.call('ZADD', P..':timers', at, ARGV[i + 2])
  else
    emit(P, now, redispatch, ARGV[i + 2], out)
  end
elseif kind == 'wait' then
  -- call_type, init_pending
  redis.call('HSET', rk, 'status', 'waiting', 'waiting', ARGV[i], 'init_pending', ARGV[i + 1])
  if ARGV[i + 1] == '1' then
    local until_ = tostring(now + tonumber(lease[2]))
    redis.call('HSET', rk, 'lease_token', ARGV[3], 'lease_until', until_, 'lease_len', lease[2],
               'lease_msg', lease[3])
    redis.call('ZADD', P..':leases', until_, t)
  end
elseif kind == 'fork' then
  -- kind, join msg, join seq, join key, n, then per child: trace, frames, value, msg, key, index
  local jk = P..':j:'..t
  redis.call('DEL', jk, P..':js:'..t, P..':ja:'..t, P..':jc:'..t)
  local nchild = tonumber(ARGV[i + 4])
  redis.call('HSET', jk, 'kind', ARGV[i], 'n', ARGV[i + 4], 'msg', ARGV[i + 1], 'closed', '0')
  redis.call('HSET', rk, 'status', 'waiting', 'seq', ARGV[i + 2], 'attempt', '0', 'key', ARGV[i + 3])
  local data = redis.call('HGETALL', dk)
  local jseq = ARGV[i + 2]
  i = i + 5
  for c = 1, nchild do
    local ct = ARGV[i]
    local crk = P..':r:'..ct
    redis.call('DEL', unpack(run_keys(P, ct)))
    redis.call('HSET', crk, 'status', 'running', 'frames', ARGV[i + 1], 'value', ARGV[i + 2], 'seq', '0',
               'attempt', '0', 'key', ARGV[i + 4], 'created', ARGV[4], 'updated', ARGV[4], 'p_trace', t,
               'p_seq', jseq, 'p_index', ARGV[i + 5])
    if #data > 0 then redis.call('HSET', P..':d:'..ct, unpack(data)) end
    redis.call('ZADD', P..':runs', now, ct)
    redis.call('RPUSH', P..':jc:'..t, ct)
    emit(P, now, redispatch, ARGV[i + 3], out)
    i = i + 6
  end
elseif kind == 'finish' then
  redis.call('HSET', rk, 'status', 'done', 'result', ARGV[i])
  finished(P, t, rk, now, redispatch, ttl, out)
elseif kind == 'fail' then
  redis.call('HSET', rk, 'status', 'failed', 'error', ARGV[i])
  finished(P, t, rk, now, redispatch, ttl, out)
else
  return redis.error_reply('unknown transition ' .. kind)
end
local taken = false
if TAKER ~= '' and STREAM ~= '' then taken = take() end
return {out, taken}
"""
)

RESUME = (
    _EMIT
    + r"""
-- ARGV: P, trace, call_type, payload, failed, now, redispatch, seq ('' for any), stream
local P, t = ARGV[1], ARGV[2]
local rk = P..':r:'..t
local r = redis.call('HMGET', rk, 'status', 'waiting', 'seq', 'key')
if not r[1] then return {'missing'} end
if r[1] ~= 'waiting' or r[2] ~= ARGV[3] or (ARGV[8] ~= '' and ARGV[8] ~= r[3]) then
  local joining = redis.call('HGET', P..':j:'..t, 'closed') == '0'
  return {'not', r[1], r[2] or '', joining and '1' or '0'}
end
local seq = tonumber(r[3]) + 1
local kind = 1
if ARGV[5] == '1' then kind = 3 end
local msg = cmsgpack.pack({t, seq, r[4], 0, kind})
redis.call('HSET', rk, 'status', 'running', 'seq', tostring(seq), 'attempt', '0', 'value', ARGV[4],
           'updated', ARGV[6])
redis.call('HDEL', rk, 'waiting', 'init_pending', 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
redis.call('ZREM', P..':leases', t)
local out = {}
emit(P, tonumber(ARGV[6]), tonumber(ARGV[7]), msg, out)
return {'ok', out}
"""
)

INIT_DONE = r"""
-- ARGV: P, trace, seq
local rk = ARGV[1]..':r:'..ARGV[2]
local r = redis.call('HMGET', rk, 'seq', 'init_pending')
if r[1] == ARGV[3] and r[2] == '1' then
  redis.call('HSET', rk, 'init_pending', '0')
  redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
  redis.call('ZREM', ARGV[1]..':leases', ARGV[2])
end
return 1
"""

EXTEND = r"""
-- ARGV: P, now, lease, (trace, token)...
local P, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  local rk = P..':r:'..ARGV[i]
  if redis.call('HGET', rk, 'lease_token') == ARGV[i + 1] then
    local until_ = tostring(now + lease)
    redis.call('HSET', rk, 'lease_until', until_, 'lease_len', ARGV[3])
    redis.call('ZADD', P..':leases', until_, ARGV[i])
  end
end
return 1
"""

PARK = r"""
-- ARGV: P, trace, token, reason, now, msg, base, cap
local P, t = ARGV[1], ARGV[2]
local rk = P..':r:'..t
if redis.call('HGET', rk, 'lease_token') ~= ARGV[3] then return false end
redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
redis.call('ZREM', P..':leases', t)
redis.call('HSET', rk, 'parked', ARGV[4])
local count = redis.call('HINCRBY', rk, 'park_count', 1)
local attempt = redis.call('HINCRBY', rk, 'attempt', 1)
local f = cmsgpack.unpack(ARGV[6])
f[4] = attempt
local delay = math.min(tonumber(ARGV[8]), tonumber(ARGV[7]) * 2 ^ (count - 1))
redis.call('ZADD', P..':timers', tonumber(ARGV[5]) + delay, cmsgpack.pack(f))
return count
"""

DUE = (
    _EMIT
    + r"""
-- ARGV: P, now, limit, redispatch, stream
local P, now, limit, redispatch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':timers', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':timers', m)
  emit(P, now, redispatch, m, out)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':outbox', '-inf', now, 'LIMIT', 0, limit)) do
  local f = cmsgpack.unpack(m)
  local r = redis.call('HMGET', P..':r:'..f[1], 'seq', 'attempt')
  redis.call('ZREM', P..':outbox', m)
  if r[1] and tonumber(r[1]) == f[2] and tonumber(r[2]) == f[4] then
    emit(P, now, redispatch, m, out)  -- published and never claimed: publish again
  end
end
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P..':leases', '-inf', now, 'LIMIT', 0, limit)) do
  local rk = P..':r:'..t
  local r = redis.call('HMGET', rk, 'lease_until', 'lease_msg', 'attempt')
  redis.call('ZREM', P..':leases', t)
  if r[1] and tonumber(r[1]) > now then
    redis.call('ZADD', P..':leases', r[1], t)  -- renewed meanwhile: keep watching it
  elseif r[1] then
    local attempt = tonumber(r[3]) + 1
    local f = cmsgpack.unpack(r[2])
    f[4] = attempt
    redis.call('HSET', rk, 'attempt', tostring(attempt))
    redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
    emit(P, now, redispatch, cmsgpack.pack(f), out)
  end
end
local nxt = false
for _, z in ipairs({'timers', 'outbox', 'leases'}) do
  local first = redis.call('ZRANGE', P..':'..z, 0, 0, 'WITHSCORES')
  if first[2] and ((not nxt) or tonumber(first[2]) < nxt) then nxt = tonumber(first[2]) end
end
return {out, nxt and tostring(nxt) or false}
"""
)
