-- Follows now_ms.lua and slots_prune.lua.
-- KEYS: holders, queue, tickets. ARGV: holder, channel, notice, then for a hand-over to the
-- releasing worker's next waiter: its holder id ('' for none), lease ms, patience ms, worker,
-- cap, more (1: still more waiting), ticket lease ms. The slot goes straight to that waiter
-- when the worker is first in the queue or the first ticket has waited less than the
-- patience (so a worker at the head of the queue waits at most that much longer than in
-- strict order). A slot freed is published only when a worker is queued for it (every worker
-- hears every notice). Returns {1 if it held a slot, 1 if handed over}.
local found = redis.call('ZREM', KEYS[1], ARGV[1])
local nxt = ARGV[4] or ''
if nxt ~= '' and redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[8]) then
  local lease, patience, worker = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if not head[1] or head[1] == worker or now - tonumber(head[2]) < patience then
    redis.call('ZADD', KEYS[1], now + lease, nxt)
    if redis.call('PTTL', KEYS[1]) < lease + 1000 then
      redis.call('PEXPIRE', KEYS[1], lease + 1000)
    end
    local tlease = tonumber(ARGV[10])
    if head[1] == worker or ARGV[9] ~= '1' then
      redis.call('ZREM', KEYS[2], worker)
      redis.call('ZREM', KEYS[3], worker)
    end
    if ARGV[9] == '1' and not redis.call('ZSCORE', KEYS[2], worker) then
      local tail = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
      local score = now
      if tail[2] and tonumber(tail[2]) >= now then score = tonumber(tail[2]) + 1 end
      redis.call('ZADD', KEYS[2], score, worker)
      redis.call('ZADD', KEYS[3], now + tlease, worker)
      redis.call('PEXPIRE', KEYS[2], tlease + 1000)
      redis.call('PEXPIRE', KEYS[3], tlease + 1000)
    end
    return {found, 1}
  end
end
if redis.call('ZCARD', KEYS[2]) > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
elseif redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
return {found, 0}
