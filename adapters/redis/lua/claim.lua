-- CLAIM: check a step message is the run's expected transition and take its lease (see
-- claim_step). Returns the claim, false for a stale message, or {'refused', why}.
--
-- ARGV, as _scripts.CLAIM lays it out (a test holds this list to it):
--   ARGV[1]  prefix    P, before every key
--   ARGV[2]  trace     the run id
--   ARGV[3]  msg       the message as received
--   ARGV[4]  seq       its seq, attempt, key and kind
--   ARGV[5]  attempt
--   ARGV[6]  key
--   ARGV[7]  kind
--   ARGV[8]  now       seconds
--   ARGV[9]  lease     seconds
--   ARGV[10] token     the lease's token
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: _scripts).
return claim_step(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9],
                  ARGV[10])
