-- prelude.lua: the clock and number helpers that decide.lua and refresh.lua share. Redis
-- scripts cannot include one another, so redis_store.rs prepends this file to each of them.

local CLOCK = 'redis' -- @clock (replaced for tests by ScriptClock::Argv)

-- Strings that hold numbers (ARGV, TIME's reply, the fields of a state) become numbers by
-- arithmetic (`s + 0`), not by tonumber(s), which parses them twice (lua_isnumber, then
-- lua_tonumber): C's strtod alone was 8% of Redis's instructions per decision.
-- Added to TIME: 0 except in debug builds run with TOLLGATE_TEST_CLOCK_OFFSET_MS (tests that
-- stand just before a calendar window turns); lua.rs switches this line.
local OFFSET_US = 0 -- @offset
local now, base
if CLOCK == 'argv' then
  now = ARGV[1] + 0
  base = 1
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] + OFFSET_US
  base = 0
end

-- With an injected clock, keys would still expire on Redis's real clock and could vanish
-- before the fake clock reaches their TTL; an expired state is idle anyway, so keeping keys
-- longer is unobservable, while losing them early is not.
local TTL_SLACK_MS = 0
if CLOCK == 'argv' then
  TTL_SLACK_MS = 3600000
end

-- Library functions the hot paths call, as locals (one lookup less per call).
local format, floor = string.format, math.floor

-- Every number sent back to Redis goes through here, exactly: Lua's default formatting keeps
-- only 14 digits and would corrupt microsecond timestamps (16). Callers pass integers below
-- 2^53 (see params_fit), which '%d' prints exactly, as '%.0f' did, for less than half the
-- cost (no float printing); but '%d' converts through a C long, 32 bits on some platforms
-- Redis runs on, so a number of 1e9 or more is printed as two halves of at most 9 digits.
-- (The one difference from '%.0f': -0 prints as 0; no state or argument is ever -0.)
local function num(x)
  if x < 1e9 and x > -1e9 then
    return format('%d', x)
  end
  if x < 0 then
    return '-' .. num(-x)
  end
  local high = floor(x / 1e9)
  local low = x - high * 1e9
  -- The quotient can only have been rounded up (to the next integer).
  if low < 0 then
    high, low = high - 1, low + 1e9
  end
  return format('%d%09d', high, low)
end

-- A reply of integers as ONE string, each integer after a space (' 1 100 99 0 0 17...'),
-- which lua.rs's PackedInts reads back. redis-rs parses an array reply element by element
-- (about 800 proxy instructions per integer: 5,600 for a one-check decision), a string at
-- about the cost of one element; building the string costs Redis about 0.4 µs per call
-- (one format for the whole reply). '%d' truncates a fractional value toward zero, as
-- Redis's own conversion of a Lua number to an integer reply does. Where a C long has 32
-- bits '%d' would wrap (see num above), so each value goes through num instead.
local function packed(values)
  local n = #values
  if n <= 64 and format('%d', 2 ^ 53) == '9007199254740992' then
    return format(string.rep(' %d', n), unpack(values))
  end
  local parts = {}
  for i = 1, n do
    parts[i] = num(values[i] >= 0 and floor(values[i]) or -floor(-values[i]))
  end
  return ' ' .. table.concat(parts, ' ')
end

-- floor(a / b) for a >= 0, b > 0, corrected in case the double quotient rounded.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- token_bucket's refill, as algorithm::token_bucket computes it: from a stored state string
-- `v` ('4 <scaled> <at>'), the scaled tokens at `now` (capped at `cap` = burst * period) and
-- the time they are counted at; nil when no token_bucket state is stored. decide.lua and
-- settle.lua both read the bucket through this one function.
local function token_refill(v, now, limit, cap)
  local stored, at
  if v then
    stored, at = string.match(v, '^4 (%-?%d+) (%-?%d+)$')
  end
  if not stored then
    return nil
  end
  stored, at = stored + 0, at + 0
  -- A clock that stepped back refills nothing (and must not refill twice later).
  local elapsed = math.max(now - at, 0)
  local updated_at = math.max(now, at)
  local missing = cap - stored
  -- Comparing against the time to full first keeps `elapsed * limit` bounded.
  -- (idiv(a + b - 1, b) is algorithm.rs's ceil_div(a, b).)
  if missing <= 0 or elapsed >= idiv(missing + limit - 1, limit) then
    return cap, updated_at
  end
  return stored + elapsed * limit, updated_at
end
