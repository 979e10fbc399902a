-- Follows revoke_common.lua.
-- KEYS: revoked stamps log seq clock epoch
-- ARGV: now max clock new_epoch n_ids (id expiry)*n_ids (stamp expiry)*
-- Returns {entries changed, seq, clock}.

local changed = 0
local function put(key, tag, member, expiry)
  local old = redis.call('ZSCORE', key, member)
  if tonumber(expiry) > now and ((not old) or tonumber(old) < tonumber(expiry)) then
    redis.call('ZADD', key, expiry, member)
    local seq = redis.call('INCR', KEYS[4])
    redis.call('ZADD', KEYS[3], seq, tag .. member)
    changed = changed + 1
  end
end
local n_ids = tonumber(ARGV[5])
local i = 6
for _ = 1, n_ids do put(KEYS[1], 'i:', ARGV[i], ARGV[i + 1]); i = i + 2 end
while i < #ARGV do put(KEYS[2], 's:', ARGV[i], ARGV[i + 1]); i = i + 2 end
trim(KEYS[1], 'i:')
trim(KEYS[2], 's:')
return {changed, redis.call('GET', KEYS[4]) or '0', merge_clock()}
