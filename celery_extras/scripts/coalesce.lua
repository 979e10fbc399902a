-- Follows now_ms.lua, key_holds.lua and key_cover.lua, followed by key_ops.lua. The rules of
-- celery_extras/coalesce/table.py, for one key.
-- KEYS[1]: the key's hash: run, wait (JSON {id, h (holder), u (lease end ms), c (cutoff ms),
-- r (retries), e (the waiting run's delay-store entry, when parked)}), last (the last run
-- that ended: JSON {id, c}), o (orphans, JSON list), b:<id> (the run covering <id>), n (task), k (key).
-- The ids a run covers are the list KEYS[1]..':c:'..<run id> (same hash tag); the ending
-- context of a covered id (JSON text) is field <id> of the hash KEYS[1]..':x', from the ask
-- that covered it until the run covering it ends or is dropped (a key written by an earlier
-- release has none: its ids get their result only).
-- ARGV[1] is the operation, ARGV[2] the message id, ARGV[3] the holder:
--   ask     ARGV 4: sent ms (rounded up), 5: lease ms, 6: keep, 7: retries, 8: task, 9: key,
--           10: the message's ending context (optional; kept when a run that has not
--           ended covers it)
--           -> {'run'|'wait'|'covered', covering id, ms until the run's lease ends (wait),
--               1 if the covering run has ended}
--   finish  -> {} (no longer the run) or {1 if a run waits else 0, its parked entry or '',
--              {covered ids...}, {their contexts, '' for none...}}: owed until op ended
--              (asked again after the run ended: what it still owes, key_cover.lua)
--   dropped -> {} (held nothing) or {1, {covered ids...}, {their contexts...}}: Celery
--              discarded the waiting run (or the run between attempts) before it ran
--   forget  -> 1
--   aside, parked, renew: key_ops.lua's
-- Each write sets the keys' TTL to the longest lease + a day (orphans wait that long).

local function hold(field) return held(field, {'c', 'r'}) end
local run, wait, last = hold('run'), hold('wait'), hold('last')
if run and run.u <= now then orphan(run.id); run = nil end
if wait and wait.u <= now then orphan(wait.id); wait = nil end

local function save(longest) write_holds({'run', 'wait'}, {run, wait}, longest) end

local function start(lease, retries)
  run = {id = mid, h = holder, u = now + lease, c = now, r = retries}
  adopt_orphans(mid)
  return {'run', ''}
end

local reply
if op == 'ask' then
  local sent, lease, keep, retries = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
  local by
  reply, by = begin_ask(run, lease, retries, 8)
  if reply then  -- its own run
  elseif by then
    reply = {'covered', by}
  elseif wait and wait.id == mid then
    if not run then
      wait = nil
      reply = start(lease, retries)
    else
      wait.h, wait.u, wait.e = holder, now + lease, nil
      reply = {'wait', '', run.u - now}
    end
  elseif run and sent <= run.c then
    reply = cover(run.id, mid)
  elseif last and sent <= last.c then
    reply = {'covered', last.id, 0, 1}  -- sent before the last run started
  elseif wait then
    if keep == 'first' or not run then
      reply = cover(wait.id, mid)
    else
      local moved = release(wait.id)
      table.insert(moved, wait.id)
      redis.call('HDEL', h, 'b:' .. wait.id)
      wait = {id = mid, h = holder, u = now + lease}
      for _, one in ipairs(moved) do cover(mid, one) end
      reply = {'wait', '', run.u - now}
    end
  elseif not run then
    reply = start(lease, retries)
  else
    wait = {id = mid, h = holder, u = now + lease}
    reply = {'wait', '', run.u - now}
  end
  return answered(reply, ARGV[10], save, lease)
elseif op == 'finish' then
  local covered, contexts, again = end_run(run, save)
  if not covered then return {} end
  if again then return {wait and 1 or 0, '', covered, contexts} end
  redis.call('HSET', h, 'last', cjson.encode({id = run.id, c = run.c, u = now}))
  run = nil
  save(0)
  return {wait and 1 or 0, wait and wait.e or '', covered, contexts}
elseif op == 'dropped' then
  local which = nil
  if wait and wait.id == mid then which = 'wait'
  elseif run and run.id == mid and run.h == '' then which = 'run' end
  if not which then
    save(0)
    return {}
  end
  local covered = release(mid)
  local contexts = take_contexts(covered)
  if which == 'wait' then wait = nil else run = nil end
  save(0)
  return {1, covered, contexts}
elseif op == 'forget' then
  if wait and wait.id == mid and wait.h == holder then
    orphan(mid)
    wait = nil
  end
  save(0)
  return 1
end
local KIND, waiting = 'coalesce', wait  -- key_ops.lua answers the rest

