-- heartbeat.lua (behind prelude.lua): one replica's heartbeat for local-first limits, and
-- the number of replicas alive. One sorted set, so it lives in one Cluster slot.
--
-- KEYS[1]  <prefix>{replicas}
-- ARGV     replica id, ttl_us (how long this heartbeat counts)
-- Reply    the number of replicas whose heartbeat has not expired (this one included)

local id, ttl = ARGV[base + 1], ARGV[base + 2] + 0
redis.call('ZADD', KEYS[1], num(now + ttl), id)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
redis.call('PEXPIRE', KEYS[1], num(idiv(ttl + 999, 1000) + TTL_SLACK_MS))
return redis.call('ZCARD', KEYS[1])
