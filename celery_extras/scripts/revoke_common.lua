-- The shared prefix of the revoke scripts (revoke_write, revoke_probe, revoke_pull).
-- KEYS: revoked stamps log seq clock epoch. ARGV: now max clock new_epoch ...
-- Starts a new epoch over a garbage seq or epoch; defines trim() and merge_clock().

local now = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local function counter(raw)
  return raw and string.len(raw) <= 18 and string.match(raw, '^%d+$') ~= nil
end
local seq_raw = redis.call('GET', KEYS[4])
local epoch_raw = redis.call('GET', KEYS[6])
if (seq_raw and not counter(seq_raw)) or (epoch_raw and string.len(epoch_raw) > 64) then
  -- garbage where the counter or the epoch should be: start a new epoch, so every
  -- worker reads the whole shard again instead of trusting its cursor, and log every
  -- entry afresh (a whole read is a read of the log from 0)
  redis.call('DEL', KEYS[3])
  local seq = 0
  for _, part in ipairs({{KEYS[1], 'i:'}, {KEYS[2], 's:'}}) do
    for _, member in ipairs(redis.call('ZRANGE', part[1], 0, -1)) do
      seq = seq + 1
      redis.call('ZADD', KEYS[3], seq, part[2] .. member)
    end
  end
  redis.call('SET', KEYS[4], seq)
  redis.call('SET', KEYS[6], ARGV[4])
end
redis.call('SET', KEYS[6], ARGV[4], 'NX')
local function trim(key, tag)
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, 10000)
  for _, member in ipairs(gone) do
    redis.call('ZREM', key, member)
    redis.call('ZREM', KEYS[3], tag .. member)
  end
  local extra = redis.call('ZCARD', key) - max
  if extra > 0 then
    local popped = redis.call('ZPOPMIN', key, extra)
    for j = 1, #popped, 2 do redis.call('ZREM', KEYS[3], tag .. popped[j]) end
  end
end
local function merge_clock()
  local stored = redis.call('GET', KEYS[5])
  if (not counter(stored)) or tonumber(stored) < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[5], ARGV[3])
    return ARGV[3]
  end
  return stored
end
