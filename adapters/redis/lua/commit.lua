-- COMMIT: the end of a step, atomically: check the lease, append the step records, apply the
-- data changes, take the run to its next transition, and (with a stream) acknowledge the
-- delivery and take the next message. Returns false when the lease is lost, {'need', refs}
-- for blobs not stored, {'exists', child} for a branch id taken (in those cases only the
-- delivery is acknowledged), else {'ok', messages to publish, taken, the version of the run's
-- data (claim_step)}.
--
-- ARGV, as scripts.COMMIT lays it out (a test holds this list to it), packed: the slots come
-- as one msgpack array in ARGV[1], which the preamble unpacks into ARGV (scripts.Script.packed):
--   ARGV[1]  prefix          P, before every key
--   ARGV[2]  trace           the run id
--   ARGV[3]  token           the claim's lease token
--   ARGV[4]  now             seconds
--   ARGV[5]  ttl_ms          how long a finished run is kept
--   ARGV[6]  redispatch      seconds before an unclaimed outbox message is published again
--   ARGV[7]  claim_kind      the kind of the claimed message (2: a join, whose state goes)
--   ARGV[8]  stream          the stream step messages go to ('' for the outbox)
--   ARGV[9]  group           its consumer group
--   ARGV[10] receipt         the delivery to acknowledge ('' for none)
--   ARGV[11] taker           the consumer to take the next message for ('' for none)
--   ARGV[12] take_token      the lease token and length of that claim
--   ARGV[13] take_lease
--   ARGV[14] blob_grace_ms   how long a blob no run references is kept
--   ARGV[15] blob_refs       the blobs the transition references (children's too), space-separated
--   ARGV[16] children        the ids of the branches it creates, space-separated
--   ARGV[17] transition      advance, wait, fork, finish or fail: what its fields are (below)
--   ARGV[18] compensations   the run's compensations flag from now: held or running ('' to leave it)
--   ARGV[19] lean_record     the first step record with its input left out ('' for none): kept in
--                            place of the full one when its input is the output of the list's last
--                            record (records.py)
--   ARGV[20] parts_seq       the step whose parts (P:pt:<trace>:<seq>, parts.py) go with the commit
--                            ('' for none: the run stays at the step, a retry, and keeps them)
--   ARGV[21] n_records       how many ARGV slots each part takes
--   ARGV[22] n_sets
--   ARGV[23] n_dels
--   ARGV[24] n_fields
--   ARGV[25..] records, sets, dels, fields   the parts, in this order: step records; (field,
--            value) pairs to set; fields to delete; the transition's fields
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- With a stream: the delivery ``receipt`` is acknowledged, and when ``taker`` is given the
-- next new message of the stream is read for that consumer and claimed (``take``).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, t = prefix, trace
STREAM, GRACE = stream, tonumber(blob_grace_ms)
if receipt ~= '' then
  redis.call('XACK', stream, group, receipt)
  redis.call('XDEL', stream, receipt)
end
local rk = P..':r:'..t
local lease = redis.call('HMGET', rk, 'lease_token', 'lease_len', 'lease_msg', 'p_trace', 'status', 'ix',
                         'pipeline', 'comp')
if lease[1] ~= token then return false end
-- Nothing is written before these checks pass.
local missing = {}
missing_blobs(P, blob_refs, missing)
if #missing > 0 then return {'need', missing} end
for ct in string.gmatch(children, '%S+') do
  if redis.call('EXISTS', P..':r:'..ct) == 1 then return {'exists', ct} end
end
local updated = now
local ttl
now, ttl, redispatch = tonumber(now), tonumber(ttl_ms), tonumber(redispatch)

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

-- A run id, as dflow.wire.ids.is_run_id: a user's id, then /seq-index for each level of branches.
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

local function take(version)
  for _ = 1, 8 do
    local rep = redis.pcall('XREADGROUP', 'GROUP', group, taker, 'COUNT', 1, 'STREAMS', stream, '>')
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
    -- the next step of this run: the worker knows its data (what it claimed, with the changes)
    local known = (f[1] == t and version) or ''
    local c = claim_step(P, f[1], body, string.format('%d', f[2]), string.format('%d', f[4]), f[3],
                         string.format('%d', f[5]), now, take_lease, take_token, known)
    if type(c) == 'table' then return {id, body} end  -- refused: the worker's own claim refuses it too
    if c then return {id, body, c} end  -- c: the claim, packed
    -- no such run here: it may be another bucket's (a message published under another key),
    -- so the worker claims it the usual way
    if redis.call('EXISTS', P..':r:'..f[1]) == 0 then return {id, body} end
    redis.call('XACK', stream, group, id)  -- stale: its step was committed or is leased
    redis.call('XDEL', stream, id)
  end
  return false
end
-- The position after the msgpack value at ``i`` of ``s``, for the types a packed step record
-- holds before its error (records.py; cmsgpack reads no bin): nil for any other.
local function skip(s, i)
  local c = string.byte(s, i)
  if not c then return nil end
  if c <= 0x7f or c >= 0xe0 or c == 0xc0 or c == 0xc2 or c == 0xc3 then return i + 1 end
  if c >= 0xa0 and c <= 0xbf then return i + 1 + c - 0xa0 end
  if c == 0xcc or c == 0xd0 then return i + 2 end
  if c == 0xcd or c == 0xd1 then return i + 3 end
  if c == 0xce or c == 0xd2 or c == 0xca then return i + 5 end
  if c == 0xcf or c == 0xd3 or c == 0xcb then return i + 9 end
  if c == 0xc4 or c == 0xd9 then return i + 2 + string.byte(s, i + 1) end
  if c == 0xc5 or c == 0xda then
    local a, b = string.byte(s, i + 1, i + 2)
    return i + 3 + a * 256 + b
  end
  if c == 0xc6 or c == 0xdb then
    local a, b, d, e = string.byte(s, i + 1, i + 4)
    return i + 5 + ((a * 256 + b) * 256 + d) * 256 + e
  end
  return nil
end

-- Field ``n`` of a packed step record (an array of 11) as packed, when it is bytes (bin), else nil.
local function packed_field(s, n)
  if string.byte(s, 1) ~= 0x9b then return nil end
  local i = 2
  for _ = 1, n - 1 do
    i = skip(s, i)
    if not i then return nil end
  end
  local c, j = string.byte(s, i), skip(s, i)
  if not j or c < 0xc4 or c > 0xc6 then return nil end
  return string.sub(s, i, j - 1)
end

local dk = P..':d:'..t
local child = lease[4] ~= false
if n_records > 0 then
  local sk = P..':s:'..t
  if lean_record ~= '' then  -- a value passed along is kept once: the record refers to the one before
    local last = redis.call('LINDEX', sk, -1)
    local output = last and packed_field(last, 9)
    if output and output == packed_field(ARGV[at_records], 8) then ARGV[at_records] = lean_record end
  end
  redis.call('RPUSH', sk, unpack(ARGV, at_records, at_records + n_records - 1))
end
tell_watchers(P, t)
if n_sets > 0 then
  redis.call('HSET', dk, unpack(ARGV, at_sets, at_sets + n_sets - 1))
  if child then
    for j = at_sets, at_sets + n_sets - 1, 2 do redis.call('SADD', P..':c:'..t, ARGV[j]) end
  end
end
if n_dels > 0 then
  redis.call('HDEL', dk, unpack(ARGV, at_dels, at_dels + n_dels - 1))
  if child then redis.call('SADD', P..':c:'..t, unpack(ARGV, at_dels, at_dels + n_dels - 1)) end
end
-- the flag only goes up: none, held, running (a run of an earlier release without one gets it now)
if compensations ~= '' and lease[8] ~= 'running' and lease[8] ~= compensations then
  redis.call('HSET', rk, 'comp', compensations)
end
redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'parked', 'due')
redis.call('ZREM', P..':leases', t)
redis.call('HSET', rk, 'updated', updated, 'dv', token)  -- a new version of its data (claim_step)
if claim_kind == '2' then redis.call('DEL', P..':j:'..t, P..':js:'..t, P..':ja:'..t, P..':jc:'..t) end
if parts_seq ~= '' then redis.call('DEL', P..':pt:'..t..':'..parts_seq) end
local out = {}
-- the run's status is now ``status``: a root run whose status changed moves in the listings
local function moved(status)
  if status ~= lease[5] then listed(P, t, lease[6], lease[7], status) end
end
local i = at_fields
if transition == 'advance' then
  local frames, value, msg, seq, attempt, key, at, msg_kind, blobs = unpack(ARGV, i, i + 8)
  local due = tonumber(at)
  local status = 'running'
  if due > now then status = 'sleeping' end
  redis.call('HSET', rk, 'status', status, 'frames', frames, 'value', value, 'seq', seq, 'attempt', attempt,
             'key', key, 'kind', msg_kind)
  if blobs ~= '=' then set_blobs(P, rk, blobs) end  -- '=': the same blobs as before
  if due > now then
    redis.call('ZADD', P..':timers', due, msg)
    redis.call('HSET', rk, 'due', at)
  else
    emit(P, now, redispatch, msg, out)
  end
  moved(status)
elseif transition == 'wait' then
  local call_type, init_pending = unpack(ARGV, i, i + 1)
  local early = take_mail(P, t, call_type)
  if early then  -- the call came first (mailbox.lua): the run goes on with it, as RESUME does
    local r = redis.call('HMGET', rk, 'seq', 'key')
    local next_seq, kind = tonumber(r[1]) + 1, 1
    if early[3] == '1' then kind = 3 end
    redis.call('HSET', rk, 'status', 'running', 'seq', tostring(next_seq), 'attempt', '0', 'kind', tostring(kind),
               'value', early[2])
    moved('running')
    emit(P, now, redispatch, cmsgpack.pack({t, next_seq, r[2], 0, kind}), out)
  else
    redis.call('HSET', rk, 'status', 'waiting', 'waiting', call_type, 'init_pending', init_pending)
    moved('waiting')
    if init_pending == '1' then
      local until_ = tostring(now + tonumber(lease[2]))
      redis.call('HSET', rk, 'lease_token', token, 'lease_until', until_, 'lease_len', lease[2],
                 'lease_msg', lease[3])
      redis.call('ZADD', P..':leases', until_, t)
    end
  end
elseif transition == 'fork' then
  local join_kind, join_msg, join_seq, join_key, n, frames, blobs = unpack(ARGV, i, i + 6)
  local jk = P..':j:'..t
  redis.call('DEL', jk, P..':js:'..t, P..':ja:'..t, P..':jc:'..t)
  redis.call('HSET', jk, 'kind', join_kind, 'n', n, 'msg', join_msg, 'closed', '0')
  redis.call('HSET', rk, 'status', 'waiting', 'seq', join_seq, 'attempt', '0', 'key', join_key, 'kind', '2')
  moved('waiting')
  if frames ~= '' then  -- the run moved to the zip/any (a flat_map that returned it forks at once)
    redis.call('HSET', rk, 'frames', frames)
    if blobs ~= '=' then set_blobs(P, rk, blobs) end
  end
  local data = redis.call('HGETALL', dk)
  i = i + 7
  for _ = 1, tonumber(n) do
    local ct, c_frames, c_value, c_msg, c_key, c_index, c_blobs = unpack(ARGV, i, i + 6)
    local crk = P..':r:'..ct
    redis.call('HSET', crk, 'status', 'running', 'frames', c_frames, 'value', c_value, 'seq', '0',
               'attempt', '0', 'key', c_key, 'kind', '0', 'created', updated, 'updated', updated,
               'p_trace', t, 'p_seq', join_seq, 'p_index', c_index, 'comp', 'none', 'dv', token .. '/' .. ct)
    set_blobs(P, crk, c_blobs)
    if #data > 0 then redis.call('HSET', P..':d:'..ct, unpack(data)) end
    redis.call('ZADD', P..':runs', now, ct)
    redis.call('ZREM', P..':expiry', ct)
    redis.call('RPUSH', P..':jc:'..t, ct)
    emit(P, now, redispatch, c_msg, out)
    i = i + 7
  end
elseif transition == 'finish' then
  redis.call('HSET', rk, 'status', 'done', 'result', ARGV[i])
  moved('done')
  finished(P, t, rk, now, redispatch, ttl, out, lease[6] and lease[7])
elseif transition == 'fail' then
  local err, outcome = unpack(ARGV, i, i + 1)
  local ended = 'failed'
  if outcome == 'compensated' then ended = 'compensated' end
  redis.call('HSET', rk, 'status', ended, 'error', err)
  moved(ended)
  finished(P, t, rk, now, redispatch, ttl, out, lease[6] and lease[7])
else
  return redis.error_reply('unknown transition ' .. transition)
end
-- the version of the run's data now (claim_step), which the worker keeps with its data
local v = redis.call('HMGET', rk, 'dv', 'updated')
local version = (v[1] and v[1] .. '|' .. (v[2] or '')) or ''
local taken = false
if taker ~= '' and stream ~= '' then taken = take(version) end
return {'ok', out, taken, version}
