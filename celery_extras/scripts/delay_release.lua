-- Follows now_ms.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta. ARGV: id, token, recheck ms. Returns 1 when the release was recorded.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local ok, m = pcall(cjson.decode, raw)
if not ok or type(m) ~= 'table' or m.x or type(m.c) ~= 'table' or m.c[#m.c] ~= ARGV[2] then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
