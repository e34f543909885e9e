-- refresh.lua: extends live concurrency leases to a full lease TTL from now (long requests).
-- Mirrors algorithm::refresh and MemoryStore::refresh.
--
-- KEYS[i]  the concurrency key the lease was taken on
-- ARGV     [now_us] only when built with ScriptClock::Argv (tests), otherwise TIME is used;
--          then per lease i, at base + 2 * (i - 1) + 1 .. + 2: period_us (the lease TTL), lease id
-- Reply    per lease: 1 if it was live and got extended, 0 if unknown or already expired
--          (an expired lease is never revived: its slot may have been given away)

local CLOCK = 'redis' -- @clock (replaced by refresh_script_source)

local now, base
if CLOCK == 'argv' then
  now = tonumber(ARGV[1])
  base = 1
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  base = 0
end

-- See decide.lua: with an injected clock, real-time expiry must not outrun the fake clock.
local TTL_SLACK_MS = 0
if CLOCK == 'argv' then
  TTL_SLACK_MS = 3600000
end

local function num(x)
  return string.format('%.0f', x)
end

-- floor(a / b) for a >= 0, b > 0, corrected in case the double quotient rounded (as decide.lua).
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

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
