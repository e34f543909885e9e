#!/usr/bin/env bash
# bench/ab.sh: two or more tollgate builds (a, b, c, ...) side by side on one path,
# interleaved, with nginx (proxy_pass and limit_req) as the yardstick: the before/after of one
# change in one run. Any binary that takes `--config FILE` can stand in for tollgate, such as
# the hyper floor (examples/hyper_floor.rs: what a proxy on hyper and Tokio costs when it does
# nothing but forward).
#
#   bench/ab.sh OLD_BINARY NEW_BINARY [MORE_BINARIES...]
#
# Knobs: DURATION=8s CONNECTIONS=50 THREADS=2 ROUNDS=3 SCENARIO=plain|allowed|allowed-sync|allowed-coalesce
# (plain: no route matches; allowed: one exact gcra limit; allowed-sync: the same, sync 100ms;
# allowed-coalesce: the exact limit with store.redis.coalesce).
# EXTRA_a, EXTRA_b, ... (YAML text, default none) are appended to that side's configuration at
# the top level: one binary twice with a section added on one side measures what the section
# costs, e.g. EXTRA_b='protect: { latency: 2x }' bench/ab.sh BIN BIN. In it, @OTLP_SINK@ is
# the URL of an OTLP/HTTP sink (nginx answering every export 200 at once: a collector that
# costs the run nothing), e.g. the cost of traces at 1 %:
#   EXTRA_b='tracing: { endpoint: "@OTLP_SINK@", sample_ratio: 0.01 }' bench/ab.sh BIN BIN
# Prints per server and round: req/s, CPU µs per request (user+sys of the process and its
# children from /proc, divided by the requests wrk completed) and its user and system parts,
# Redis CPU µs per request, and context switches per request: voluntary (a thread slept for
# want of work and had to be woken) and involuntary (preempted) of the server, and voluntary
# of the upstream (how often the server's writes found it asleep).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: bench/ab.sh OLD_BINARY NEW_BINARY [MORE_BINARIES...]" >&2; exit 2; }
BINS=("$@")
SIDES=(a b c d e f g h)
[ ${#BINS[@]} -le ${#SIDES[@]} ] || { echo "at most ${#SIDES[@]} binaries" >&2; exit 2; }
SIDES=("${SIDES[@]:0:${#BINS[@]}}")
DURATION=${DURATION:-8s}
CONNECTIONS=${CONNECTIONS:-50}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
SCENARIO=${SCENARIO:-plain}

WORK=$(mktemp -d)
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
CLEANUP_DIR="$WORK"
need_tools nginx wrk
T=$WORK
UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
declare -A PORT PID
for side in "${SIDES[@]}"; do PORT[$side]=$(free_port); done
NG_PORT=$(free_port)
SINK_PORT=$(free_port)
upstream_conf "$T" "$UP_PORT"
nginx_proxy_conf "$T" "$UP_PORT" <<EOF
  limit_req_zone \$http_x_user_id zone=allowed:16m rate=100000r/s;
  server {
    listen 127.0.0.1:$NG_PORT;
    location /allowed/ { limit_req zone=allowed burst=100000 nodelay; proxy_pass http://up; }
    location / { proxy_pass http://up; }
  }
  server {
    listen 127.0.0.1:$SINK_PORT;
    client_max_body_size 64m;
    location / { return 200; }
  }
EOF
sync_line=""
[ "$SCENARIO" = allowed-sync ] && sync_line=", sync: 100ms"
coalesce_line=""
[ "$SCENARIO" = allowed-coalesce ] && coalesce_line=", coalesce: true"
for side in "${SIDES[@]}"; do
  port=${PORT[$side]}
  cat >"$T/$side.yaml" <<EOF
listen: 127.0.0.1:$port
upstream: { url: "http://127.0.0.1:$UP_PORT", timeout: 10s }
access_log: false
max_connections: 20000
header_read_timeout: 60s
store:
  redis: { url: "redis://127.0.0.1:$REDIS_PORT", key_prefix: "$side:", timeout: 1s$coalesce_line }
  on_error: deny
identities:
  user: [ { header: X-User-Id } ]
routes:
  - name: allowed
    match: { path_prefix: /allowed/ }
    key: user
    limits:
      - { algorithm: gcra, limit: 100000, period: 1s, burst: 100000$sync_line }
EOF
  extra="EXTRA_$side"
  [ -z "${!extra:-}" ] || printf '%s\n' "${!extra//@OTLP_SINK@/http://127.0.0.1:$SINK_PORT}" >>"$T/$side.yaml"
done
nginx -p "$T" -c "$T/upstream.conf" -g 'daemon off;' >"$T/up.log" 2>&1 &
UP_PID=$!
PIDS+=($!)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"
for i in "${!SIDES[@]}"; do
  side=${SIDES[$i]}
  "${BINS[$i]}" --config "$T/$side.yaml" >"$T/$side.log" 2>&1 &
  PID[$side]=$!
  PIDS+=($!)
done
nginx -p "$T" -c "$T/nginx.conf" -g 'daemon off;' >"$T/ng.log" 2>&1 &
NG_PID=$!
PIDS+=($!)
for p in "${PORT[@]}" "$NG_PORT"; do wait_port "$p"; done
sleep 1

# "user system voluntary involuntary" so far for a process and all its descendants: CPU
# clock ticks (user, system) and context switches of every thread. Voluntary switches are
# a thread going to sleep for want of work, each woken again later by a socket write: the
# wake-ups the kernel side of a request pays for.
tree_stat() {
  local pid=$1 child
  {
    awk '{ print $14, $15, 0, 0 }' "/proc/$pid/stat" 2>/dev/null
    cat /proc/"$pid"/task/*/status 2>/dev/null |
      awk '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { n += $2 }
           END { print 0, 0, v + 0, n + 0 }'
    for child in $(pgrep -P "$pid"); do tree_stat "$child"; done
  } | awk '{ u += $1; s += $2; v += $3; n += $4 } END { print u + 0, s + 0, v + 0, n + 0 }'
}
redis_cpu_us() {
  redis-cli -p "$REDIS_PORT" info cpu | tr -d '\r' |
    awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%d\n", s * 1000000 }'
}
path=/plain/
[ "$SCENARIO" != plain ] && path=/allowed/
cat >"$T/ab.lua" <<EOF
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "$path" .. (n % 1000), { ["X-User-Id"] = "u" .. (n % 1000) })
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
EOF
TCK=$(getconf CLK_TCK)
printf '%-8s %5s %9s %8s %8s %10s %7s %7s %10s %8s %8s %8s\n' server round req/s p50_us p99_us \
  cpu_us/req user sys redis_us/req vcs/req ivcs/req up_vcs
for round in $(seq "$ROUNDS"); do
  for side in nginx "${SIDES[@]}"; do
    case $side in nginx) port=$NG_PORT pid=$NG_PID ;; *) port=${PORT[$side]} pid=${PID[$side]} ;; esac
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s "$T/ab.lua" "http://127.0.0.1:$port" >/dev/null
    read -r u0 s0 v0 n0 < <(tree_stat "$pid")
    read -r _ _ uv0 _ < <(tree_stat "$UP_PID")
    r0=$(redis_cpu_us)
    line=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$T/ab.lua" "http://127.0.0.1:$port" | grep '^RESULT')
    read -r u1 s1 v1 n1 < <(tree_stat "$pid")
    read -r _ _ uv1 _ < <(tree_stat "$UP_PID")
    r1=$(redis_cpu_us)
    read -r _ req dur p50 p99 <<<"$line"
    awk -v s="$side" -v r="$round" -v req="$req" -v dur="$dur" -v p50="$p50" -v p99="$p99" \
      -v user=$((u1 - u0)) -v sys=$((s1 - s0)) -v tck="$TCK" -v rcpu=$((r1 - r0)) \
      -v vcs=$((v1 - v0)) -v ivcs=$((n1 - n0)) -v upvcs=$((uv1 - uv0)) 'BEGIN {
        printf "%-8s %5d %9.0f %8d %8d %10.1f %7.1f %7.1f %10.1f %8.3f %8.3f %8.3f\n", s, r,
          req / (dur / 1e6), p50, p99, (user + sys) * 1e6 / tck / req, user * 1e6 / tck / req,
          sys * 1e6 / tck / req, (s == "nginx" ? 0 : rcpu / req), vcs / req, ivcs / req,
          upvcs / req }'
  done
done
