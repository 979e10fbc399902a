-- Follows now_ms.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta, released. ARGV: recheck ms, then id and token of each claim published.
-- Returns how many releases were recorded (a claim whose token is no longer the entry's last,
-- or whose entry was taken meanwhile, is not).

local recheck = now + tonumber(ARGV[1])
local released = 0
for i = 2, #ARGV - 1, 2 do
  local id = ARGV[i]
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local ok, m = pcall(cjson.decode, raw)
    if ok and type(m) == 'table' and not m.x and type(m.c) == 'table' and m.c[#m.c] == ARGV[i + 1] then
      redis.call('ZADD', KEYS[1], 'XX', recheck, id)
      redis.call('ZADD', KEYS[3], now, id)
      released = released + 1
    end
  end
end
return released
