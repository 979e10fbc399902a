-- Admit one task under all its global limits at once (GCRA on the server's clock, in us).
-- KEYS: its buckets, the enforcing ones first, then its shadow ones.
-- ARGV: longest wait, wait floor (what the task's worker-scope limits ask), count of
-- enforcing buckets; then per bucket: interval, burst, tokens, floor (the caller's last
-- booked slot in that bucket).
-- Returns {wait, binding, then per bucket: its own wait, its new arrival time or '0'}.
-- The task waits for the latest of the floor and the enforcing buckets' waits. If that is
-- 0, every bucket is taken (all or nothing), shadow ones too; otherwise only the enforcing
-- bucket that makes it wait longest (binding, 1-based; 0 when the floor is longer) books
-- its slot, and nothing else is taken: the others are asked again when that slot comes.
-- A wait longer than the longest wait books nothing (the caller waits that long and asks
-- again), so a bucket is never booked further ahead than that: a stored time beyond it is
-- garbage and read as "now".

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[1])
local wait = tonumber(ARGV[2])
local enforcing = tonumber(ARGV[3])
local tats, waits = {}, {}
for i = 1, #KEYS do
  local at = 3 + (i - 1) * 4
  local interval, burst = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local tokens, floor = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]) or 0
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if tat ~= tat then tat = 0 end
  if tat < floor then tat = floor end
  if tat < now or tat > now + max_wait + burst * interval then tat = now end
  local own = tat + (tokens - burst) * interval - now
  if own < 0 or tokens == 0 then own = 0 end
  tats[i], waits[i] = tat, own
end
local binding = 0
for i = 1, enforcing do
  if waits[i] > 0 and waits[i] >= wait then wait, binding = waits[i], i end
end
local booked = {}
local function book(i)
  local at = 3 + (i - 1) * 4
  local new_tat = tats[i] + tonumber(ARGV[at + 3]) * tonumber(ARGV[at + 1])
  redis.call('SET', KEYS[i], string.format('%.0f', new_tat),
             'PX', math.floor((new_tat - now) / 1000) + 1000)
  booked[i] = string.format('%.0f', new_tat)
end
if wait == 0 then
  for i = 1, #KEYS do
    if waits[i] <= max_wait and tonumber(ARGV[3 + (i - 1) * 4 + 3]) > 0 then book(i) end
  end
elseif wait <= max_wait and binding > 0 then
  book(binding)
end
local reply = {wait, binding}
for i = 1, #KEYS do
  reply[#reply + 1] = waits[i]
  reply[#reply + 1] = booked[i] or '0'
end
return reply
