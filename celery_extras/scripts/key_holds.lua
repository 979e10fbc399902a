-- Follows now_ms.lua; followed by coalesce.lua or debounce.lua: what both keep of a key in
-- the hash KEYS[1] (see those scripts): its holds, its orphans (o), the ids each run covers
-- (the list KEYS[1]..':c:'..<run id>, and field b:<id> naming the covering run) and the
-- ending contexts of covered ids (the hash KEYS[1]..':x').
-- ARGV[1] is the operation, ARGV[2] the message id, ARGV[3] the holder.

local h = KEYS[1]
local x = h .. ':x'
local op, mid, holder = ARGV[1], ARGV[2], ARGV[3]
local DAY = 86400000
local MAX_CONTEXT = 131072

-- A field that is not what this script wrote (garbage, a foreign write) reads as absent,
-- so a damaged key heals at its next write instead of failing every call.
local function get(field)
  local raw = redis.call('HGET', h, field)
  if not raw then return nil end
  local ok, v = pcall(cjson.decode, raw)
  if ok and type(v) == 'table' then return v end
  return nil
end
-- A hold ({id, h (holder), u (lease end ms), e (its delay-store entry, when parked)} and
-- the *numbers* its policy keeps, 0 when absent), or nil.
local function held(field, numbers)
  local v = get(field)
  if not v or type(v.id) ~= 'string' or type(v.u) ~= 'number' then return nil end
  if type(v.h) ~= 'string' then v.h = '' end
  for _, n in ipairs(numbers) do
    if type(v[n]) ~= 'number' then v[n] = 0 end
  end
  if type(v.e) ~= 'string' then v.e = nil end
  return v
end
local function put(field, v)
  if v then redis.call('HSET', h, field, cjson.encode(v)) else redis.call('HDEL', h, field) end
end
local orphans = {}
for _, one in ipairs(get('o') or {}) do
  if type(one) == 'string' then table.insert(orphans, one) end
end
local function orphaned(id)
  for i, o in ipairs(orphans) do if o == id then return i end end
  return nil
end
-- The ids *id* covers, forgotten here (its list and their b: fields).
local function release(id)
  local list = h .. ':c:' .. id
  local ids = redis.call('LRANGE', list, 0, -1)
  redis.call('DEL', list)
  for _, one in ipairs(ids) do redis.call('HDEL', h, 'b:' .. one) end
  return ids
end
