-- Follows coalesce.lua or debounce.lua, which answer their own operations and leave these
-- to it, the same for both: their `run`, `waiting` hold (coalescing's waiting run,
-- debounce's next message), `save` and `KIND` (their name) are in scope.
--   aside   ARGV 4: hold ms -> 1, or 0 if no longer the run
--   parked  ARGV 4: hold ms, 5: delay-store entry -> 1, or 0 if no longer the waiting hold
--   renew   ARGV 4: lease ms, ids from ARGV 5 -> the ids whose hold had run out (an id of a
--           run owing endings claimed by *holder*: its claim renewed)
--   ended   the endings run *mid* owed are published: forgotten -> how many runs of the
--           key still owe endings
--   owed    the owed endings whose claim ran out (or *holder*'s), claimed by *holder*
--           -> {how many runs owe endings, {{run id, {ids...}, {contexts...}}...}}

if op == 'aside' then
  if not run or run.id ~= mid or run.h ~= holder then
    save(0)
    return 0
  end
  run.h, run.u = '', now + tonumber(ARGV[4])
  save(tonumber(ARGV[4]))
  return 1
elseif op == 'parked' then
  if not waiting or waiting.id ~= mid or waiting.h ~= holder then
    save(0)
    return 0
  end
  waiting.h, waiting.u, waiting.e = '', now + tonumber(ARGV[4]), ARGV[5]
  save(tonumber(ARGV[4]))
  return 1
elseif op == 'renew' then
  local lease = tonumber(ARGV[4])
  local lost = {}
  for i = 5, #ARGV do
    local one = nil
    if run and run.id == ARGV[i] then one = run
    elseif waiting and waiting.id == ARGV[i] then one = waiting end
    local w = owed_index(ARGV[i])  -- the endings a run owes, claimed by their finisher
    if not one and w and owed[w].h == holder then owed[w].u = now + OWED_MS
    elseif one and one.h == holder then one.u = now + lease else table.insert(lost, ARGV[i]) end
  end
  save(lease)
  return lost
elseif op == 'ended' then
  local i = owed_index(mid)
  if i then
    redis.call('DEL', h .. ':w:' .. mid)
    table.remove(owed, i)
  end
  save(0)
  return #owed
elseif op == 'owed' then
  local out, i = {}, 1
  while i <= #owed do
    local r = owed[i]
    local before = #owed
    if r.u <= now or r.h == holder then
      local ids, contexts = claim_owed(i)
      if #ids > 0 then table.insert(out, {r.by, ids, contexts}) end
    end
    if #owed == before then i = i + 1 end
  end
  save(0)
  return {#owed, out}
end
return redis.error_reply(KIND .. ': unknown operation ' .. tostring(op))
