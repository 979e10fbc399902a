-- The shared prefix of every timed script: `now`, the time in ms, and `now_us`, in us.
-- ARGV[1] is the caller's (celery_extras.clock.store_time): '' for the Redis server's
-- TIME (workers' clocks do not matter), or simulated time in us (the testing plugin's
-- clock). It is removed here, so a script's own arguments start at ARGV[1].

local now_us = tonumber(table.remove(ARGV, 1))
if not now_us then
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now = math.floor(now_us / 1000)
