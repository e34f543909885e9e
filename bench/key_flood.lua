-- wrk script for bench/key_flood.sh: GET PATH_ with a new X-User on every request, so N
-- requests carry N distinct identities (each thread counts from its own offset).
local path = os.getenv("FLOOD_PATH") or "/login"
local threads = 0
function setup(thread)
  thread:set("base", threads * 100000000)
  threads = threads + 1
end
local n = 0
function request()
  n = n + 1
  return wrk.format("GET", path, { ["Host"] = "bench", ["X-User"] = "flood-" .. (base + n) })
end
