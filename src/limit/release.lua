-- release.lua: frees concurrency leases taken by decide.lua.
--
-- KEYS[i]  the concurrency key the lease was taken on
-- ARGV[i]  its lease id (decimal u64, kept as a string)
-- Reply    the number of leases found and removed
--
-- Lease members are "C<lease id>:<units>" (see decide.lua). An unknown or already expired
-- lease is ignored; Redis deletes the key with its last member, which is the idle state.

local removed = 0
for i = 1, #KEYS do
  if redis.call('TYPE', KEYS[i]).ok == 'zset' then
    local prefix = 'C' .. ARGV[i] .. ':'
    for _, m in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
      if string.sub(m, 1, #prefix) == prefix then
        removed = removed + redis.call('ZREM', KEYS[i], m)
      end
    end
  end
end
return removed
