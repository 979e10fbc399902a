-- Follows now_ms.lua. KEYS: holders, queue, tickets. Drops the holders past their lease
-- and the dead tickets. The prefix of slots_acquire.lua and slots_release.lua.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
