-- sync.lua's tail (behind prelude.lua and settle.lua's functions, see lua.rs): one round of
-- local-first limits. Applies each key's batched usage with settle.lua's charge (the same
-- arithmetic as algorithm::charge) and returns every key's shared state after it, so the
-- replica replaces its copy with it.
--
-- KEYS[i]  a limit key
-- ARGV     [now_us] only with ScriptClock::Argv (tests); the replica's id and the round's
--          number; then 5 values per key:
--            algorithm code, limit, period_us, burst, amount (units admitted since the last
--            round; 0 only reads the state)
-- Reply    now (the store's clock, decimal), then the state of each key (decide.lua's layout,
--          '' when none), one per line

--
-- Exactly once: a round whose reply was lost (a timeout while Redis was frozen, which then
-- applied it) is sent again as it was, same number; each key remembers, per replica, the last
-- round applied to it (a hash at KEYS[i] .. ':sync', in the key's slot), and a round applied
-- already is not charged again.

local SYNC_MARKER_MS = 600000 -- how long a round's number is remembered (10 minutes)

local replica, round = ARGV[base + 1], ARGV[base + 2]
local reply = { num(now) }
for i = 1, #KEYS do
  local a = base + 2 + 5 * (i - 1)
  local amount = ARGV[a + 5] + 0
  if amount > 0 then
    local marker = KEYS[i] .. ':sync'
    if redis.call('HGET', marker, replica) ~= round then
      settle(KEYS[i], ARGV[a + 1] + 0, ARGV[a + 2] + 0, ARGV[a + 3] + 0, ARGV[a + 4] + 0, 2,
        amount, 0)
      redis.call('HSET', marker, replica, round)
      redis.call('PEXPIRE', marker, SYNC_MARKER_MS + TTL_SLACK_MS)
    end
  end
  local v = redis.pcall('GET', KEYS[i])
  -- A value with a line break is no state of ours (ours are numbers and spaces): foreign,
  -- so idle, like none.
  if type(v) ~= 'string' or string.find(v, '\n', 1, true) then
    v = ''
  end
  reply[#reply + 1] = v
end
-- One string, a line per value: redis-rs parses an array reply element by element (most of
-- a round's cost per key), a string at the cost of one.
return table.concat(reply, '\n')
