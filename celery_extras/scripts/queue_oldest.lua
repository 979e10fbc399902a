-- A queue's depth and oldest publish stamp on the Redis broker (queue figures), one call
-- per queue per stats tick. KEYS: the queue's lists, one per priority step (kombu publishes
-- with LPUSH and takes with BRPOP: each list's oldest message is its last element).
-- ARGV[1]: the header of the publish stamp. Reply: {depth} or {depth, "smallest stamp"}.
local total, oldest = 0, nil
for _, key in ipairs(KEYS) do
  local n = redis.call('LLEN', key)
  total = total + n
  if n > 0 then
    local ok, message = pcall(cjson.decode, redis.call('LINDEX', key, -1))
    if ok and type(message) == 'table' and type(message['headers']) == 'table' then
      local stamp = message['headers'][ARGV[1]]
      if type(stamp) == 'number' and (oldest == nil or stamp < oldest) then
        oldest = stamp
      end
    end
  end
end
if oldest == nil then return {total} end
return {total, tostring(oldest)}
