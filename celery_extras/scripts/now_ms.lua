-- The shared prefix of the slot and delay scripts: the Redis server's time in ms as
-- `now` (workers' clocks do not matter).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
