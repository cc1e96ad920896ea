-- Fragment: finishing runs (assembled after listed, emit and blobs, before create and commit).
-- ``finished`` clears a run that ended, hands its result to the join of its parent
-- (``arrive``), tells the processes waiting for it, and lets its keys expire after the ttl
-- (``pl``: the pipeline of a listed run, else false; see listed: a run with a business key
-- waits so that DUE takes it out of the key's index too, ``expiry_entry``).
local function run_keys(P, t)
  return {P..':r:'..t, P..':d:'..t, P..':s:'..t, P..':c:'..t, P..':j:'..t, P..':js:'..t, P..':ja:'..t,
          P..':jc:'..t, P..':e:'..t, P..':m:'..t}
end

local CANCELLED = cmsgpack.pack({type = 'dflow.Cancelled', step = '',
  message = 'cancelled: its zip/any join closed without it (a winner was found, or a branch failed)'})
local finished

-- The compensations flag of run ``t`` (field 'comp' of its hash: none, held or running, see
-- dflow.store.Compensations), which create and commit write. A run stored by a release before
-- the flag has none: it is derived from the run's data as that release did, from the field
-- 'dflow/compensating' (running) and the data fields 'dflow/saga/<its prefix>...' (held; see
-- dflow.store.saga_prefix: a branch's data starts as a copy of its parent's, whose entries are the
-- parent's).
local function compensations_of(P, t, rk)
  local flag = redis.call('HGET', rk, 'comp')
  if flag then return flag end
  local dk = P..':d:'..t
  if redis.call('HEXISTS', dk, 'dflow/compensating') == 1 then return 'running' end
  local pattern = 'dflow/saga/'
  for fork, index in string.gmatch(t, '/(%d+)%-(%d+)') do
    pattern = pattern .. string.format('%012d.%04d/', tonumber(fork), tonumber(index))
  end
  local cursor, found = '0', false
  repeat
    local rep = redis.call('HSCAN', dk, cursor, 'MATCH', pattern .. '*', 'COUNT', 256)
    cursor, found = rep[1], #rep[2] > 0
  until found or cursor == '0'
  if found then return 'held' end
  return 'none'
end

-- Whether run ``t`` runs its compensations already (its flag is 'running': then it is left as it
-- is) or holds some of its own ('held'); if so it does not end. What a run that starts them waits
-- for goes (its call, its lease; its timer's message and queued messages go stale) and its next
-- step is a FAIL message with the error ``err``, one seq on at its key, on which the worker that
-- takes it runs the compensations.
local function compensates(P, t, rk, err, now, redispatch, out)
  local flag = compensations_of(P, t, rk)
  if flag == 'running' then return true end  -- it runs them: let it
  if flag ~= 'held' then return false end
  local r = redis.call('HMGET', rk, 'seq', 'key', 'ix', 'pipeline')
  local seq = tonumber(r[1]) + 1
  redis.call('HSET', rk, 'status', 'running', 'seq', tostring(seq), 'attempt', '0', 'kind', '3', 'value', err,
             'updated', tostring(now))
  redis.call('HDEL', rk, 'waiting', 'init_pending', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'due',
             'parked')
  redis.call('ZREM', P..':leases', t)
  listed(P, t, r[3], r[4], 'running')
  emit(P, now, redispatch, cmsgpack.pack({t, seq, r[2], 0, 3}), out)
  return true
end

-- The processes following the run's step records (``watch_steps``) hear of each change.
local function tell_watchers(P, t)
  for _, channel in ipairs(redis.call('SMEMBERS', P..':e:'..t)) do redis.pcall('PUBLISH', channel, t) end
end


local function arrive(P, t, rk, now, redispatch, ttl, out)
  local link = redis.call('HMGET', rk, 'p_trace', 'p_seq', 'p_index', 'status', 'result', 'error')
  if not link[1] then return end
  local pt = link[1]
  local prk = P..':r:'..pt
  local pr = redis.call('HMGET', prk, 'seq', 'ix', 'pipeline')
  if pr[1] ~= link[2] then return end
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
    listed(P, pt, pr[2], pr[3], 'running')
    emit(P, now, redispatch, j[3], out)
    -- the other branches are no longer wanted
    for i, ct in ipairs(redis.call('LRANGE', P..':jc:'..pt, 0, -1)) do
      if redis.call('SISMEMBER', P..':ja:'..pt, tostring(i - 1)) == 0 then
        local crk = P..':r:'..ct
        local st = redis.call('HGET', crk, 'status')
        if (st == 'running' or st == 'waiting' or st == 'sleeping')
           and not compensates(P, ct, crk, CANCELLED, now, redispatch, out) then
          redis.call('HSET', crk, 'status', 'failed', 'error', CANCELLED, 'updated', tostring(now))
          finished(P, ct, crk, now, redispatch, ttl, out, false)
        end
      end
    end
  end
end

finished = function(P, t, rk, now, redispatch, ttl, out, pl)
  redis.call('HDEL', rk, 'frames', 'value', 'lease_token', 'lease_until', 'lease_len', 'lease_msg', 'waiting',
             'init_pending', 'parked', 'due')
  redis.call('ZREM', P..':leases', t)
  redis.call('ZREM', P..':deadlines', t)  -- (a run with a deadline that ended first leaves none behind)
  set_blobs(P, rk, '')
  arrive(P, t, rk, now, redispatch, ttl, out)
  local wk = P..':w:'..t
  -- pcall: a user without pub/sub rights (Redis 7 ACLs) must not break the commit; waiters poll.
  for _, channel in ipairs(redis.call('SMEMBERS', wk)) do redis.pcall('PUBLISH', channel, t) end
  redis.call('DEL', wk)
  tell_watchers(P, t)
  local bkey = redis.call('HGET', rk, 'bkey')  -- (its business key: see business_key)
  if ttl > 0 then
    for _, k in ipairs(run_keys(P, t)) do redis.call('PEXPIRE', k, ttl) end
    local set, member = expiry_entry(P, t, pl, bkey)
    redis.call('ZADD', set, now + ttl / 1000, member)
  else
    if bkey then redis.call('ZREM', P..':bk:'..bkey, t) end
    unlisted(P, t, pl)
    redis.call('DEL', unpack(run_keys(P, t)))
    redis.call('ZREM', P..':runs', t)
  end
end
