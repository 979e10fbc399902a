-- Follows now_ms.lua and delay_parked.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta, msg, taken, released, parked. ARGV: id, task id, token.
-- Returns {status, due in ms, kind}: status 0 unknown, 1 taken, 2 redelivered, 3 duplicate,
-- 4 purged (a copy of an entry dropped by `celery purge` or `extras delayed --drop`).

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return {0, 0, ''} end
local ok, m = pcall(cjson.decode, raw)
if not ok or type(m) ~= 'table' or m.t ~= ARGV[2] or type(m.c) ~= 'table' then
  return {0, 0, ''}
end
local issued = false
for _, token in ipairs(m.c) do if token == ARGV[3] then issued = true end end
if not issued then return {0, 0, ''} end
local due_in = (tonumber(m.d) or now) - now
local kind = tostring(m.k or '')
if m.x then
  if m.x == ARGV[3] then return {2, due_in, kind} end
  if m.x == '!purged' then return {4, due_in, kind} end
  return {3, due_in, kind}
end
m.x = ARGV[3]
count_down(m)
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return {1, due_in, kind}
