-- refresh.lua: extends live concurrency leases to a full lease TTL from now (long requests).
-- Mirrors algorithm::refresh and MemoryStore::refresh.
--
-- KEYS[i]  the concurrency key the lease was taken on
-- ARGV     [now_us] only when built with ScriptClock::Argv (tests), otherwise TIME is used;
--          then per lease i, at base + 2 * (i - 1) + 1 .. + 2: period_us (the lease TTL), lease id
-- Reply    per lease: 1 if it was live and got extended, 0 if unknown or already expired
--          (an expired lease is never revived: its slot may have been given away)

-- (prelude.lua, prepended: CLOCK, now, base, TTL_SLACK_MS, format, floor, num, idiv)

local reply = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local period = tonumber(ARGV[base + 2 * (i - 1) + 1])
  local prefix = 'C' .. ARGV[base + 2 * (i - 1) + 2] .. ':'
  local ok = 0
  if redis.call('TYPE', key).ok == 'zset' then
    local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for j = 1, #all, 2 do
      if string.sub(all[j], 1, #prefix) == prefix and tonumber(all[j + 1]) > now then
        redis.call('ZADD', key, 'XX', num(now + period), all[j])
        ok = 1
      end
    end
    if ok == 1 then
      local ttl = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) - now
      local ms = idiv(ttl + 999, 1000) + TTL_SLACK_MS
      if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, num(ms))
      end
    end
  end
  reply[i] = ok
end
return reply
