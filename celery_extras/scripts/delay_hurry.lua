-- Follows now_ms.lua.
-- KEYS: due, meta. ARGV: id. Makes a parked entry due now (a coalesced run waiting for its
-- key, whose run ended). Returns 1 when it is due now, 0 when it is unknown here, 2 when it
-- is on its way (claimed or taken: a mover published it already).

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local ok, m = pcall(cjson.decode, raw)
if not ok or type(m) ~= 'table' then return 0 end
if m.x or m.c then return 2 end
if (tonumber(m.d) or 0) > now then
  m.d = now
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(m))
  redis.call('ZADD', KEYS[1], 'XX', now, ARGV[1])
end
return 1
