-- Follows now_ms.lua; followed by coalesce.lua or debounce.lua: what both keep of a key in
-- the hash KEYS[1] (see those scripts): its holds, its orphans (o), the ids each run covers
-- (the list KEYS[1]..':c:'..<run id>, and field b:<id> naming the covering run) and the
-- ending contexts of covered ids (the hash KEYS[1]..':x'), and the endings owed by runs
-- that ended (w: see `owe`).
-- ARGV[1] is the operation, ARGV[2] the message id, ARGV[3] the holder.

local h = KEYS[1]
local x = h .. ':x'
local op, mid, holder = ARGV[1], ARGV[2], ARGV[3]
-- 'settle' is a finish whose run keeps what it covered owed until op ended (see `owe`); a
-- plain 'finish' hands it to its caller at once.
local settles = op == 'settle'
if settles then op = 'finish' end
local DAY = 86400000
local MAX_CONTEXT = 131072

-- The key's holds, last run, orphans, task and key, read at once: `stored` (absent fields
-- are nil). `task_key`, set by an ask ({task, key}), is written with the holds if it changed.
local STORED = {'run', 'wait', 'next', 'last', 'o', 'n', 'k', 'w'}
local stored, task_key = {}, nil
do
  local got = redis.call('HMGET', h, unpack(STORED))
  for i, field in ipairs(STORED) do
    if got[i] then stored[field] = got[i] end
  end
end
-- A field that is not what this script wrote (garbage, a foreign write) reads as absent,
-- so a damaged key heals at its next write instead of failing every call.
local function get(field)
  local raw = stored[field]
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
local orphans = {}
for _, one in ipairs(get('o') or {}) do
  if type(one) == 'string' then table.insert(orphans, one) end
end
-- The endings owed by runs that ended (field w: JSON list of {by (the run), h (the holder
-- ending them), u (ms its claim ends)}): each one's covered ids and their contexts ('' for
-- none) are the hash KEYS[1]..':w:'..<by>, kept from the run's finish until whoever ends
-- them says so (op ended): a finisher that dies, or whose finish reply is lost, leaves them
-- to be claimed again (its own finish asked again, or op owed once the claim ran out).
local OWED_MS = 30000
local owed = {}
for _, one in ipairs(get('w') or {}) do
  if type(one) == 'table' and type(one.by) == 'string' and type(one.u) == 'number' then
    if type(one.h) ~= 'string' then one.h = '' end
    table.insert(owed, one)
  end
end
local function owed_index(by)
  for i, r in ipairs(owed) do if r.by == by then return i end end
  return nil
end
-- Run *by* owes the endings of *ids* (their *contexts*), claimed by *holder* (a settle).
local function owe(by, ids, contexts)
  if #ids == 0 or not settles then return end
  local w = h .. ':w:' .. by
  for first = 1, #ids, 250 do
    local args = {}
    for i = first, math.min(first + 249, #ids) do
      table.insert(args, ids[i])
      table.insert(args, contexts[i] or '')
    end
    redis.call('HSET', w, unpack(args))
  end
  table.insert(owed, {by = by, h = holder, u = now + OWED_MS})
end
-- The owed record *i*, claimed by *holder* now: its ids and their contexts.
local function claim_owed(i)
  local r = owed[i]
  r.h, r.u = holder, now + OWED_MS
  local all = redis.call('HGETALL', h .. ':w:' .. r.by)
  local ids, contexts = {}, {}
  for j = 1, #all, 2 do
    table.insert(ids, all[j])
    table.insert(contexts, all[j + 1])
  end
  if #ids == 0 then table.remove(owed, i) end
  return ids, contexts
end
-- A finish of *mid* asked again (its first reply lost): the endings it owes, if *holder*
-- still claims them or their claim ran out; else nil.
local function owed_again()
  if not settles then return nil end
  local i = owed_index(mid)
  if not i or (owed[i].h ~= holder and owed[i].u > now) then return nil end
  local ids, contexts = claim_owed(i)
  if #ids == 0 then return nil end
  return ids, contexts
end
local function orphaned(id)
  for i, o in ipairs(orphans) do if o == id then return i end end
  return nil
end
-- *ids*, each after *prefix*, in runs of at most 500 (the arguments of one command).
local function batches(ids, prefix)
  local out = {}
  for first = 1, #ids, 500 do
    local batch = {}
    for i = first, math.min(first + 499, #ids) do table.insert(batch, prefix .. ids[i]) end
    table.insert(out, batch)
  end
  return out
end
-- The ids *id* covers, forgotten here (its list and their b: fields).
local function release(id)
  local list = h .. ':c:' .. id
  local ids = redis.call('LRANGE', list, 0, -1)
  if #ids == 0 then return ids end
  redis.call('DEL', list)
  for _, fields in ipairs(batches(ids, 'b:')) do redis.call('HDEL', h, unpack(fields)) end
  return ids
end
-- Writes the holds (*fields* and their *holds*, nil for none), the orphans and the task and
-- key, in one HSET and one HDEL (of the fields stored and gone). A key left with no hold and
-- no last run is deleted; else it, its contexts and its holds' lists are kept a day past the
-- *longest* lease.
local function write_holds(fields, holds, longest)
  local set, gone = {}, {}
  local function write(field, text)
    if text then
      table.insert(set, field)
      table.insert(set, text)
    elseif stored[field] then
      table.insert(gone, field)
    end
  end
  for i, field in ipairs(fields) do write(field, holds[i] and cjson.encode(holds[i])) end
  write('o', #orphans > 0 and cjson.encode(orphans) or nil)
  write('w', #owed > 0 and cjson.encode(owed) or nil)
  if task_key and (stored.n ~= task_key[1] or stored.k ~= task_key[2]) then
    write('n', task_key[1])
    write('k', task_key[2])
  end
  if #set > 0 then redis.call('HSET', h, unpack(set)) end
  if #gone > 0 then redis.call('HDEL', h, unpack(gone)) end
  local holding = false
  for i = 1, #fields do holding = holding or holds[i] ~= nil end
  if not holding and #owed == 0 and redis.call('HLEN', h) <= 2 then  -- only n, k left
    redis.call('DEL', h, x)
    return
  end
  local ttl = DAY + (longest or 0)
  redis.call('PEXPIRE', h, ttl)
  redis.call('PEXPIRE', x, ttl)
  for i = 1, #fields do
    if holds[i] then redis.call('PEXPIRE', h .. ':c:' .. holds[i].id, ttl) end
  end
  for _, r in ipairs(owed) do redis.call('PEXPIRE', h .. ':w:' .. r.by, ttl) end
end
-- *run* (a hold, or nil) asked about by message *mid*: {'run', ''} when it is the run still
-- (its own ask again, a retry, or going on elsewhere: held by *holder* now, for *lease* ms),
-- {'covered', mid} for a second delivery of a live run, nil when *mid* is not the run.
local function own_run(run, lease, retries)
  if not run or run.id ~= mid then return nil end
  if run.h == '' or run.h == holder or retries > run.r then
    run.h, run.u = holder, now + lease
    if retries > run.r then run.r = retries end
    return {'run', ''}
  end
  return {'covered', mid}
end
-- The start of an ask (*task_at*: where its task and key are in ARGV): the task and key
-- noted, then own_run's reply and the run covering *mid* (its b: field), if any.
local function begin_ask(run, lease, retries, task_at)
  task_key = {ARGV[task_at], ARGV[task_at + 1]}
  return own_run(run, lease, retries), redis.call('HGET', h, 'b:' .. mid)
end
-- *id* is covered by *run_id* (its list, and the field b:<id> naming it) -> {'covered', run_id}.
local function cover(run_id, id)
  if id ~= run_id and redis.call('HGET', h, 'b:' .. id) ~= run_id then
    redis.call('RPUSH', h .. ':c:' .. run_id, id)
    redis.call('HSET', h, 'b:' .. id, run_id)
  end
  return {'covered', run_id}
end
-- The key's new run *run_id* covers the orphans.
local function adopt_orphans(run_id)
  local all = orphans
  orphans = {}
  for _, o in ipairs(all) do
    if o ~= run_id then cover(run_id, o) end
  end
end
