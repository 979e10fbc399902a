-- Follows revoke_common.lua.
-- KEYS: revoked stamps log seq clock epoch. ARGV: now max clock new_epoch
-- Returns {epoch, seq, clock}.

trim(KEYS[1], 'i:')
trim(KEYS[2], 's:')
return {redis.call('GET', KEYS[6]), redis.call('GET', KEYS[4]) or '0', merge_clock()}
