-- Fragment: claiming a step (assembled before claim and commit): check the message is the
-- run's expected transition and take its lease. Returns the claim packed (one msgpack array,
-- which codec.claimed unpacks: frames, value, init_only, the run's data as a flat list of
-- fields and values or false when left out (below), the join's slots or false, blobs, 1 when
-- the step has kept parts (its hash P:pt:<trace>:<seq>, parts.py) else 0, and the version of the
-- run's data (below)), false for a stale message
-- (its step was committed, or is another attempt, or the run is gone), or {'refused', why} for
-- one that names the current step but not as the run expects it (a forged kind, or a timer's
-- message before its time). A sleeping run that is claimed runs again (and is listed so).
-- A run's data has a version, ``dv|updated``: ``dv`` is the token of the claim whose commit wrote
-- the run last (of its create, at first), ``updated`` the time of that write, which the commits
-- of earlier releases also set. ``known``: the version of the run's data the worker holds
-- (data_cache.py; '' for none): the data is left out when it is the run's.
local function claim_step(P, t, msg, seq, attempt, key, kind, now, lease, token, known)
  local rk = P..':r:'..t
  local r = redis.call('HMGET', rk, 'status', 'seq', 'attempt', 'key', 'init_pending', 'lease_until', 'frames',
                       'value', 'kind', 'due', 'blobs', 'ix', 'pipeline', 'dv', 'updated')
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
  if r[1] == 'sleeping' then
    redis.call('HSET', rk, 'status', 'running')
    listed(P, t, r[12], r[13], 'running')
  end
  redis.call('ZADD', P..':leases', until_, t)
  local slots = false
  if kind == '2' then slots = redis.call('LRANGE', P..':js:'..t, 0, -1) end
  local parts_kept = redis.call('EXISTS', P..':pt:'..t..':'..seq)
  local version = (r[14] and r[14] .. '|' .. (r[15] or '')) or ''
  local data = false
  if known == '' or known ~= version then data = redis.call('HGETALL', P..':d:'..t) end
  return cmsgpack.pack({r[7] or '', r[8] or '', init_only, data, slots, r[11] or '', parts_kept, version})
end
