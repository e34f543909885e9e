-- decide.lua: checks all limits of one request atomically inside Redis, and writes the new
-- states only if no enforcing limit denies (a denied request consumes nothing anywhere).
-- It mirrors src/limit/algorithm.rs line by line: keep the two in step (the equivalence test
-- drives both with the same traffic and compares every verdict).
--
-- KEYS[i]  key of check i, used as given (the caller prefixes, escapes and hash-tags it).
-- ARGV     [now_us]    only when built with ScriptClock::Argv (tests); otherwise the time is
--                      read with TIME, the store's clock, never the proxy's.
--          then one value per check i, at base + i: its eight fields in decimal, separated
--          by single spaces:
--            algorithm code (1 fixed_window, 2 sliding_log, 3 sliding_window, 4 token_bucket,
--                            5 gcra, 6 concurrency),
--            limit, period_us, burst, cost, shadow (0/1),
--            lease id (decimal u64: kept as a string, it does not fit a double; 0 if unused),
--            block_us (block_for in microseconds; 0 if none)
--          and, for a calendar fixed_window only, four more: the turns t0 < t1 < t2 < t3 the
--          proxy computed around its own clock (calendar.rs's turns; Lua cannot evaluate time
--          zones); the script picks the window among them that contains its own time
--          (calendar.rs's pick), so the decision stays on the store's clock
--          One argument per check rather than eight: each argument costs the proxy about 200
--          instructions (redis-rs builds and then encodes every one), and Redis about as much
--          to read it as the one string.match that splits the fields costs.
-- Reply    {allowed, then per check: allowed, limit, remaining, reset_after_us, retry_after_us,
--          then the time it decided at (what settle.lua's refunds name as their taken_at)},
--          sent packed into one string by prelude.lua's packed()
--
-- Numbers are doubles: every intermediate is an integer below 2^53 as long as the params pass
-- params_fit() (max(limit, burst, cost) * period_us <= 2^49), and every number sent back to
-- Redis is formatted exactly by num() because Lua's default formatting rounds to 14 digits.
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

-- (prelude.lua, prepended: CLOCK, now, base, TTL_SLACK_MS, format, floor, num, idiv,
-- token_refill)
--
-- Cost. Redis runs this whole file on every call: each `function` statement makes a new closure
-- (and its upvalues) and each table constructor a new table, every time, all garbage for Lua's
-- collector afterwards. Measured on Redis 7.0, a closure, a table, a call of a Lua function or
-- of a library one (string.match, string.format, tonumber...) each cost Redis a few hundred
-- to a couple of thousand instructions, while the arithmetic of a whole check costs about a
-- thousand. Hence: one check() with the algorithms as its branches, not a function for each
-- algorithm and helper; verdicts returned as values, as algorithm.rs returns a tuple, not
-- stored in a table per check; a string state formatted right away once it is known to be
-- written, not by a closure per check; the reply preallocated.

-- A peek (`tollgate explain --live`) runs the same arithmetic and writes nothing.
local COMMIT = true -- @commit

-- Values per check in ARGV (see the header); redis_store.rs's check_arg sends it.
local ARGS = 1
local match = string.match

-- limit::BLOCK_SUFFIX: a limit's block marker is its key followed by this (limit::block_key).
local BLOCK_SUFFIX = ':block'

-- algorithm::step_for: one limit for one request. Each branch mirrors the algorithm.rs function
-- it is named after and returns as it does: the verdict (allowed, limit, remaining, reset,
-- retry; the caller clamps remaining and retry as algorithm::verdict does), the TTL of the new
-- state and, only if `write` (the decision can still commit) and the check allows, the state:
-- a string for the caller to SET with that TTL, or, for a zset, a function that writes it.
-- Nothing for an unknown code.
local function check(key, code, limit, period, burst, cost, lease, write, turns)
  -- A string state is read with one GET and counts only if written by the same algorithm (its
  -- pattern matches): missing, another algorithm's string or another Redis type (GET fails on
  -- it, hence pcall) is idle. A foreign state needs no cleanup: SET replaces any type.
  local v = nil
  if code == 1 or code == 3 or code == 4 or code == 5 then
    v = redis.pcall('GET', key)
    if type(v) ~= 'string' then
      v = nil
    end
  end

  -- A zset state counts if its members are tagged as this algorithm's; any other existing key
  -- (another Redis type, or another algorithm's members) is foreign: deleted before a write.
  local mine, foreign = false, false
  if code == 2 or code == 6 then
    local first = redis.pcall('ZRANGE', key, 0, 0)
    if first.err then
      foreign = true
    elseif first[1] ~= nil then
      local tag = 'L'
      if code == 6 then
        tag = 'C'
      end
      mine = string.sub(first[1], 1, 1) == tag
      foreign = not mine
    end
  end

  if code == 5 then
    -- gcra
    local interval = idiv(period, limit)
    local dvt = interval * burst
    local increment = interval * cost
    -- A stale tat (before now) is an idle key.
    local tat = now
    local s = v and string.match(v, '^5 (%-?%d+)$')
    if s then
      tat = math.max(s + 0, now)
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
    local state
    if write and allowed then
      state = '5 ' .. num(stored)
    end
    return allowed, burst, remaining, ttl, retry, ttl, state
  elseif code == 4 then
    -- token_bucket
    local cap = burst * period
    local scaled, updated_at = token_refill(v, now, limit, cap)
    if not scaled then
      scaled, updated_at = cap, now
    end
    local retry = -1
    local allowed = cost <= burst and scaled >= cost * period
    if allowed then
      scaled = scaled - cost * period
    elseif cost <= burst then
      retry = idiv(cost * period - scaled + limit - 1, limit)
    end
    local reset = idiv(cap - scaled + limit - 1, limit)
    local state
    if write and allowed then
      state = '4 ' .. num(scaled) .. ' ' .. num(updated_at)
    end
    return allowed, burst, idiv(scaled, period), reset, retry, reset, state
  elseif code == 1 then
    -- fixed_window (algorithm::fixed_window_in): the window is its index for a period, its
    -- start instant for a calendar window (calendar::pick, an end never before now + 1)
    local window, stop
    if turns ~= '' then
      local t0, t1, t2, t3 = match(turns, '^ (%d+) (%d+) (%d+) (%d+)$')
      if t0 == nil then
        return nil
      end
      if now < t1 + 0 then
        window, stop = t0 + 0, t1 + 0
      elseif now < t2 + 0 then
        window, stop = t1 + 0, t2 + 0
      else
        window, stop = t2 + 0, t3 + 0
      end
      stop = math.max(stop, now + 1)
    else
      window = idiv(now, period)
      stop = (window + 1) * period
    end
    local count = 0
    local w, n
    if v then
      w, n = string.match(v, '^1 (%-?%d+) (%-?%d+)$')
    end
    if w and w + 0 == window then
      count = n + 0
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
    local state
    if write and allowed then
      state = '1 ' .. num(window) .. ' ' .. num(after)
    end
    return allowed, limit, limit - after, reset, retry, stop - now, state
  elseif code == 3 then
    -- sliding_window
    local window = idiv(now, period)
    local elapsed = now - window * period
    local previous, current = 0, 0
    local w, n, p
    if v then
      w, n, p = string.match(v, '^3 (%-?%d+) (%-?%d+) (%-?%d+)$')
    end
    if w then
      w = w + 0
      if w == window then
        previous, current = p + 0, n + 0
      elseif w == window - 1 then
        previous, current = n + 0, 0
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
    local state
    if write and allowed then
      state = '3 ' .. num(window) .. ' ' .. num(after) .. ' ' .. num(previous)
    end
    return allowed, limit, remaining, reset, retry, 2 * period - elapsed, state
  elseif code == 2 then
    -- sliding_log
    -- An entry at t counts while now < t + period; older ones are trimmed only on commit.
    local cutoff = now - period
    local live = '(' .. num(cutoff)
    local count = 0
    local newest = nil
    if mine then
      count = redis.call('ZCOUNT', key, live, '+inf')
      if count > 0 then
        newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
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
      local e = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', j - 1, 1)
      retry = e[2] + period - now
    end
    local after = count
    if allowed then
      after = count + cost
    end
    local reset = 0
    if after > 0 then
      reset = newest + period - now
    end
    local state
    if write and allowed then
      state = function()
        if foreign then
          redis.call('DEL', key)
        end
        redis.call('ZREMRANGEBYSCORE', key, '-inf', num(cutoff))
        if reset <= 0 then
          redis.call('DEL', key)
          return
        end
        local seq = redis.call('ZCOUNT', key, num(now), num(now))
        local at = num(now)
        local i = 0
        while i < cost do
          local args = {}
          local n = math.min(cost - i, 500)
          for k = 1, n do
            args[2 * k - 1] = at
            args[2 * k] = 'L' .. at .. ':' .. num(seq + i + k)
          end
          redis.call('ZADD', key, unpack(args))
          i = i + n
        end
        -- The TTL in milliseconds, rounded up (ceil_div(reset, 1000)).
        redis.call('PEXPIRE', key, num(idiv(reset + 999, 1000) + TTL_SLACK_MS))
      end
    end
    return allowed, limit, limit - after, reset, retry, reset, state
  elseif code == 6 then
    -- concurrency
    local count = 0
    local earliest, latest = nil, nil
    if mine then
      local live = redis.call('ZRANGEBYSCORE', key, '(' .. num(now), '+inf', 'WITHSCORES')
      for i = 1, #live, 2 do
        count = count + string.match(live[i], ':(%d+)$')
        local at = live[i + 1] + 0
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
    local state
    if write and allowed then
      state = function()
        if foreign then
          redis.call('DEL', key)
        end
        redis.call('ZREMRANGEBYSCORE', key, '-inf', num(now))
        redis.call('ZADD', key, num(now + period), 'C' .. lease .. ':' .. num(cost))
        -- The TTL in milliseconds, rounded up (ceil_div(ttl, 1000)).
        redis.call('PEXPIRE', key, num(idiv(ttl + 999, 1000) + TTL_SLACK_MS))
      end
    end
    return allowed, limit, limit - after, 0, retry, ttl, state
  end
end

-- One request's decision: its n checks are KEYS[k0 + 1 ..], their ARGS values each from
-- ARGV[a0 + 1]. Returns the reply of the single form, or nil and a message.
local function decide(k0, a0, n)
  -- No check, nothing to deny (the reply below is allocated for at least one).
  if n == 0 then
    return { 1, now }
  end
  -- The reply, allocated for one check: filling preallocated slots costs far less than
  -- growing a table. Likewise the writes to commit: key, state and TTL of each, three slots
  -- apiece.
  local reply = { 0, 0, 0, 0, 0, 0, 0 }
  local writes, nwrites = { false, false, false }, 0
  local allowed = true
  for i = 1, n do
    local a = a0 + ARGS * (i - 1)
    local key = KEYS[k0 + i]
    local code, limit_arg, period, burst, cost, shadow, lease, block_arg, turns =
      match(ARGV[a + 1], '^(%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) (%d+)(.*)$')
    if code == nil then
      return nil, 'decide.lua: malformed check ' .. tostring(ARGV[a + 1])
    end
    local ok, limit, remaining, reset, retry, ttl, state = check(
      key,
      code + 0,
      limit_arg + 0,
      period + 0,
      burst + 0,
      cost + 0,
      lease,
      COMMIT and allowed,
      turns
    )
    if ok == nil then
      return nil, 'decide.lua: unknown algorithm code or malformed turns ' .. code
    end
    -- @block begin: block_for (the penalty box), as algorithm::penalty_box. While the
    -- marker's end (store-clock microseconds) is ahead, this limit denies; otherwise a denial
    -- by the limit itself starts a block, written even though the decision is denied.
    local block = block_arg + 0
    if block > 0 then
      local marker = key .. BLOCK_SUFFIX
      local left, start = 0, nil
      local stored = tonumber(redis.pcall('GET', marker))
      if stored and stored > now then
        left = stored - now
      elseif not ok then
        left, start = block, now + block
      end
      if left > 0 then
        if ok then
          retry = 0
        end
        if ok or retry >= 0 then
          retry = math.max(retry, left)
        end
        ok, remaining, reset, state = false, 0, math.max(reset, left), nil
        if COMMIT and start then
          -- The TTL in milliseconds, rounded up (ceil_div(block, 1000)).
          redis.call('SET', marker, num(start), 'PX', num(idiv(block + 999, 1000) + TTL_SLACK_MS))
        end
      end
    end
    -- @block end
    -- As algorithm::verdict: remaining is never negative, retry is 0 when allowed.
    local r = 5 * (i - 1) + 1
    if ok then
      reply[r + 1] = 1
      retry = 0
      if state then
        writes[nwrites + 1] = key
        writes[nwrites + 2] = state
        writes[nwrites + 3] = ttl
        nwrites = nwrites + 3
      end
    else
      reply[r + 1] = 0
      -- A denying shadow limit neither denies nor is consumed.
      if shadow ~= '1' then
        allowed = false
      end
    end
    if remaining < 0 then
      remaining = 0
    end
    reply[r + 2] = limit
    reply[r + 3] = remaining
    reply[r + 4] = reset
    reply[r + 5] = retry
  end

  reply[5 * n + 2] = now
  if allowed then
    reply[1] = 1
    for w = 1, nwrites, 3 do
      local key, state, ttl = writes[w], writes[w + 1], writes[w + 2]
      if type(state) == 'function' then
        state()
      elseif ttl > 0 then
        -- The TTL in milliseconds, rounded up (ceil_div(ttl, 1000)).
        redis.call('SET', key, state, 'PX', num(idiv(ttl + 999, 1000) + TTL_SLACK_MS))
      else
        redis.call('DEL', key)
      end
    end
  end
  return reply
end

-- The batch form (redis_store.rs switches this line; coalescing sends it): several requests'
-- decisions, one after another on the one reading of the clock above, each all-or-nothing
-- over its own checks, exactly as if they had come in separate calls in this order.
-- ARGV after the time: the number of decisions, then per decision its number of checks and
-- its ARGS values per check. KEYS: every decision's keys in order. Reply: the single
-- form's replies, one after another.
local BATCH = false -- @batch

if not BATCH then
  local reply, err = decide(0, base, #KEYS)
  if reply == nil then
    return redis.error_reply(err)
  end
  return packed(reply)
end

local out = {}
local k, a = 0, base + 1
for d = 1, tonumber(ARGV[a]) do
  local n = tonumber(ARGV[a + 1])
  local reply, err = decide(k, a + 1, n)
  if reply == nil then
    return redis.error_reply(err)
  end
  out[d] = packed(reply)
  k, a = k + n, a + 1 + ARGS * n
end
return table.concat(out)
