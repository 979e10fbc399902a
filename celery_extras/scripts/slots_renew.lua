-- Follows now_ms.lua.
-- KEYS: holders. ARGV: lease ms, holder ids... Returns the ids whose lease had run out.
local lease = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 and ttl < lease + 1000 then redis.call('PEXPIRE', KEYS[1], lease + 1000) end
return lost
