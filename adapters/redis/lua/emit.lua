-- Fragment: dispatch of a step message (assembled before create, commit, resume and due:
-- see SCRIPTS in adapters/redis/scripts.py). With a stream (STREAM, which each script sets
-- from its ARGV), the message goes onto it in the same atomic step; without one it is kept
-- in the outbox and returned for the caller to publish.
local STREAM = ''
local function emit(P, now, redispatch, msg, out)
  if STREAM ~= '' then
    redis.call('XADD', STREAM, '*', 'm', msg)
  else
    redis.call('ZADD', P..':outbox', now + redispatch, msg)
    out[#out + 1] = msg
  end
end
