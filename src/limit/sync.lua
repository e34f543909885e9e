-- sync.lua's tail (behind prelude.lua and settle.lua's functions, see lua.rs): one round of
-- local-first limits. Applies each key's batched usage with settle.lua's charge (the same
-- arithmetic as algorithm::charge) and returns every key's shared state after it, so the
-- replica replaces its copy with it.
--
-- KEYS[i]  a limit key, i = 1 .. n; then KEYS[n + 1], the round marker of the replica for
--          this call's keys (see below), when there is usage to charge
-- ARGV     [now_us] only with ScriptClock::Argv (tests); the round's number; n; then the usage
--          in runs of keys of one limit, in the keys' order: algorithm code, limit, period_us,
--          burst, the run's number of keys c, then c amounts (units admitted since the last
--          round, each above 0). The keys after the last run are only read (all of them in
--          the read 3/4 into the interval).
-- Reply    now (the store's clock, decimal), then the state of each key (decide.lua's layout,
--          '' when none), one per line
--
-- What a round costs Redis is mostly its commands and its arguments (about 0.05 µs each to
-- parse into the script's tables): per key with usage a GET (in settle) and a SET (in put,
-- whose value is the reply) and one argument; per key only read a GET and none; per call
-- the marker's GET and SET, and a limit's parameters once per run rather than once per key.

--
-- Exactly once: a round whose reply was lost (a timeout while Redis was frozen, which then
-- applied it) is sent again as it was, same number, same keys, same amounts. The marker
-- remembers the last round of the replica that this call's keys were charged with, and a
-- round not above it is not charged again. One marker per call, not per key, is enough
-- because a call is applied whole or not at all:
-- - a script runs alone, and its writes replicate together (one MULTI/EXEC to the replicas
--   and the AOF), so a failover keeps either the round and its marker or neither;
-- - the marker is the call's first write, and Redis refuses a script for lack of memory
--   (maxmemory) only at its first write: either nothing is written, or all of it is;
-- - nothing after it can fail: GETs are pcalls, SET overwrites a value of any type.
-- It is correct that a round not above the marker was applied: a replica's round numbers only
-- grow, and it sends a round only once the one before was acknowledged, so the marker holds
-- either this round (a repeat, or a late copy of it that was still queued) or an older one.
--
-- Which keys share a marker is redis_store.rs's choice: one server gets one call per round,
-- with one marker per replica; a Cluster gets one call per hash tag (a script's keys must
-- share a slot), each with a marker of the replica under that tag, so that a resent round
-- skips exactly the calls that were applied, and a slot that moves carries its marker with
-- it. The marker's name holds the replica; its value is the round. (A marker inside each
-- state value would spare the marker's two calls but cannot work: every replica charges the
-- same keys, so a value would have to hold the last round of each replica, since a resend
-- may come after another replica's write, and decide.lua reads the same values.)

local SYNC_MARKER_MS = 600000 -- how long a round's number is remembered (10 minutes)

local round = ARGV[base + 1] + 0
local n = ARGV[base + 2] + 0
local marker = KEYS[n + 1]

-- A key's state as it is. A value with a line break is no state of ours (ours are numbers
-- and spaces): foreign, so idle, like none.
local function read(key)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' or string.find(v, '\n', 1, true) then
    return ''
  end
  return v
end

local reply = { num(now) }
local i = 0 -- keys done
local a = base + 3 -- the next run
if a <= #ARGV then
  if not marker then
    return redis.error_reply('sync.lua: usage without a round marker')
  end
  -- A value that is not a number (not ours) is no round: overwritten.
  local last = tonumber(redis.pcall('GET', marker))
  local applied = last ~= nil and last >= round
  if not applied then
    redis.call('SET', marker, num(round), 'PX', SYNC_MARKER_MS + TTL_SLACK_MS)
  end
  while a <= #ARGV do
    local code, limit, period, burst = ARGV[a] + 0, ARGV[a + 1] + 0, ARGV[a + 2] + 0,
      ARGV[a + 3] + 0
    local count = ARGV[a + 4] + 0
    for j = 1, count do
      i = i + 1
      local v = nil
      if not applied then
        -- put's second value: the state just written; nil where nothing was (an algorithm
        -- settle does not charge), and then the key is read as it is.
        local _, state = settle(KEYS[i], code, limit, period, burst, 2, ARGV[a + 4 + j] + 0, 0)
        v = state
      end
      reply[i + 1] = v or read(KEYS[i])
    end
    a = a + 5 + count
  end
end
for k = i + 1, n do
  reply[k + 1] = read(KEYS[k])
end
-- One string, a line per value: redis-rs parses an array reply element by element (most of
-- a round's cost per key), a string at the cost of one.
return table.concat(reply, '\n')
