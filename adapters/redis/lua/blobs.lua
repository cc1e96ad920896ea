-- Fragment: blob counting (assembled before create and commit). Blobs live while a live run
-- references them: a run records the blobs of its frames, each blob counts its runs, and one
-- that no run references expires after GRACE milliseconds (each script sets GRACE from its ARGV).
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
