-- Follows revoke_common.lua.
-- KEYS: revoked stamps log seq clock epoch. ARGV: now max clock new_epoch after_seq limit
-- -> epoch, seq, clock, the seq read up to, JSON [ids, stamps] (flat member/expiry lists)

local out = {redis.call('GET', KEYS[6]), redis.call('GET', KEYS[4]) or '0', merge_clock()}
local limit = tonumber(ARGV[6])
local changed = redis.call(
  'ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[5], '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local ids, stamps = {}, {}
for j = 1, #changed, 2 do
  local tagged = changed[j]
  local member = string.sub(tagged, 3)
  local key, into = KEYS[1], ids
  if string.sub(tagged, 1, 2) == 's:' then key, into = KEYS[2], stamps end
  local expiry = redis.call('ZSCORE', key, member)
  if expiry and tonumber(expiry) > now then
    table.insert(into, member)
    table.insert(into, expiry)
  end
end
if #changed < 2 * limit then
  table.insert(out, out[2])  -- every change read
else
  table.insert(out, changed[#changed])
end
table.insert(out, cjson.encode({ids, stamps}))
return out
