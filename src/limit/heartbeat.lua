-- heartbeat.lua (behind prelude.lua): one replica's heartbeat for local-first limits, the
-- number of replicas alive, and how far every live replica's writes have reached. Two keys
-- under one hash tag, so they live in one Cluster slot.
--
-- KEYS[1]  <prefix>{replicas}: the sorted set of live replicas, scored by expiry
-- KEYS[2]  <prefix>{replicas}:written: per replica, the tick (store µs) of its last write
--          acknowledged in full
-- ARGV     replica id, ttl_us (how long this heartbeat counts), written (this replica's tick
--          to record; below 0: none yet)
-- Reply    { the number of replicas whose heartbeat has not expired (this one included),
--            the oldest written tick among them (0 when one has none), as a decimal string }
--
-- A replica records its tick only once its write of that tick was acknowledged, so a reader
-- that finds every live replica at tick t knows that the shared states it reads next hold
-- every replica's usage up to t (a complete view); else the view is partial.

local id, ttl, written = ARGV[base + 1], ARGV[base + 2] + 0, ARGV[base + 3] + 0
redis.call('ZADD', KEYS[1], num(now + ttl), id)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now))
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
  redis.call('HDEL', KEYS[2], unpack(gone))
end
if written >= 0 then
  redis.call('HSET', KEYS[2], id, num(written))
end
local life = num(idiv(ttl + 999, 1000) + TTL_SLACK_MS)
redis.call('PEXPIRE', KEYS[1], life)
redis.call('PEXPIRE', KEYS[2], life)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local ticks = redis.call('HMGET', KEYS[2], unpack(live))
local oldest = nil
for i = 1, #live do
  local t = tonumber(ticks[i]) or 0
  if oldest == nil or t < oldest then
    oldest = t
  end
end
return { #live, num(oldest or 0) }
