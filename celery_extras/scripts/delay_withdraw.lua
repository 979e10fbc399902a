-- Follows delay_parked.lua.
-- Take back a park no replica acknowledged (KEYS: due, meta, msg, parked; ARGV: id). Returns 1 when
-- the entry is gone (withdrawn, or never there), 0 when a mover claimed it or a worker took it
-- meanwhile: a copy may be published already, so the park stands. Withdrawn leaves no
-- tombstone, so parking the same message again later stores it anew.

local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 1 end
local ok, m = pcall(cjson.decode, raw)
if ok and type(m) == 'table' and (m.x or (type(m.c) == 'table' and #m.c > 0)) then
  return 0
end
if ok then count_down(m) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
