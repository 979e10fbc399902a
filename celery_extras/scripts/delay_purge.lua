-- Follows now_ms.lua and delay_parked.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta, msg, taken, released, parked. ARGV: HSCAN cursor of msg ('0' to start), page size,
-- selection JSON {"q": [queue], "r": [[exchange, routing key]], "n": [task name]}.
-- Drops the entries of one page of msg (every entry not yet taken: parked, claimed or
-- released) that the selection names: recording a queue of q; recording none, routed by a pair
-- of r; of a task named in n. A dropped entry leaves a tombstone (meta's x = '!purged', pruned
-- with the taken ones): a copy a mover published already is dropped by the worker that takes
-- it, and the original message, should the broker deliver it again, is known, not parked anew.
-- Returns {next cursor ('0': that was the last page), parked entries dropped, claimed or
-- released ones dropped, entries kept that record no queue and whose route r does not name}.

local selection = cjson.decode(ARGV[3])
local queues, routes, names = {}, {}, {}
for _, q in ipairs(selection.q or {}) do queues[q] = true end
for _, r in ipairs(selection.r or {}) do routes[r[1] .. '\0' .. r[2]] = true end
for _, n in ipairs(selection.n or {}) do names[n] = true end
local by_queue = next(queues) ~= nil or next(routes) ~= nil

local function text(value)
  if type(value) == 'string' then return value end
  return ''
end

local scan = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local page = scan[2]
local parked, moving, kept = 0, 0, 0
for i = 1, #page, 2 do
  local id, raw = page[i], page[i + 1]
  local meta = redis.call('HGET', KEYS[2], id)
  local ok, m = false, nil
  if meta then ok, m = pcall(cjson.decode, meta) end
  if ok and type(m) == 'table' and not m.x then
    local hit = names[m.n] ~= nil
    if not hit and by_queue then
      local fine, e = pcall(cjson.decode, raw)
      if fine and type(e) == 'table' then
        local queue, exchange, key
        if e.v == 1 then
          queue, exchange, key = text(e.queue), text(e.exchange), text(e.routing_key)
        else
          queue, exchange, key = text(e.q), text(e.x), text(e.r)
        end
        if queue ~= '' then
          hit = queues[queue] ~= nil
        else
          hit = routes[exchange .. '\0' .. key] ~= nil
          if not hit then kept = kept + 1 end
        end
      end
    end
    if hit then
      if type(m.c) == 'table' and #m.c > 0 then moving = moving + 1 else parked = parked + 1 end
      m.x = '!purged'
      count_down(m)
      redis.call('HSET', KEYS[2], id, cjson.encode(m))
      redis.call('HDEL', KEYS[3], id)
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[5], id)
      redis.call('ZADD', KEYS[4], now, id)
    end
  end
end
return {scan[1], parked, moving, kept}
