-- Follows now_ms.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta, msg, taken. ARGV: lead ms, lease ms, tombstone ttl ms, max tokens, tokens...
-- Returns {next due in ms or -1 when empty, id, token, attempt, raw, due in ms, ...}.

local lead, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_tokens = tonumber(ARGV[4])
local limit = #ARGV - 4
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + lead, 'LIMIT', 0, limit)
local n = 0
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  local msg = redis.call('HGET', KEYS[3], id)
  local ok, m = false, nil
  if raw then ok, m = pcall(cjson.decode, raw) end
  if not ok or type(m) ~= 'table' or m.x or not msg then
    redis.call('ZREM', KEYS[1], id)
    if not (ok and type(m) == 'table' and m.x) then
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
    end
  else
    n = n + 1
    local token = ARGV[4 + n]
    local tokens = m.c or {}
    table.insert(tokens, token)
    while #tokens > max_tokens do table.remove(tokens, 1) end
    m.c = tokens
    redis.call('HSET', KEYS[2], id, cjson.encode(m))
    redis.call('ZADD', KEYS[1], now + lease, id)
    local due = tonumber(m.d) or now
    table.insert(out, id)
    table.insert(out, token)
    table.insert(out, #tokens)
    table.insert(out, msg)
    table.insert(out, due - now)
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 200)
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[2], id)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_in = -1
if first[2] then next_in = math.max(0, tonumber(first[2]) - now) end
table.insert(out, 1, next_in)
return out
