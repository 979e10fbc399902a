-- KEYS: bucket. ARGV: interval us, burst, tokens, longest wait us, floor us (the caller's
-- last booked slot). Returns {wait us, interval us, burst, the new arrival time in us or 0}.
-- A wait longer than the longest wait books nothing (the caller waits that long and asks
-- again), so a bucket is never booked further ahead than that: a stored time beyond it is
-- garbage and read as "now".

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tokens = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local floor = tonumber(ARGV[5]) or 0
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat ~= tat then tat = 0 end
if tat < floor then tat = floor end
if tat < now or tat > now + max_wait + burst * interval then tat = now end
local wait = tat + (tokens - burst) * interval - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {wait, interval, burst, '0'} end
local new_tat = tat + tokens * interval
redis.call('SET', KEYS[1], string.format('%.0f', new_tat),
           'PX', math.floor((new_tat - now) / 1000) + 1000)
return {wait, interval, burst, string.format('%.0f', new_tat)}
