-- Sent before the text of every delay script that parks or removes an entry (after now_ms.lua
-- where that comes first). The last of KEYS is the shard's parked-by-queue hash: queue ->
-- entries not yet taken (parked, claimed or released) that record it. An entry counts there
-- while its meta holds `q` (the queue it counts for, set at park): the script that takes,
-- purges, discards or withdraws it counts it down and clears `q` in the same call, so no path
-- counts an entry down twice. A count that is not an integer >= 1 (written by hand) is reset
-- by the next park, and a count is never left below 1 (the field goes): none goes negative.

local function count_up(q)
  if type(q) ~= 'string' or q == '' then return end
  local n = redis.pcall('HINCRBY', KEYS[#KEYS], q, 1)
  if type(n) ~= 'number' or n < 1 then redis.call('HSET', KEYS[#KEYS], q, 1) end
end

local function count_down(m)
  if type(m) ~= 'table' or type(m.q) ~= 'string' then return end
  local left = redis.pcall('HINCRBY', KEYS[#KEYS], m.q, -1)
  if type(left) ~= 'number' or left <= 0 then redis.call('HDEL', KEYS[#KEYS], m.q) end
  m.q = nil
end

