"""Lua scripts of the Redis store: each store operation is one atomic script.

Keys, under a prefix P: ``P:r:<trace>`` run hash, ``P:d:<trace>`` data hash, ``P:s:<trace>``
step records (list), ``P:c:<trace>`` keys a branch run changed (set), ``P:j:<trace>`` join
state, ``P:js:<trace>`` branch results in arrival order, ``P:ja:<trace>`` arrived branch
indexes, ``P:jc:<trace>`` branch run ids, ``P:w:<trace>`` channels of processes waiting for
the run to finish; global sorted sets ``P:outbox`` (published, not yet claimed),
``P:timers``, ``P:leases``, ``P:runs`` (by creation) and ``P:expiry`` (finished runs, by the
time their keys expire: ``DUE`` takes them out of ``P:runs`` then); ``P:b:<ref>`` signed
flow blobs and ``P:bn:<ref>`` how many live runs reference each (a blob no run references
expires after the blob grace). With a stream (``dispatch_via``), step messages go onto it
inside the scripts and the outbox is not used.

A run records the transition it expects next: ``seq``, ``attempt``, ``key``, ``kind`` (what
the message must say: run, continue, join or fail) and ``due`` (a timer's time). A message
that names the current step with another kind, or comes before its time, is refused: a
stream writer without the secret cannot skip a step, fail a run or end a wait early.

Messages are msgpack arrays [trace, seq, key, attempt, kind]; scripts build them with cmsgpack.
Each script's arguments are laid out in a fixed header followed by its variable parts; the
Python side builds them in ``_store.py`` (the functions named after each script).
"""

from __future__ import annotations

# Dispatch of a step message. With a stream (STREAM, set by each script from its header),
# the message goes onto it in the same atomic step; without one it is kept in the outbox
# and returned for the caller to publish.
_EMIT = r"""
local STREAM = ''
local function emit(P, now, redispatch, msg, out)
  if STREAM ~= '' then
    redis.call('XADD', STREAM, '*', 'm', msg)
  else
    redis.call('ZADD', P..':outbox', now + redispatch, msg)
    out[#out + 1] = msg
  end
end
"""

# Blobs live while a live run references them: a run records the blobs of its frames, each
# blob counts its runs, and one that no run references expires after GRACE milliseconds.
_BLOBS = r"""
local GRACE = 3600000
local function set_blobs(P, rk, new)
  local old = redis.call('HGET', rk, 'blobs') or ''
  if old == new then return end
  local had, has = {}, {}
  for r in string.gmatch(old, '%S+') do had[r] = true end
  for r in string.gmatch(new, '%S+') do
    has[r] = true
    if not had[r] and redis.call('INCR', P..':bn:'..r) == 1 then redis.call('PERSIST', P..':b:'..r) end
  end
  for r in pairs(had) do
    if not has[r] and redis.call('DECR', P..':bn:'..r) <= 0 then
      redis.call('DEL', P..':bn:'..r)
      redis.call('PEXPIRE', P..':b:'..r, GRACE)
    end
  end
  if new == '' then redis.call('HDEL', rk, 'blobs') else redis.call('HSET', rk, 'blobs', new) end
end

-- The blobs of ``refs`` (space-separated) that are not stored: the caller sends them.
local function missing_blobs(P, refs, missing)
  for r in string.gmatch(refs, '%S+') do
    if redis.call('EXISTS', P..':b:'..r) == 0 then missing[#missing + 1] = r end
  end
end
"""

# Shared helpers, prepended to the scripts that finish runs.
_FINISH = _EMIT + _BLOBS + r"""
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
        if st == 'running' or st == 'waiting' or st == 'sleeping' then
          redis.call('HSET', crk, 'status', 'failed', 'error', CANCELLED, 'updated', tostring(now))
          finished(P, ct, crk, now, redispatch, ttl, out)
        end
      end
    end
  end
end

finished = function(P, t, rk, now, redispatch, ttl, out)
  redis.call('HDEL', rk, 'frames', 'value', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'waiting',
             'init_pending', 'parked', 'due')
  redis.call('ZREM', P..':leases', t)
  set_blobs(P, rk, '')
  arrive(P, t, rk, now, redispatch, ttl, out)
  local wk = P..':w:'..t
  -- pcall: a user without pub/sub rights (Redis 7 ACLs) must not break the commit; waiters poll.
  for _, channel in ipairs(redis.call('SMEMBERS', wk)) do redis.pcall('PUBLISH', channel, t) end
  redis.call('DEL', wk)
  if ttl > 0 then
    for _, k in ipairs(run_keys(P, t)) do redis.call('PEXPIRE', k, ttl) end
    redis.call('ZADD', P..':expiry', now + ttl / 1000, t)
  else
    redis.call('DEL', unpack(run_keys(P, t)))
    redis.call('ZREM', P..':runs', t)
  end
end
"""

CREATE = (
    _FINISH
    + r"""
-- ARGV header: 1 P, 2 trace, 3 now, 4 redispatch, 5 ttl_ms, 6 stream, 7 blob grace ms, 8 blobs, 9 frames,
--   10 value, 11 msg ('' for a run finished at creation), 12 seq, 13 key, 14 kind, 15 result,
--   16 parent trace, 17 parent seq, 18 parent index, then: n_records, records..., n_data, (field, value)...
local P, t = ARGV[1], ARGV[2]
STREAM, GRACE = ARGV[6], tonumber(ARGV[7])
local rk = P..':r:'..t
if redis.call('EXISTS', rk) == 1 then return false end
local missing = {}
missing_blobs(P, ARGV[8], missing)
if #missing > 0 then return {'need', missing} end
local now, redispatch, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('HSET', rk, 'frames', ARGV[9], 'value', ARGV[10], 'seq', ARGV[12], 'attempt', '0', 'key', ARGV[13],
           'kind', ARGV[14], 'created', ARGV[3], 'updated', ARGV[3])
set_blobs(P, rk, ARGV[8])
if ARGV[16] ~= '' then
  redis.call('HSET', rk, 'p_trace', ARGV[16], 'p_seq', ARGV[17], 'p_index', ARGV[18])
end
local i = 19
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('RPUSH', P..':s:'..t, unpack(ARGV, i, i + n - 1)) end
i = i + n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('HSET', P..':d:'..t, unpack(ARGV, i, i + 2 * n - 1)) end
redis.call('ZADD', P..':runs', now, t)
redis.call('ZREM', P..':expiry', t)
local out = {}
if ARGV[11] ~= '' then
  redis.call('HSET', rk, 'status', 'running')
  emit(P, now, redispatch, ARGV[11], out)
else
  redis.call('HSET', rk, 'status', 'done', 'result', ARGV[15])
  finished(P, t, rk, now, redispatch, ttl, out)
end
return {'ok', out}
"""
)

# Claiming a step: check the message is the run's expected transition and take its lease.
# Returns the claim, false for a stale message (its step was committed, or is another
# attempt, or the run is gone), or {'refused', why} for one that names the current step
# but not as the run expects it (a forged kind, or a timer's message before its time).
_CLAIM_STEP = r"""
local function claim_step(P, t, msg, seq, attempt, key, kind, now, lease, token)
  local rk = P..':r:'..t
  local r = redis.call('HMGET', rk, 'status', 'seq', 'attempt', 'key', 'init_pending', 'lease_until', 'frames',
                       'value', 'kind', 'due', 'blobs')
  if not r[1] then return false end
  if r[2] ~= seq or r[3] ~= attempt or r[4] ~= key then return false end
  if r[9] and r[9] ~= kind then
    return {'refused', 'its kind (' .. kind .. ') is not the one the run expects (' .. r[9] .. ')'}
  end
  if r[10] and tonumber(r[10]) > now then
    redis.call('ZADD', P..':timers', r[10], msg)  -- the step's own timer stays armed
    return {'refused', 'it came before its due time'}
  end
  local init_only = 0
  if r[1] == 'waiting' and r[5] == '1' and kind == '0' then
    init_only = 1
  elseif r[1] ~= 'running' and r[1] ~= 'sleeping' then
    return false
  end
  if r[6] and tonumber(r[6]) > now then return false end
  redis.call('ZREM', P..':outbox', msg)
  local until_ = tostring(now + tonumber(lease))  -- one rounding for the record and the index
  redis.call('HSET', rk, 'lease_token', token, 'lease_until', until_, 'lease_len', lease, 'lease_msg', msg)
  if r[1] == 'sleeping' then redis.call('HSET', rk, 'status', 'running') end
  redis.call('ZADD', P..':leases', until_, t)
  local slots = false
  if kind == '2' then slots = redis.call('LRANGE', P..':js:'..t, 0, -1) end
  return {r[7] or '', r[8] or '', init_only, redis.call('HGETALL', P..':d:'..t), slots, r[11] or ''}
end
"""

CLAIM = (
    _CLAIM_STEP
    + r"""
-- ARGV: 1 P, 2 trace, 3 msg, 4 seq, 5 attempt, 6 key, 7 kind, 8 now, 9 lease, 10 token
return claim_step(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9],
                  ARGV[10])
"""
)

COMMIT = (
    _FINISH
    + _CLAIM_STEP
    + r"""
-- ARGV header: 1 P, 2 trace, 3 token, 4 now, 5 ttl_ms, 6 redispatch, 7 claim kind, 8 stream, 9 group,
--   10 receipt, 11 taker, 12 take token, 13 take lease, 14 blob grace ms, 15 blobs the transition
--   references (all of its frames, children included), 16 ids of the children it creates,
--   then: n_rec, rec..., n_set, (k, v)..., n_del, k..., transition, its fields...
-- With a stream: the delivery ``receipt`` is acknowledged, and when ``taker`` is given the
-- next new message of the stream is read for that consumer and claimed (``take``).
local P, t = ARGV[1], ARGV[2]
STREAM, GRACE = ARGV[8], tonumber(ARGV[14])
local GROUP, RECEIPT, TAKER, TAKE_TOKEN, TAKE_LEASE = ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]
if RECEIPT ~= '' then
  redis.call('XACK', STREAM, GROUP, RECEIPT)
  redis.call('XDEL', STREAM, RECEIPT)
end
local rk = P..':r:'..t
local lease = redis.call('HMGET', rk, 'lease_token', 'lease_len', 'lease_msg', 'p_trace')
if lease[1] ~= ARGV[3] then return false end
-- Nothing is written before these checks pass.
local missing = {}
missing_blobs(P, ARGV[15], missing)
if #missing > 0 then return {'need', missing} end
for ct in string.gmatch(ARGV[16], '%S+') do
  if redis.call('EXISTS', P..':r:'..ct) == 1 then return {'exists', ct} end
end
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

-- A run id, as dflow._ids.is_run_id: a user's id, then /seq-index for each level of branches.
local function run_id_ok(s)
  if #s > 1024 then return false end
  local head, rest = string.match(s, '^([A-Za-z0-9_.:@%-]+)(.*)$')
  if not head or #head > 128 then return false end
  while rest ~= '' do
    local tail = string.match(rest, '^/%d+%-%d+(.*)$')
    if not tail then return false end
    rest = tail
  end
  return true
end

local function as_step(body)
  if #body > 16384 or string.byte(body, 1) ~= 0x95 then return nil end
  local ok, f = pcall(cmsgpack.unpack, body)
  if not ok or type(f) ~= 'table' or #f ~= 5 then return nil end
  if type(f[1]) ~= 'string' or type(f[3]) ~= 'string' or f[3] == '' then return nil end
  if not run_id_ok(f[1]) or not utf8_ok(f[3]) then return nil end
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
    if c and c[1] == 'refused' then return {id, body} end  -- the worker's own claim refuses it too
    if c then return {id, body, c} end
    redis.call('XACK', STREAM, GROUP, id)  -- stale: its step was committed or is leased
    redis.call('XDEL', STREAM, id)
  end
  return false
end
local dk = P..':d:'..t
local child = lease[4] ~= false
local i = 17
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
redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'parked', 'due')
redis.call('ZREM', P..':leases', t)
redis.call('HSET', rk, 'updated', ARGV[4])
if ARGV[7] == '2' then redis.call('DEL', P..':j:'..t, P..':js:'..t, P..':ja:'..t, P..':jc:'..t) end
local kind = ARGV[i]; i = i + 1
local out = {}
if kind == 'advance' then
  -- frames, value, msg, seq, attempt, key, at, message kind, blobs ('=' when unchanged)
  redis.call('HSET', rk, 'status', 'running', 'frames', ARGV[i], 'value', ARGV[i + 1], 'seq', ARGV[i + 3],
             'attempt', ARGV[i + 4], 'key', ARGV[i + 5], 'kind', ARGV[i + 7])
  if ARGV[i + 8] ~= '=' then set_blobs(P, rk, ARGV[i + 8]) end  -- '=': the same blobs as before
  local at = tonumber(ARGV[i + 6])
  if at > now then
    redis.call('ZADD', P..':timers', at, ARGV[i + 2])
    redis.call('HSET', rk, 'status', 'sleeping', 'due', ARGV[i + 6])
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
  -- kind, join msg, join seq, join key, n, then per child: trace, frames, value, msg, key, index, blobs
  local jk = P..':j:'..t
  redis.call('DEL', jk, P..':js:'..t, P..':ja:'..t, P..':jc:'..t)
  local nchild = tonumber(ARGV[i + 4])
  redis.call('HSET', jk, 'kind', ARGV[i], 'n', ARGV[i + 4], 'msg', ARGV[i + 1], 'closed', '0')
  redis.call('HSET', rk, 'status', 'waiting', 'seq', ARGV[i + 2], 'attempt', '0', 'key', ARGV[i + 3], 'kind', '2')
  local data = redis.call('HGETALL', dk)
  local jseq = ARGV[i + 2]
  i = i + 5
  for c = 1, nchild do
    local ct = ARGV[i]
    local crk = P..':r:'..ct
    redis.call('HSET', crk, 'status', 'running', 'frames', ARGV[i + 1], 'value', ARGV[i + 2], 'seq', '0',
               'attempt', '0', 'key', ARGV[i + 4], 'kind', '0', 'created', ARGV[4], 'updated', ARGV[4],
               'p_trace', t, 'p_seq', jseq, 'p_index', ARGV[i + 5])
    set_blobs(P, crk, ARGV[i + 6])
    if #data > 0 then redis.call('HSET', P..':d:'..ct, unpack(data)) end
    redis.call('ZADD', P..':runs', now, ct)
    redis.call('ZREM', P..':expiry', ct)
    redis.call('RPUSH', P..':jc:'..t, ct)
    emit(P, now, redispatch, ARGV[i + 3], out)
    i = i + 7
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
return {'ok', out, taken}
"""
)

RESUME = (
    _EMIT
    + r"""
-- ARGV: 1 P, 2 trace, 3 call_type, 4 payload, 5 failed, 6 now, 7 redispatch, 8 seq ('' for any), 9 stream
local P, t = ARGV[1], ARGV[2]
STREAM = ARGV[9]
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
redis.call('HSET', rk, 'status', 'running', 'seq', tostring(seq), 'attempt', '0', 'kind', tostring(kind),
           'value', ARGV[4], 'updated', ARGV[6])
redis.call('HDEL', rk, 'waiting', 'init_pending', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'due')
redis.call('ZREM', P..':leases', t)
local out = {}
emit(P, tonumber(ARGV[6]), tonumber(ARGV[7]), msg, out)
return {'ok', out}
"""
)

INIT_DONE = r"""
-- ARGV: 1 P, 2 trace, 3 seq
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
-- ARGV: 1 P, 2 now, 3 lease, then (trace, token)...
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
-- ARGV: 1 P, 2 trace, 3 token, 4 reason, 5 now, 6 msg, 7 base, 8 cap
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
local at = tonumber(ARGV[5]) + math.min(tonumber(ARGV[8]), tonumber(ARGV[7]) * 2 ^ (count - 1))
redis.call('ZADD', P..':timers', at, cmsgpack.pack(f))
redis.call('HSET', rk, 'due', tostring(at))
return count
"""

DUE = (
    _EMIT
    + r"""
-- ARGV: 1 P, 2 now, 3 limit, 4 redispatch, 5 stream
-- Entries that cannot be read (written by hand, or by another program) are dropped and
-- counted, never allowed to stall the timers of every worker.
local P, now, limit, redispatch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
STREAM = ARGV[5]
local out = {}
local bad = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':timers', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':timers', m)
  emit(P, now, redispatch, m, out)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':outbox', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':outbox', m)
  local ok, f = pcall(cmsgpack.unpack, m)
  if ok and type(f) == 'table' and type(f[1]) == 'string' then
    local r = redis.call('HMGET', P..':r:'..f[1], 'seq', 'attempt')
    if r[1] and tonumber(r[1]) == f[2] and tonumber(r[2]) == f[4] then
      emit(P, now, redispatch, m, out)  -- published and never claimed: publish again
    end
  else
    bad = bad + 1
  end
end
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
-- finished runs whose keys expired leave the runs index
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P..':expiry', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P..':expiry', t)
  local left = redis.call('PTTL', P..':r:'..t)
  if left == -2 then
    redis.call('ZREM', P..':runs', t)  -- gone
  elseif left >= 0 then
    redis.call('ZADD', P..':expiry', now + left / 1000 + 1, t)  -- not yet (our clock runs ahead)
  end  -- no expiry at all: started again under this id, it stays listed
end
local nxt = false
for _, z in ipairs({'timers', 'outbox', 'leases', 'expiry'}) do
  local first = redis.call('ZRANGE', P..':'..z, 0, 0, 'WITHSCORES')
  if first[2] and ((not nxt) or tonumber(first[2]) < nxt) then nxt = tonumber(first[2]) end
end
return {out, nxt and tostring(nxt) or false, bad}
"""
)
