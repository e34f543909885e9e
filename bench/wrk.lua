-- wrk script shared by every server under test, so each one gets exactly the same requests.
-- SCENARIO (environment) picks the traffic:
--   plain    GET /plain/ rotating X-User-Id over 1,000 users (no route, no limit: proxying only)
--   allowed  GET /allowed/ rotating X-User-Id over 1,000 users (a limit that never trips)
--   flood    GET /over/ as one user far over its limit (1 request a minute)
--   mixed    rotating over 1,000 users; users 900..999 (10%) go to /over/, the rest /allowed/
--   multi    GET /multi/ rotating over 1,000 users (three limits on the route)
-- The requests are built once in init(), so generating them costs the same for every server.

local scenario = os.getenv("SCENARIO") or "allowed"
local requests = {}
local next_index = 1
local users = 1000

local threads = 0
function setup(thread)
  -- Each thread starts at a different user so threads do not march in step.
  thread:set("offset", threads * 337)
  threads = threads + 1
end

function init(args)
  local function build(path, user)
    return wrk.format("GET", path, { ["Host"] = "bench", ["X-User-Id"] = user })
  end
  if scenario == "flood" then
    requests[1] = build("/over/", "flood")
  else
    for i = 0, users - 1 do
      local path = "/allowed/"
      if scenario == "plain" then
        path = "/plain/"
      elseif scenario == "mixed" and i >= 900 then
        path = "/over/"
      elseif scenario == "multi" then
        path = "/multi/"
      end
      requests[#requests + 1] = build(path, "u" .. i)
    end
  end
  next_index = ((tonumber(offset) or 0) % #requests) + 1
end

function request()
  local r = requests[next_index]
  next_index = next_index + 1
  if next_index > #requests then
    next_index = 1
  end
  return r
end

-- One machine-readable line; run.sh parses it.
function done(summary, latency, _)
  io.write(string.format(
    "WRKSUMMARY requests=%d duration_us=%d p50_us=%d p99_us=%d status_errors=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout))
end
