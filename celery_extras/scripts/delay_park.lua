-- Follows now_ms.lua.
-- Follows delay_parked.lua.
-- KEYS: due, meta, msg, parked. ARGV: id, delay ms, meta JSON, entry JSON. Returns 1 parked, 0
-- known. A new entry counts for the queue its meta's `q` names (delay_parked.lua).
-- A known entry's meta is written again, unchanged: every park then propagates a write, so a
-- `WAIT` after it covers the entry whichever connection first wrote it.

local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then
  redis.call('HSET', KEYS[2], ARGV[1], known)
  return 0
end
local m = cjson.decode(ARGV[3])
m.d = now + tonumber(ARGV[2])
m.c = nil
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[1], m.d, ARGV[1])
count_up(m.q)
return 1
