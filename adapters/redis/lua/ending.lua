-- Fragment: ending runs before they finish (assembled after finish, before cancel and due).
-- ``end_runs`` ends run ``t`` with ``status`` ('cancelled', or 'timed_out' when its deadline
-- passed: due) and the error ``err`` (msgpack), and the zip/any branches its open join waits
-- for, and theirs: each gets the status and the error, its join is closed (so no branch
-- arrives at it), its timer goes, and ``finished`` drops its lease, its wait, its deadline and
-- its frames, tells its waiters, and hands the ended run to its own parent's join (where it
-- counts as failed). Queued messages of these runs are dropped when they come: the run no
-- longer expects them. A run whose compensations flag is 'held' runs them instead of ending,
-- one whose flag is 'running' is left as it is (see ``compensates`` in finish).

-- Whether ``status`` is that of a run still going.
local function going(status)
  return status == 'running' or status == 'waiting' or status == 'sleeping'
end

local function drop_timer(P, ct, due)
  -- the timer's entry: near its due time (the score went through a string), naming this run
  local at = tonumber(due)
  if not at then return end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', P..':timers', at - 0.001, at + 0.001)) do
    local ok, f = pcall(cmsgpack.unpack, m)
    if ok and type(f) == 'table' and f[1] == ct then redis.call('ZREM', P..':timers', m) end
  end
end

local function end_runs(P, t, status, err, now, redispatch, ttl, out)
  local todo = {t}
  local i = 1
  while i <= #todo do
    local ct = todo[i]
    i = i + 1
    local crk = P..':r:'..ct
    -- a run running its compensations goes on: a cancel (a second one, say) must not cut them short
    if compensations_of(P, ct, crk) ~= 'running' then
      local r = redis.call('HMGET', crk, 'due', 'ix', 'pipeline')
      if r[1] then drop_timer(P, ct, r[1]) end
      local comp = compensates(P, ct, crk, err, now, redispatch, out)  -- it runs its compensations first
      if not comp then
        redis.call('HSET', crk, 'status', status, 'error', err, 'updated', tostring(now))
        listed(P, ct, r[2], r[3], status)
      end
      local jk = P..':j:'..ct
      if redis.call('HGET', jk, 'closed') == '0' then
        redis.call('HSET', jk, 'closed', '1')
        for _, child in ipairs(redis.call('LRANGE', P..':jc:'..ct, 0, -1)) do
          if going(redis.call('HGET', P..':r:'..child, 'status')) then todo[#todo + 1] = child end
        end
      end
      if not comp then finished(P, ct, crk, now, redispatch, ttl, out, r[2] and r[3]) end
    end
  end
end
