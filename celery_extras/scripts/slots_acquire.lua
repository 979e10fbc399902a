-- Follows now_ms.lua and slots_prune.lua.
-- KEYS: holders, queue, tickets. ARGV: cap, holder, lease ms, worker, more (1: this worker
-- has more waiting after this one), ticket lease ms. Returns {taken 0/1, holders, retry ms}.
local cap, holder, lease = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local worker, more, tlease = ARGV[4], ARGV[5], tonumber(ARGV[6])
local held = redis.call('ZCARD', KEYS[1])
local function last(key)
  local tail = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if tail[2] and tonumber(tail[2]) >= now then return tonumber(tail[2]) + 1 end
  return now
end
local function keep(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl < ms then redis.call('PEXPIRE', key, ms) end
end
if redis.call('ZSCORE', KEYS[1], holder) then
  return {1, held, 0}
end
local rank = redis.call('ZRANK', KEYS[2], worker)
local ahead = rank or redis.call('ZCARD', KEYS[2])
if held < cap and ahead < cap - held then
  redis.call('ZADD', KEYS[1], now + lease, holder)
  keep(KEYS[1], lease + 1000)
  redis.call('ZREM', KEYS[2], worker)
  redis.call('ZREM', KEYS[3], worker)
  if more == '1' then
    redis.call('ZADD', KEYS[2], last(KEYS[2]), worker)
    redis.call('ZADD', KEYS[3], now + tlease, worker)
    keep(KEYS[2], tlease + 1000)
    keep(KEYS[3], tlease + 1000)
  end
  return {1, held + 1, 0}
end
if not rank then redis.call('ZADD', KEYS[2], last(KEYS[2]), worker) end
redis.call('ZADD', KEYS[3], now + tlease, worker)
keep(KEYS[2], tlease + 1000)
keep(KEYS[3], tlease + 1000)
local retry = lease
if held >= cap then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then retry = tonumber(first[2]) - now end
else
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then retry = tonumber(first[2]) - now end
end
if retry < 1 then retry = 1 end
return {0, held, retry}
