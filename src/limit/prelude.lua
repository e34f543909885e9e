-- prelude.lua: the clock and number helpers that decide.lua and refresh.lua share. Redis
-- scripts cannot include one another, so redis_store.rs prepends this file to each of them.

local CLOCK = 'redis' -- @clock (replaced for tests by ScriptClock::Argv)

local now, base
if CLOCK == 'argv' then
  now = tonumber(ARGV[1])
  base = 1
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  base = 0
end

-- With an injected clock, keys would still expire on Redis's real clock and could vanish
-- before the fake clock reaches their TTL; an expired state is idle anyway, so keeping keys
-- longer is unobservable, while losing them early is not.
local TTL_SLACK_MS = 0
if CLOCK == 'argv' then
  TTL_SLACK_MS = 3600000
end

-- Every number sent back to Redis goes through here: Lua's default formatting keeps only 14
-- digits and would corrupt microsecond timestamps.
local function num(x)
  return string.format('%.0f', x)
end

-- floor(a / b) for a >= 0, b > 0, corrected in case the double quotient rounded.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
