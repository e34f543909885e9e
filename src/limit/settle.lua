-- settle.lua: applies settlements after the response is known, mirroring algorithm::settle
-- (refund and charge) line by line: keep the two in step (the equivalence test interleaves
-- settlements with decisions and compares every verdict that follows).
--
-- KEYS[i]  the key the decision used
-- ARGV     [now_us] only when built with ScriptClock::Argv (tests), otherwise TIME is used;
--          then 7 values per settlement i, at base + 7 * (i - 1) + 1 .. + 7:
--            algorithm code (as in decide.lua), limit, period_us, burst,
--            op (1 refund, 2 charge), amount (already capped at 2^49 by the caller),
--            taken_at (refund: the time decide.lua replied with; 0 for a charge)
-- Reply    the number of states written (or deleted)
--
-- States are read and written in decide.lua's layout. Nothing is written when there is
-- nothing to give back, for a state of another algorithm, or for concurrency (whose leases
-- are released by release.lua) and sliding_log charges (refused by configuration checks).

-- (prelude.lua, prepended: CLOCK, now, base, TTL_SLACK_MS, format, floor, num, idiv,
-- token_refill)

local MAX_PRODUCT = 562949953421312 -- 2^49, algorithm::MAX_PRODUCT
local SLIDING_CAP_NUM = 2251799813685248 -- 2^51, MAX_SAFE / 4

-- Stores a string state for `ttl` µs (deleted when ttl <= 0), as decide.lua commits. Returns
-- 1 (a state written), then the value now at the key ('' once deleted): sync.lua replies it
-- instead of reading the key back (settle.lua's loop adds up the first value only).
local function put(key, state, ttl)
  if ttl > 0 then
    redis.call('SET', key, state, 'PX', num(idiv(ttl + 999, 1000) + TTL_SLACK_MS))
    return 1, state
  end
  redis.call('DEL', key)
  return 1, ''
end

local function settle(key, code, limit, period, burst, op, amount, taken_at)
  local v = nil
  if code == 1 or code == 3 or code == 4 or code == 5 then
    v = redis.pcall('GET', key)
    if type(v) ~= 'string' then
      v = nil
    end
  end
  local refund = op == 1

  if code == 1 then
    -- fixed_window
    local window = idiv(now, period)
    local stop = (window + 1) * period
    local w, n
    if v then
      w, n = string.match(v, '^1 (%-?%d+) (%-?%d+)$')
    end
    local count = 0
    if w and w + 0 == window then
      count = n + 0
    elseif refund then
      return 0
    end
    if refund then
      if idiv(taken_at, period) ~= window then
        return 0
      end
      count = math.max(count - amount, 0)
    else
      count = math.min(count + amount, MAX_PRODUCT)
    end
    return put(key, '1 ' .. num(window) .. ' ' .. num(count), stop - now)
  elseif code == 3 then
    -- sliding_window
    local window = idiv(now, period)
    local elapsed = now - window * period
    local previous, current = 0, 0
    local known = false
    local w, n, p
    if v then
      w, n, p = string.match(v, '^3 (%-?%d+) (%-?%d+) (%-?%d+)$')
    end
    if w then
      w = w + 0
      if w == window then
        previous, current, known = p + 0, n + 0, true
      elseif w == window - 1 then
        previous, current, known = n + 0, 0, true
      end
    end
    if refund then
      if not known then
        return 0
      end
      local taken = idiv(taken_at, period)
      if taken == window then
        current = math.max(current - amount, 0)
      elseif taken == window - 1 then
        previous = math.max(previous - amount, 0)
      else
        return 0
      end
    else
      local cap = idiv(SLIDING_CAP_NUM, period)
      current = math.min(current + math.min(amount, cap), cap)
    end
    return put(key, '3 ' .. num(window) .. ' ' .. num(current) .. ' ' .. num(previous),
      2 * period - elapsed)
  elseif code == 4 then
    -- token_bucket (the refill is decide.lua's: prelude.lua's token_refill)
    local cap = burst * period
    local scaled, updated_at = token_refill(v, now, limit, cap)
    if not scaled then
      if refund then
        return 0
      end
      scaled, updated_at = cap, now
    end
    local units = math.min(amount, idiv(MAX_PRODUCT, period)) * period
    if refund then
      scaled = math.min(scaled + units, cap)
    else
      scaled = math.max(scaled - units, -MAX_PRODUCT)
    end
    return put(key, '4 ' .. num(scaled) .. ' ' .. num(updated_at),
      idiv(cap - scaled + limit - 1, limit))
  elseif code == 5 then
    -- gcra
    local interval = idiv(period, limit)
    local tat = now
    local s = v and string.match(v, '^5 (%-?%d+)$')
    if s then
      tat = math.max(s + 0, now)
    elseif refund then
      return 0
    end
    local shift = math.min(amount, idiv(MAX_PRODUCT, interval)) * interval
    if refund then
      tat = math.max(tat - shift, now)
    else
      tat = math.min(tat + shift, now + MAX_PRODUCT)
    end
    return put(key, '5 ' .. num(tat), tat - now)
  elseif code == 2 and refund then
    -- sliding_log: remove up to `amount` of the entries taken at taken_at, the ones with the
    -- highest sequence numbers, so decide.lua's next member name at that time stays unique.
    if taken_at <= now - period then
      return 0
    end
    local first = redis.pcall('ZRANGE', key, 0, 0)
    if first.err or first[1] == nil or string.sub(first[1], 1, 1) ~= 'L' then
      return 0
    end
    local at = num(taken_at)
    local members = redis.call('ZRANGEBYSCORE', key, at, at)
    if #members == 0 then
      return 0
    end
    local seqs = {}
    for i = 1, #members do
      seqs[i] = string.match(members[i], ':(%d+)$') + 0
    end
    table.sort(seqs)
    local i = #seqs
    while i >= 1 and amount > 0 do
      redis.call('ZREM', key, 'L' .. at .. ':' .. num(seqs[i]))
      i = i - 1
      amount = amount - 1
    end
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[2] ~= nil then
      local reset = newest[2] + period - now
      if reset <= 0 then
        redis.call('DEL', key)
      else
        redis.call('PEXPIRE', key, num(idiv(reset + 999, 1000) + TTL_SLACK_MS))
      end
    end
    return 1
  end
  return 0
end

local written = 0
for i = 1, #KEYS do
  local a = base + 7 * (i - 1)
  written = written + settle(
    KEYS[i],
    ARGV[a + 1] + 0,
    ARGV[a + 2] + 0,
    ARGV[a + 3] + 0,
    ARGV[a + 4] + 0,
    ARGV[a + 5] + 0,
    ARGV[a + 6] + 0,
    ARGV[a + 7] + 0
  )
end
return written
