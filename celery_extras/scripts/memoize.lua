-- Follows now_ms.lua, key_holds.lua and key_cover.lua, followed by key_ops.lua. The rules of
-- celery_extras/memoize/table.py, for one key.
-- KEYS[1]: the key's hash: run (JSON {id, h (holder), u (lease end ms), r (retries), x (1:
-- invalidated while it ran, its result not kept)}), last
-- (the last run whose result is kept: JSON {id, u (until ms)}), o (orphans), b:<id> (the run
-- covering <id>), n (task), k (key); the ids a run covers and their ending contexts as
-- coalesce.lua's. KEYS[2]: the task's keys with a result kept (a sorted set: each key's
-- hash, scored by its last use in us), in the same hash tag.
-- ARGV[1] is the operation, ARGV[2] the message id, ARGV[3] the holder:
--   ask        ARGV 4: lease ms, 5: retries, 6: task, 7: key, 8: the message's ending context
--              (kept while it joins a run in flight)
--              -> {'run'|'covered', covering id, 0, 1 if the covering run has ended (a
--                 result kept: the key is used now)}
--   finish     ARGV 4: ms the result is kept (0: not kept, a failure), 5: max keys
--              -> {} (no longer the run) or {0, '', {covered ids...}, {their contexts...}}
--   dropped    -> {} (held nothing) or {1, {covered ids...}, {their contexts...}}
--   forget     -> 1
--   invalidate -> 1 if the key had a result kept or a run in flight (whose result is then
--                 not kept), else 0
--   aside, renew: key_ops.lua's

local lru = KEYS[2]
local run, last = held('run', {'r'}), held('last', {})
if run and run.u <= now then orphan(run.id); run = nil end
if last and last.u <= now then last = nil end

local function save(longest) write_holds({'run'}, {run}, longest) end

if op == 'ask' then
  local lease, retries = tonumber(ARGV[4]), tonumber(ARGV[5])
  local reply, by = begin_ask(run, lease, retries, 6)
  if reply then  -- its own run
  elseif by then
    reply = {'covered', by}
  elseif run then
    reply = cover(run.id, mid)  -- joins the run in flight
  elseif last then
    redis.call('ZADD', lru, now_us, h)
    reply = {'covered', last.id, 0, 1}
  else
    run = {id = mid, h = holder, u = now + lease, r = retries}
    adopt_orphans(mid)
    reply = {'run', ''}
  end
  return answered(reply, ARGV[8], save, lease)
elseif op == 'finish' then
  local covered, contexts, again = end_run(run, save)
  if not covered then return {} end
  if again then return {0, '', covered, contexts} end
  local kept, most = tonumber(ARGV[4]), tonumber(ARGV[5])
  if kept > 0 and run.x ~= 1 then
    redis.call('HSET', h, 'last', cjson.encode({id = mid, u = now + kept}))
    redis.call('ZADD', lru, now_us, h)
    local over = redis.call('ZCARD', lru) - most
    if over > 0 then  -- the least recently used go (never this key: a tie in time)
      for _, gone in ipairs(redis.call('ZRANGE', lru, 0, over)) do
        if over > 0 and gone ~= h then
          over = over - 1
          redis.call('ZREM', lru, gone)
          redis.call('HDEL', gone, 'last')
          if redis.call('HLEN', gone) <= 2 then redis.call('DEL', gone, gone .. ':x') end
        end
      end
    end
    redis.call('PEXPIRE', lru, DAY + kept)
  end
  run = nil
  save(kept)
  return {0, '', covered, contexts}
elseif op == 'dropped' then
  if not run or run.id ~= mid or run.h ~= '' then
    save(0)
    return {}
  end
  local covered = release(mid)
  local contexts = take_contexts(covered)
  run = nil
  save(0)
  return {1, covered, contexts}
elseif op == 'forget' then
  save(0)
  return 1
elseif op == 'invalidate' then
  redis.call('ZREM', lru, h)
  if run then run.x = 1 end  -- its result is not kept either
  save(0)
  if last then
    redis.call('HDEL', h, 'last')
    if not run and #orphans == 0 and redis.call('HLEN', h) <= 2 then redis.call('DEL', h, x) end
  end
  return (last or run) and 1 or 0
end
local KIND, waiting = 'memoize', nil  -- key_ops.lua answers the rest
