-- Admit one task under all its global limits at once (GCRA on the store's clock, in us).
-- KEYS: its buckets, the enforcing ones first, then its shadow ones.
-- ARGV: longest wait, wait floor (what the task's worker-scope limits ask), count of
-- enforcing buckets, calls to book ahead at most, their horizon; then per bucket:
-- interval, burst, tokens, floor (the caller's last booked slot in that bucket), narrow
-- (1: a per-key bucket, shared only by its key's tasks).
-- Returns {wait, binding, then per bucket: its own wait, its new arrival time or '0';
-- then the calls booked ahead}.
-- The task waits for the latest of the floor and the enforcing buckets' waits. If that is
-- 0, every bucket is taken (all or nothing), shadow ones too. Otherwise a narrow bucket
-- books its own slot (its key's tasks queue in order), and a broad one only when it makes
-- the task wait longest (binding: the enforcing bucket that does, 1-based; 0 when the floor
-- does): the others are asked again at the task's time, so they lose no capacity to a task
-- another limit holds back.
-- A wait longer than the longest wait books nothing (the caller waits that long and asks
-- again), so a bucket is never booked further ahead than that: a stored time beyond it is
-- garbage and read as "now".
-- A call that goes now may also book the next calls of the same buckets (up to the count
-- asked: the caller's next arrivals) on slots the buckets let pass unused: the last
-- `horizon` us of the time each enforcing bucket stood full (a full bucket's tokens
-- overflow). They move no bucket's time (the slots are past), so no later call waits for
-- them, and a bucket that binds (never full) has none; the caller spends them within the
-- horizon: late by at most twice it, never early.

local now = now_us  -- this script counts in us (now_us: the now_ms.lua prefix)
local max_wait = tonumber(ARGV[1])
local wait = tonumber(ARGV[2])
local enforcing = tonumber(ARGV[3])
local ahead, horizon = tonumber(ARGV[4]), tonumber(ARGV[5])
local tats, waits, tokens, intervals, narrow, idle = {}, {}, {}, {}, {}, {}
for i = 1, #KEYS do
  local at = 5 + (i - 1) * 5
  local interval, burst = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local floor = tonumber(ARGV[at + 4]) or 0
  tokens[i], intervals[i], narrow[i] = tonumber(ARGV[at + 3]), interval, ARGV[at + 5] == '1'
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if tat ~= tat then tat = 0 end
  if tat < floor then tat = floor end
  idle[i] = tat < now and now - tat or 0
  if tat < now or tat > now + max_wait + burst * interval then tat = now end
  local own = tat + (tokens[i] - burst) * interval - now
  if own < 0 or tokens[i] == 0 then own = 0 end
  tats[i], waits[i] = tat, own
end
local binding = 0
for i = 1, enforcing do
  if waits[i] > 0 and waits[i] >= wait then wait, binding = waits[i], i end
end
if wait > 0 or #KEYS > enforcing then ahead = 0 end
for i = 1, enforcing do
  if ahead > 0 and tokens[i] > 0 then  -- the slots it let pass within the horizon
    local fit = math.floor(math.min(idle[i], horizon) / (tokens[i] * intervals[i]))
    if fit < ahead then ahead = math.max(fit, 0) end
  end
end
local booked = {}
local function book(i)
  local new_tat = tats[i] + tokens[i] * intervals[i]
  redis.call('SET', KEYS[i], string.format('%.0f', new_tat),
             'PX', math.floor((new_tat - now) / 1000) + 1000)
  booked[i] = string.format('%.0f', new_tat)
end
if wait <= max_wait then
  for i = 1, #KEYS do
    local due = (i > enforcing and wait == 0) or (i <= enforcing and
      (wait == 0 or narrow[i] or i == binding))
    if due and tokens[i] > 0 and waits[i] <= max_wait then book(i) end
  end
end
local reply = {wait, binding}
for i = 1, #KEYS do
  reply[#reply + 1] = waits[i]
  reply[#reply + 1] = booked[i] or '0'
end
reply[#reply + 1] = ahead
return reply
