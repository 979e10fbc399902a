-- Follows now_ms.lua and delay_parked.lua; sent after the `#!lua flags=allow-oom` line (see redis_store.py).
-- KEYS: due, meta, msg, taken, released, parked. ARGV: lead ms, lease ms, tombstone ttl ms, max tokens,
-- lookahead ms, window, pace (entries per second), tokens... Claims the entries due within the
-- lead (parked, or whose lease or re-check ended); then, while fewer than `window` released
-- entries wait to be taken, the ETA and retry entries of a herd: never claimed, due within the
-- lookahead, with more entries due up to a second after their time than workers take at `pace`
-- meanwhile (a herd reaches the workers' timers before it falls due, as Celery's own ETA
-- tasks do).
-- Returns {next due in ms or -1 when empty, id, token, attempt, raw, due in ms, ...}.

local lead, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_tokens = tonumber(ARGV[4])
local ahead, window, pace = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local limit = #ARGV - 7
local out = {}
local n = 0

local function decode(id)
  local raw = redis.call('HGET', KEYS[2], id)
  local msg = redis.call('HGET', KEYS[3], id)
  local ok, m = false, nil
  if raw then ok, m = pcall(cjson.decode, raw) end
  if not ok or type(m) ~= 'table' or m.x or not msg then
    redis.call('ZREM', KEYS[1], id)
    if not (ok and type(m) == 'table' and m.x) then
      if ok then count_down(m) end
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
    end
    return nil, nil
  end
  return m, msg
end

local function claim(id, m, msg)
  n = n + 1
  local token = ARGV[7 + n]
  local tokens = m.c or {}
  table.insert(tokens, token)
  while #tokens > max_tokens do table.remove(tokens, 1) end
  m.c = tokens
  redis.call('HSET', KEYS[2], id, cjson.encode(m))
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('ZREM', KEYS[5], id)
  local due = tonumber(m.d) or now
  table.insert(out, id)
  table.insert(out, token)
  table.insert(out, #tokens)
  table.insert(out, msg)
  table.insert(out, due - now)
end

for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + lead, 'LIMIT', 0, limit)) do
  local m, msg = decode(id)
  if m then claim(id, m, msg) end
end
if n < limit and ahead > lead and pace > 0 and redis.call('ZCARD', KEYS[5]) < window then
  local found = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now + lead), now + ahead,
                           'WITHSCORES', 'LIMIT', 0, 2 * (limit - n))
  local all = redis.call('ZCARD', KEYS[1])
  local counted, before = nil, 0
  for i = 1, #found, 2 do
    local id, score = found[i], tonumber(found[i + 1])
    -- no entry this far ahead can be in a herd: fewer are parked than the pace takes by then
    if n >= limit or all <= (score - now) * pace / 1000 then break end
    if score ~= counted then
      counted, before = score, redis.call('ZCOUNT', KEYS[1], '-inf', score + 1000)
    end
    if before > (score - now) * pace / 1000 then
      local m, msg = decode(id)
      if m and not m.c and (m.k == 'eta' or m.k == 'retry') then claim(id, m, msg) end
    end
  end
end

local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 200)
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[4], id)
  local raw = redis.call('HGET', KEYS[2], id)
  if raw and string.find(raw, '"q"', 1, true) then  -- taken by an older release (an upgrade)
    local ok, m = pcall(cjson.decode, raw)
    if ok then count_down(m) end
  end
  redis.call('HDEL', KEYS[2], id)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_in = -1
if first[2] then next_in = math.max(0, tonumber(first[2]) - now) end
table.insert(out, 1, next_in)
return out
