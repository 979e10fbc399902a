-- Follows now_ms.lua.
-- KEYS: queue, tickets. ARGV: ticket lease ms, worker, leave (1: drop the ticket).
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) + 1000)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[1]) + 1000)
  return 1
end
return 0
