-- Follows coalesce.lua or debounce.lua, which answer their own operations and leave these
-- to it, the same for both: their `run`, `waiting` hold (coalescing's waiting run,
-- debounce's next message), `save` and `KIND` (their name) are in scope.
--   aside   ARGV 4: hold ms -> 1, or 0 if no longer the run
--   parked  ARGV 4: hold ms, 5: delay-store entry -> 1, or 0 if no longer the waiting hold
--   renew   ARGV 4: lease ms, ids from ARGV 5 -> the ids whose hold had run out

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
    if one and one.h == holder then one.u = now + lease else table.insert(lost, ARGV[i]) end
  end
  save(lease)
  return lost
end
return redis.error_reply(KIND .. ': unknown operation ' .. tostring(op))
