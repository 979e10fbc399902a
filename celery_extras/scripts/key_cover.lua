-- Follows key_holds.lua; followed by coalesce.lua or memoize.lua, whose runs cover ids
-- alike (key_holds.lua's cover) and keep every covered id's context until the run ends.
-- take_contexts(ids): the ending contexts of *ids* ('' where none), taken out of the key;
-- orphan(id): the hold *id* ran out: it and what it covered are orphans;
-- keep_context(reply, context): *mid*, covered by a hold that has not ended, keeps its
-- ending *context* until that run ends;
-- end_run(run, save): the covered ids and their contexts, taken out and owed by *mid* until
-- their endings are published, when *mid* is *run* held by *holder*; when *mid* ended
-- already (a finish asked again, its reply lost) those it still owes, and true; else nil
-- (the holds saved).

local function take_contexts(ids)
  local contexts = {}
  for _, batch in ipairs(batches(ids, '')) do
    local got = redis.call('HMGET', x, unpack(batch))
    for i = 1, #batch do table.insert(contexts, got[i] or '') end
    redis.call('HDEL', x, unpack(batch))
  end
  return contexts
end
local function orphan(id)
  local ids = release(id)
  table.insert(ids, id)
  for _, one in ipairs(ids) do
    redis.call('HDEL', h, 'b:' .. one)
    if not orphaned(one) then table.insert(orphans, one) end
  end
end
local function keep_context(reply, context)
  if reply[1] == 'covered' and reply[2] ~= mid and not reply[4] and context and context ~= ''
      and #context <= MAX_CONTEXT then
    redis.call('HSET', x, mid, context)
  end
end
-- answered(reply, context, save, lease): *reply* to an ask, the context kept, the holds saved.
local function answered(reply, context, save, lease)
  keep_context(reply, context)
  save(lease)
  return reply
end
local function end_run(run, save)
  if not run or run.id ~= mid or run.h ~= holder then
    local ids, contexts = owed_again()
    save(0)
    return ids, contexts, ids ~= nil
  end
  local covered = release(mid)
  local contexts = take_contexts(covered)
  owe(mid, covered, contexts)
  return covered, contexts, false
end
