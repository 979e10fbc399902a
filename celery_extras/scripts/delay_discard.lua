-- Follows delay_parked.lua.
-- Drop an entry whatever its state (KEYS: due, meta, msg, released, parked; ARGV: id); it no
-- longer counts for its queue. Returns 1.
-- A script, not MULTI: one call on any Redis, Cluster included (redis-py 5's cluster client
-- has no transactions).

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local ok, m = pcall(cjson.decode, raw)
  if ok then count_down(m) end
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
