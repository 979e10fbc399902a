-- Drop an entry whatever its state (KEYS: due, meta, msg, released; ARGV: id). Returns 1.
-- A script, not MULTI: one call on any Redis, Cluster included (redis-py 5's cluster client
-- has no transactions).

redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
