-- Fragment: a run's mailbox, the calls that came before the run waited for them
-- (dflow.mailbox). ``P:m:<trace>`` is a list, oldest first, of msgpack arrays
-- {call type, payload, failed ('1' or '0')}; it expires with the run (finish.lua's run_keys).
-- The run's hash counts them in its field 'mail' (for inspection: RunInfo.extra['early_calls']).

-- Keep a call in run ``t``'s mailbox within the bounds ``per_run`` and ``per_type``: nil when
-- kept, else {'full', calls held, calls of ``call_type`` held} (nothing written).
local function keep_mail(P, t, call_type, payload, failed, per_run, per_type)
  local mk = P..':m:'..t
  local held = redis.call('LRANGE', mk, 0, -1)
  local of_type = 0
  for _, e in ipairs(held) do
    if cmsgpack.unpack(e)[1] == call_type then of_type = of_type + 1 end
  end
  if of_type >= per_type or #held >= per_run then return {'full', #held, of_type} end
  redis.call('RPUSH', mk, cmsgpack.pack({call_type, payload, failed}))
  redis.call('HINCRBY', P..':r:'..t, 'mail', 1)
  return nil
end

-- Take the oldest call of ``call_type`` out of run ``t``'s mailbox: {call type, payload,
-- failed}, or nil when it holds none (one EXISTS for a run without a mailbox).
local function take_mail(P, t, call_type)
  local mk = P..':m:'..t
  if redis.call('EXISTS', mk) == 0 then return nil end
  for _, e in ipairs(redis.call('LRANGE', mk, 0, -1)) do
    local f = cmsgpack.unpack(e)
    if f[1] == call_type then
      redis.call('LREM', mk, 1, e)  -- the first entry equal to it: this one, or one just like it
      local rk = P..':r:'..t
      if redis.call('HINCRBY', rk, 'mail', -1) <= 0 then redis.call('HDEL', rk, 'mail') end
      return f
    end
  end
  return nil
end
