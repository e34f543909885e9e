-- decide.lua: checks all limits of one request atomically inside Redis, and writes the new
-- states only if no enforcing limit denies (a denied request consumes nothing anywhere).
-- It mirrors src/limit/algorithm.rs line by line: keep the two in step (the equivalence test
-- drives both with the same traffic and compares every verdict).
--
-- KEYS[i]  key of check i, used as given (the caller prefixes, escapes and hash-tags it).
-- ARGV     [now_us]    only when built with ScriptClock::Argv (tests); otherwise the time is
--                      read with TIME, the store's clock, never the proxy's.
--          then 7 values per check i, at base + 7 * (i - 1) + 1 .. + 7:
--            algorithm code (1 fixed_window, 2 sliding_log, 3 sliding_window, 4 token_bucket,
--                            5 gcra, 6 concurrency),
--            limit, period_us, burst, cost, shadow (0/1),
--            lease id (decimal u64: kept as a string, it does not fit a double; 0 if unused)
-- Reply    {allowed, then per check: allowed, limit, remaining, reset_after_us, retry_after_us}
--
-- Numbers are doubles: every intermediate is an integer below 2^53 as long as the params pass
-- params_fit() (max(limit, burst, cost) * period_us <= 2^49), and every number sent back to
-- Redis is formatted with %.0f because Lua's default formatting rounds to 14 digits.
--
-- State layout (the algorithm is part of it: a state written by another algorithm is idle,
-- exactly as in algorithm.rs, and is replaced on commit). The counters are one string each, so
-- a decision reads them with one GET and writes them with one SET ... PX (no TYPE probe, no
-- separate PEXPIRE): each command a script runs costs Redis about a microsecond of dispatch.
--   fixed_window    string "1 <window> <count>"
--   sliding_log     zset   member "L<time>:<seq>" score time, one per unit; seq counts the
--                          entries already at that time, which only grow until all of them
--                          are trimmed together, so a member never repeats
--   sliding_window  string "3 <window> <current> <previous>"
--   token_bucket    string "4 <scaled tokens> <updated_at>"
--   gcra            string "5 <tat>"
--   concurrency     zset   member "C<lease id>:<units>" score expires_at
-- Every key written expires after its TTL in milliseconds, rounded up (never 0); a state
-- whose TTL is 0 is idle and its key is deleted instead.

-- (prelude.lua, prepended: CLOCK, now, base, TTL_SLACK_MS, num, idiv)

-- A peek (`tollgate explain --live`) runs the same arithmetic and writes nothing.
local COMMIT = true -- @commit

local function ceil_div(a, b)
  return idiv(a + b - 1, b)
end

local function px(ttl)
  return num(ceil_div(ttl, 1000) + TTL_SLACK_MS)
end

-- The numbers of check c's string state if it was written by the same algorithm (`pattern`
-- captures them), else nil: missing, another algorithm's string, or another Redis type (GET
-- fails on it, hence pcall). A foreign state needs no cleanup: SET replaces any type.
local function load_string(c, pattern)
  local v = redis.pcall('GET', c.key)
  if type(v) ~= 'string' then
    return nil
  end
  return string.match(v, pattern)
end

-- True if check c's key holds a zset of members tagged `tag`. Any other existing key (another
-- Redis type, or another algorithm's members) is marked foreign: deleted before the commit.
local function own_zset(c, tag)
  local first = redis.pcall('ZRANGE', c.key, 0, 0)
  if first.err then
    c.foreign = true
    return false
  end
  if first[1] == nil then
    return false
  end
  if string.sub(first[1], 1, 1) ~= tag then
    c.foreign = true
    return false
  end
  return true
end

-- Writes check c's string state with its TTL, or deletes an idle one.
local function store_string(c, state)
  if c.ttl > 0 then
    redis.call('SET', c.key, state, 'PX', px(c.ttl))
  else
    redis.call('DEL', c.key)
  end
end

local function verdict(c, allowed, limit, remaining, reset, retry, ttl, write)
  c.allowed = allowed
  c.limit_out = limit
  c.remaining = math.max(remaining, 0)
  c.reset = reset
  if allowed then
    c.retry = 0
  else
    c.retry = retry
  end
  c.ttl = ttl
  c.write = write
end

local function fixed_window(c)
  local limit, period, cost = c.limit, c.period, c.cost
  local window = idiv(now, period)
  local stop = (window + 1) * period
  local count = 0
  local w, n = load_string(c, '^1 (%-?%d+) (%-?%d+)$')
  if w and tonumber(w) == window then
    count = tonumber(n)
  end
  local allowed = count + cost <= limit
  local after = count
  if allowed then
    after = count + cost
  end
  local reset = 0
  if after > 0 then
    reset = stop - now
  end
  local retry = stop - now
  if cost > limit then
    retry = -1
  end
  verdict(c, allowed, limit, limit - after, reset, retry, stop - now, function()
    store_string(c, '1 ' .. num(window) .. ' ' .. num(after))
  end)
end

local function sliding_log(c)
  local limit, period, cost = c.limit, c.period, c.cost
  local mine = own_zset(c, 'L')
  -- An entry at t counts while now < t + period; older ones are trimmed only on commit.
  local cutoff = now - period
  local live = '(' .. num(cutoff)
  local count = 0
  local newest = nil
  if mine then
    count = redis.call('ZCOUNT', c.key, live, '+inf')
    if count > 0 then
      newest = tonumber(redis.call('ZRANGE', c.key, -1, -1, 'WITHSCORES')[2])
    end
  end
  local allowed = count + cost <= limit
  local retry = -1
  if allowed then
    if cost > 0 and (newest == nil or newest < now) then
      newest = now
    end
  elseif cost <= limit then
    -- The oldest `count + cost - limit` entries must leave first.
    local j = count + cost - limit
    local e = redis.call('ZRANGEBYSCORE', c.key, live, '+inf', 'WITHSCORES', 'LIMIT', j - 1, 1)
    retry = tonumber(e[2]) + period - now
  end
  local after = count
  if allowed then
    after = count + cost
  end
  local reset = 0
  if after > 0 then
    reset = newest + period - now
  end
  verdict(c, allowed, limit, limit - after, reset, retry, reset, function()
    if c.foreign then
      redis.call('DEL', c.key)
    end
    redis.call('ZREMRANGEBYSCORE', c.key, '-inf', num(cutoff))
    if c.ttl <= 0 then
      redis.call('DEL', c.key)
      return
    end
    local seq = redis.call('ZCOUNT', c.key, num(now), num(now))
    local at = num(now)
    local i = 0
    while i < cost do
      local args = {}
      local n = math.min(cost - i, 500)
      for k = 1, n do
        args[2 * k - 1] = at
        args[2 * k] = 'L' .. at .. ':' .. num(seq + i + k)
      end
      redis.call('ZADD', c.key, unpack(args))
      i = i + n
    end
    redis.call('PEXPIRE', c.key, px(c.ttl))
  end)
end

local function sliding_window(c)
  local limit, period, cost = c.limit, c.period, c.cost
  local window = idiv(now, period)
  local elapsed = now - window * period
  local previous, current = 0, 0
  local w, n, p = load_string(c, '^3 (%-?%d+) (%-?%d+) (%-?%d+)$')
  if w then
    w = tonumber(w)
    if w == window then
      previous, current = tonumber(p), tonumber(n)
    elseif w == window - 1 then
      previous, current = tonumber(n), 0
    end
  end
  -- The first test keeps the products bounded (and alone decides most denials).
  local allowed = current + cost <= limit
    and previous * (period - elapsed) + (current + cost) * period <= limit * period
  local after = current
  if allowed then
    after = current + cost
  end
  local left = limit * period - previous * (period - elapsed) - after * period
  local remaining = 0
  if left > 0 then
    remaining = idiv(left, period)
  end
  local reset = 0
  if after > 0 then
    reset = 2 * period - elapsed
  elseif previous > 0 then
    reset = period - elapsed
  end
  local retry = -1
  if (not allowed) and cost <= limit then
    -- Still in this window: previous * (period - e) <= (limit - current - cost) * period.
    if current + cost <= limit and previous > 0 then
      local allowance = idiv((limit - current - cost) * period, previous)
      local e = math.max(period - allowance, elapsed)
      if e < period then
        retry = e - elapsed
      end
    end
    -- Next window: current * (period - e) <= (limit - cost) * period.
    if retry < 0 then
      local e = 0
      if current > 0 then
        e = math.max(period - idiv((limit - cost) * period, current), 0)
      end
      retry = period - elapsed + e
    end
  end
  verdict(c, allowed, limit, remaining, reset, retry, 2 * period - elapsed, function()
    store_string(c, '3 ' .. num(window) .. ' ' .. num(after) .. ' ' .. num(previous))
  end)
end

local function token_bucket(c)
  local limit, period, cost, burst = c.limit, c.period, c.cost, c.burst
  local cap = burst * period
  local scaled, updated_at = cap, now
  local stored, at = load_string(c, '^4 (%-?%d+) (%-?%d+)$')
  if stored then
    stored, at = tonumber(stored), tonumber(at)
    -- A clock that stepped back refills nothing (and must not refill twice later).
    local elapsed = math.max(now - at, 0)
    updated_at = math.max(now, at)
    local missing = cap - stored
    -- Comparing against the time to full first keeps `elapsed * limit` bounded.
    if missing <= 0 or elapsed >= ceil_div(missing, limit) then
      scaled = cap
    else
      scaled = stored + elapsed * limit
    end
  end
  local retry = -1
  local allowed = cost <= burst and scaled >= cost * period
  if allowed then
    scaled = scaled - cost * period
  elseif cost <= burst then
    retry = ceil_div(cost * period - scaled, limit)
  end
  local reset = ceil_div(cap - scaled, limit)
  verdict(c, allowed, burst, idiv(scaled, period), reset, retry, reset, function()
    store_string(c, '4 ' .. num(scaled) .. ' ' .. num(updated_at))
  end)
end

local function gcra(c)
  local limit, period, cost, burst = c.limit, c.period, c.cost, c.burst
  local interval = idiv(period, limit)
  local dvt = interval * burst
  local increment = interval * cost
  -- A stale tat (before now) is an idle key.
  local tat = now
  local s = load_string(c, '^5 (%-?%d+)$')
  if s then
    tat = math.max(tonumber(s), now)
  end
  local new_tat = tat + increment
  local allow_at = new_tat - dvt
  local diff = now - allow_at
  local allowed, ttl, retry, stored
  if diff < 0 then
    retry = -1
    if increment <= dvt then
      retry = -diff
    end
    allowed, ttl, stored = false, tat - now, tat
  else
    allowed, ttl, retry, stored = true, new_tat - now, 0, new_tat
  end
  local next = dvt - ttl
  local remaining = 0
  if next > 0 then
    remaining = idiv(next, interval)
  end
  verdict(c, allowed, burst, remaining, ttl, retry, ttl, function()
    store_string(c, '5 ' .. num(stored))
  end)
end

local function concurrency(c)
  local limit, period, cost = c.limit, c.period, c.cost
  local count = 0
  local earliest, latest = nil, nil
  if own_zset(c, 'C') then
    local live = redis.call('ZRANGEBYSCORE', c.key, '(' .. num(now), '+inf', 'WITHSCORES')
    for i = 1, #live, 2 do
      count = count + tonumber(string.match(live[i], ':(%d+)$'))
      local at = tonumber(live[i + 1])
      if earliest == nil then
        earliest = at
      end
      latest = at
    end
  end
  local allowed = count + cost <= limit
  local retry = -1
  if allowed then
    if latest == nil or latest < now + period then
      latest = now + period
    end
  elseif cost <= limit then
    -- A lower bound when several leases must go, an upper one if a release comes first.
    retry = (earliest or now) - now
  end
  local after = count
  if allowed then
    after = count + cost
  end
  local ttl = (latest or now) - now
  verdict(c, allowed, limit, limit - after, 0, retry, ttl, function()
    if c.foreign then
      redis.call('DEL', c.key)
    end
    redis.call('ZREMRANGEBYSCORE', c.key, '-inf', num(now))
    redis.call('ZADD', c.key, num(now + period), 'C' .. c.lease .. ':' .. num(cost))
    redis.call('PEXPIRE', c.key, px(c.ttl))
  end)
end

local ALGORITHMS = {
  [1] = fixed_window,
  [2] = sliding_log,
  [3] = sliding_window,
  [4] = token_bucket,
  [5] = gcra,
  [6] = concurrency,
}

-- One request's decision: its n checks are KEYS[k0 + 1 ..] and their seven values each start
-- at ARGV[a0 + 1]. Returns the reply of the single form, or nil and a message.
local function decide(k0, a0, n)
  local checks = {}
  local allowed = true
  for i = 1, n do
    local a = a0 + 7 * (i - 1)
    local c = {
      key = KEYS[k0 + i],
      code = tonumber(ARGV[a + 1]),
      limit = tonumber(ARGV[a + 2]),
      period = tonumber(ARGV[a + 3]),
      burst = tonumber(ARGV[a + 4]),
      cost = tonumber(ARGV[a + 5]),
      shadow = ARGV[a + 6] == '1',
      lease = ARGV[a + 7],
      foreign = false,
    }
    local algorithm = ALGORITHMS[c.code]
    if algorithm == nil then
      return nil, 'decide.lua: unknown algorithm code ' .. tostring(ARGV[a + 1])
    end
    algorithm(c)
    if not c.allowed and not c.shadow then
      allowed = false
    end
    checks[i] = c
  end

  local reply = { 0 }
  if allowed then
    reply[1] = 1
    for i = 1, #checks do
      -- A denying shadow limit is not consumed.
      if COMMIT and checks[i].allowed then
        checks[i].write()
      end
    end
  end
  for i = 1, #checks do
    local c = checks[i]
    local ok = 0
    if c.allowed then
      ok = 1
    end
    local r = #reply
    reply[r + 1] = ok
    reply[r + 2] = c.limit_out
    reply[r + 3] = c.remaining
    reply[r + 4] = c.reset
    reply[r + 5] = c.retry
  end
  return reply
end

-- The batch form (redis_store.rs switches this line; coalescing sends it): several requests'
-- decisions, one after another on the one reading of the clock above, each all-or-nothing
-- over its own checks, exactly as if they had come in separate calls in this order.
-- ARGV after the time: the number of decisions, then per decision its number of checks and
-- its seven values per check. KEYS: every decision's keys in order. Reply: the single
-- form's replies, one after another.
local BATCH = false -- @batch

if not BATCH then
  local reply, err = decide(0, base, #KEYS)
  if reply == nil then
    return redis.error_reply(err)
  end
  return reply
end

local out = {}
local k, a = 0, base + 1
for _ = 1, tonumber(ARGV[a]) do
  local n = tonumber(ARGV[a + 1])
  local reply, err = decide(k, a + 1, n)
  if reply == nil then
    return redis.error_reply(err)
  end
  for j = 1, #reply do
    out[#out + 1] = reply[j]
  end
  k, a = k + n, a + 1 + 7 * n
end
return out
