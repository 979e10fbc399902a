-- Follows now_ms.lua and key_holds.lua, followed by key_ops.lua. The rules of
-- celery_extras/debounce/table.py, for one key.
-- KEYS[1]: the key's hash: run (JSON {id, h (holder), u (lease end ms), s (sent ms), q (the
-- microseconds of s: cjson keeps 14 digits, two messages of a burst are often sent in one
-- ms), r (retries)}), next (the last message of the burst waiting: JSON {id, h, u, s, q, f
-- (its burst's first arrival ms), d (due ms), e (its delay-store entry, when parked)}),
-- last (the last run that ended: JSON {id, s, q, u (remembered until)}), o (orphans, JSON
-- list), b:<id> (the id covering <id>; kept after that run ended for an id unconfirmed), n
-- (task), k (key). The ids a run (or the next message) covers are the list
-- KEYS[1]..':c:'..<id> (same hash tag); a covered id is confirmed (its holder was told, and
-- acked it) once field <id> of the hash KEYS[1]..':x' holds its ending context (JSON text,
-- '' for none), until the run covering it ends or is dropped.
-- ARGV[1] is the operation, ARGV[2] the message id, ARGV[3] the holder:
--   ask     ARGV 4: sent us, 5: wait ms, 6: max_wait ms ('' for none), 7: lease ms,
--           8: retries, 9: task, 10: key, 11: the message's ending context (kept when it
--           is covered)
--           -> {'run'|'wait'|'covered', covering id, ms until it should ask again (wait),
--               1 if the covering run has ended}
--   finish  -> {} (no longer the run) or {1 if a next message is due else 0, its parked
--              entry if it is due or '', {covered ids...}, {their contexts, '' for none...}}
--   dropped -> {} or {1, {confirmed covered ids...}, {their contexts...}}: Celery discarded
--              the next message (or the run between attempts) before it ran
--   forget  -> 1
--   aside, parked, renew: key_ops.lua's
-- Each write sets the keys' TTL to the longest hold + a day (orphans, and the last run,
-- are remembered that long).

local function hold(field) return held(field, {'s', 'q', 'r', 'f', 'd'}) end
-- When a hold's message was sent, in microseconds (exact in a double until the year 2255).
local function sent_us(v) return v.s * 1000 + v.q end
local function orphan(id)
  local ids = release(id)
  table.insert(ids, id)
  for _, one in ipairs(ids) do
    if not orphaned(one) then table.insert(orphans, one) end
  end
end
local cover_id = cover
-- As key_holds.lua's cover; a covered orphan is no orphan any more.
local function cover(run_id, id)
  cover_id(run_id, id)
  local i = orphaned(id)
  if i then table.remove(orphans, i) end
end
-- The contexts of *ids* (false where unconfirmed), in batches.
local function contexts_of(ids)
  local contexts = {}
  for _, batch in ipairs(batches(ids, '')) do
    local got = redis.call('HMGET', x, unpack(batch))
    for i = 1, #batch do table.insert(contexts, got[i]) end
  end
  return contexts
end

local run, nxt, last = hold('run'), hold('next'), hold('last')
if run and run.u <= now then orphan(run.id); run = nil end
if nxt and nxt.u <= now then orphan(nxt.id); nxt = nil end
if last and last.u <= now then last = nil; redis.call('HDEL', h, 'last') end

local function save(longest) write_holds({'run', 'next'}, {run, nxt}, longest) end

local function start(lease, retries)
  run = {id = nxt.id, h = holder, u = now + lease, s = nxt.s, q = nxt.q, r = retries}
  adopt_orphans(nxt.id)
  nxt = nil
  return {'run', ''}
end
local function waits()
  if now < nxt.d then return {'wait', '', nxt.d - now} end
  return {'wait', '', run and (run.u - now) or 0}
end

if op == 'ask' then
  local sent, wait, max_wait = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local lease, retries = tonumber(ARGV[7]), tonumber(ARGV[8])
  local reply, by = begin_ask(run, lease, retries, 9)
  if reply then  -- its own run
  elseif by then
    if (run and run.id == by) or (nxt and nxt.id == by) then
      reply = {'covered', by}
    else
      redis.call('HDEL', h, 'b:' .. mid)
      reply = {'covered', by, 0, 1}  -- by a run that has ended: it ends where it is
    end
  elseif nxt and nxt.id == mid then
    nxt.h, nxt.u, nxt.e = holder, now + lease, nil
    if now >= nxt.d and not run then reply = start(lease, retries) else reply = waits() end
  elseif run and sent <= sent_us(run) then  -- of the burst running, delivered late
    cover(run.id, mid)
    reply = {'covered', run.id}
  elseif last and sent <= sent_us(last) then  -- of a burst that ran
    reply = {'covered', last.id, 0, 1}
  elseif nxt and (orphaned(mid) or sent < sent_us(nxt)) then  -- delivered again, or older
    cover(nxt.id, mid)
    reply = {'covered', nxt.id}
  else
    local i = orphaned(mid)
    if i then table.remove(orphans, i) end
    local first = nxt and nxt.f or now
    local due = now + wait
    if max_wait and first + max_wait < due then due = first + max_wait end
    if nxt then  -- the burst goes on: the one replaced, and all it covered, are covered
      local moved = release(nxt.id)
      table.insert(moved, nxt.id)
      for _, one in ipairs(moved) do cover(mid, one) end
    end
    nxt = {id = mid, h = holder, u = now + lease, s = math.floor(sent / 1000), q = sent % 1000,
           f = first, d = due}
    if now >= due and not run then reply = start(lease, retries) else reply = waits() end
  end
  local context = ARGV[11] or ''
  if reply[1] == 'covered' and reply[2] ~= mid and not reply[4] then
    if #context > MAX_CONTEXT then context = '' end
    redis.call('HSET', x, mid, context)
  end
  save(lease)
  return reply
elseif op == 'finish' then
  if not run or run.id ~= mid or run.h ~= holder then
    local ids, contexts = owed_again()  -- asked again, its reply lost: what it still owes
    save(0)
    if ids then return {0, '', ids, contexts} end
    return {}
  end
  local list = h .. ':c:' .. mid
  local covered = redis.call('LRANGE', list, 0, -1)
  redis.call('DEL', list)
  local found = contexts_of(covered)
  local contexts = {}
  for i, one in ipairs(covered) do
    if found[i] then  -- confirmed: it ends with the run; unconfirmed: remembered
      redis.call('HDEL', h, 'b:' .. one)
      redis.call('HDEL', x, one)
      table.insert(contexts, found[i])
    else
      table.insert(contexts, '')
    end
  end
  owe(mid, covered, contexts)  -- until op ended
  redis.call('HSET', h, 'last', cjson.encode({id = run.id, s = run.s, q = run.q, u = now + DAY}))
  run = nil
  save(0)
  local due = nxt and nxt.d <= now
  return {due and 1 or 0, (due and nxt.e) or '', covered, contexts}
elseif op == 'dropped' then
  local which = nil
  if nxt and nxt.id == mid then which = 'next'
  elseif run and run.id == mid and run.h == '' then which = 'run' end
  if not which then
    local by = redis.call('HGET', h, 'b:' .. mid)
    if by and not (run and run.id == by) and not (nxt and nxt.id == by) then
      redis.call('HDEL', h, 'b:' .. mid)  -- covered by a run that ended: delivered no more
    end
    save(0)
    return {}
  end
  local ids = release(mid)
  local found = contexts_of(ids)
  local confirmed, contexts = {}, {}
  for i, one in ipairs(ids) do
    if found[i] then
      table.insert(confirmed, one)
      table.insert(contexts, found[i])
      redis.call('HDEL', x, one)
    end
  end
  if which == 'next' then nxt = nil else run = nil end
  save(0)
  return {1, confirmed, contexts}
elseif op == 'forget' then
  if nxt and nxt.id == mid and nxt.h == holder then nxt.h = '' end
  save(0)
  return 1
end
local KIND, waiting = 'debounce', nxt  -- key_ops.lua answers the rest

