#!/usr/bin/env bash
# bench/run.sh: tollgate against nginx, nginx + limit_req, HAProxy stick tables and the bare
# upstream, in one run on this machine, with identical wrk settings. See docs/performance.md.
#
# Knobs (environment):
#   DURATION=10s CONNECTIONS=50 THREADS=2 WARMUP=2s   wrk settings, the same for every server
#   SCENARIOS="1 2 3 4"                               which scenarios to run
#   PEERS="tollgate tollgate-log tollgate-coalesce nginx-limit_req haproxy nginx-proxy upstream"
#   ROUNDS=1                                          measure every server this many times,
#                                                     interleaved; the table shows medians
#   IDLE_CONNS=10000                                  for the RSS measurement (0 skips it)
#   PROFILE=1                                         perf record tollgate in scenarios 1 and 2
#   NO_BUILD=1                                        use the existing target/release/tollgate
#   TOLLGATE_BIN=path                                 benchmark another tollgate build (implies NO_BUILD=1)
# Everything listens on 127.0.0.1 only; every process started here is stopped on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-2s}
SCENARIOS=${SCENARIOS:-"1 2 3 4"}
PEERS=${PEERS:-"tollgate tollgate-log tollgate-coalesce nginx-limit_req haproxy nginx-proxy upstream"}
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

if [ "${NO_BUILD:-0}" != 1 ] && [ -z "${TOLLGATE_BIN:-}" ]; then
  log "building tollgate (release)"
  (cd "$ROOT" && cargo build --release --locked -j"${BUILD_JOBS:-1}" --bin tollgate)
fi
TOLLGATE=${TOLLGATE_BIN:-"$ROOT/target/release/tollgate"}

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
NGP_PORT=$(free_port)
NGL_PORT=$(free_port)
HAP_PORT=$(free_port)
RSS_PORT=$(free_port)
RSS_ADMIN=$(free_port)
T="$WORK/tmp"

upstream_conf "$T" "$UP_PORT"

# nginx as a proxy: one server block without limits, one with limit_req, same workers.
cat >"$T/nginx.conf" <<EOF
$NGINX_USER
worker_processes 2;
worker_rlimit_nofile 20000;
pid $T/nginx.pid;
error_log $T/nginx.err warn;
events { worker_connections 10000; }
http {
  access_log off;
  client_body_temp_path $T/n-body; proxy_temp_path $T/n-proxy; fastcgi_temp_path $T/n-fcgi;
  uwsgi_temp_path $T/n-uwsgi; scgi_temp_path $T/n-scgi;
  keepalive_requests 10000000;
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 128; keepalive_requests 10000000; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  limit_req_status 429;
  limit_req_zone \$http_x_user_id zone=allowed:16m rate=100000r/s;
  limit_req_zone \$http_x_user_id zone=over:16m rate=1r/m;
  limit_req_zone \$http_x_user_id zone=multi_a:16m rate=100000r/s;
  limit_req_zone \$http_x_user_id zone=multi_b:16m rate=100000r/s;
  limit_req_zone \$binary_remote_addr zone=multi_c:16m rate=10000000r/s;
  server {
    listen 127.0.0.1:$NGP_PORT;
    location / { proxy_pass http://up; }
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

tollgate_config() { # listen admin access_log coalesce
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
    url: redis://127.0.0.1:$REDIS_PORT
    key_prefix: "bench:"
    timeout: 1s
    coalesce: ${4:-false}
  on_error: deny
EOF
  cat "$HERE/routes.yaml"
}
tollgate_config "$TG_PORT" "$TG_ADMIN" false >"$T/tollgate.yaml"
tollgate_config "$TGL_PORT" "$TGL_ADMIN" true >"$T/tollgate-log.yaml"
tollgate_config "$TGC_PORT" "$TGC_ADMIN" false true >"$T/tollgate-coalesce.yaml"
tollgate_config "$RSS_PORT" "$RSS_ADMIN" false >"$T/tollgate-rss.yaml"
"$TOLLGATE" check --config "$T/tollgate.yaml" >/dev/null

# --- start everything -------------------------------------------------------------------
log "starting upstream, redis, tollgate and the peers"
start upstream nginx -p "$T" -c "$T/upstream.conf" -g 'daemon off;'
start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
  --dir "$T"
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"
start tollgate "$TOLLGATE" --config "$T/tollgate.yaml"
TG_PID=$LAST_PID
# The access-logging instance writes its log to a file, as a service manager would.
start tollgate-log "$TOLLGATE" --config "$T/tollgate-log.yaml"
TGL_PID=$LAST_PID
# The same as "tollgate" with store.redis.coalesce: decisions of concurrent requests share
# script calls.
start tollgate-coalesce "$TOLLGATE" --config "$T/tollgate-coalesce.yaml"
TGC_PID=$LAST_PID
start nginx nginx -p "$T" -c "$T/nginx.conf" -g 'daemon off;'
start haproxy haproxy -db -f "$T/haproxy.cfg"
for p in "$TG_PORT" "$TGL_PORT" "$TGC_PORT" "$NGP_PORT" "$NGL_PORT" "$HAP_PORT"; do wait_port "$p"; done
for admin in "$TG_ADMIN" "$TGL_ADMIN" "$TGC_ADMIN"; do
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
    nginx-proxy) echo "$NGP_PORT" ;;
    nginx-limit_req) echo "$NGL_PORT" ;;
    haproxy) echo "$HAP_PORT" ;;
    upstream) echo "$UP_PORT" ;;
  esac
}
scenario_name() {
  case $1 in 1) echo allowed ;; 2) echo flood ;; 3) echo mixed ;; 4) echo multi ;; esac
}

rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

# Sums INFO commandstats: "<round trips> <commands run inside scripts>".
redis_counts() {
  rcli info commandstats | tr -d '\r' | awk -F'[:,=]' '
    /^cmdstat_/ {
      name = $1; sub(/^cmdstat_/, "", name); calls = $3
      if (name ~ /^(info|config)/) next
      if (name ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/ || name ~ /^script/) trips += calls
      else inner += calls
    }
    END { printf "%d %d\n", trips, inner }'
}

# Requests tollgate decided (all routes, all decisions), from its /metrics.
tollgate_requests() { # peer
  local admin=$TG_ADMIN
  [ "$1" = tollgate-log ] && admin=$TGL_ADMIN
  [ "$1" = tollgate-coalesce ] && admin=$TGC_ADMIN
  curl -fsS "http://127.0.0.1:$admin/metrics" |
    awk '/^tollgate_requests_total/ { sum += $NF } END { printf "%d\n", sum }'
}

# CPU time (user + system, clock ticks) a tollgate process has used so far.
cpu_ticks() { # peer
  local pid=$TG_PID
  [ "$1" = tollgate-log ] && pid=$TGL_PID
  [ "$1" = tollgate-coalesce ] && pid=$TGC_PID
  awk '{ print $14 + $15 }' "/proc/$pid/stat"
}
# CPU time Redis has used so far, in microseconds.
redis_cpu_us() {
  rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%d\n", s * 1000000 }'
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
    for peer in $PEERS; do
      log "scenario $s ($(scenario_name "$s")), round $round/$ROUNDS: $peer"
      run_wrk "$s" "$peer" "$WARMUP" >/dev/null
      before=0 cpu_before=0 redis_cpu_before=0
      if [[ $peer == tollgate* ]]; then
        before=$(tollgate_requests "$peer")
        cpu_before=$(cpu_ticks "$peer")
        redis_cpu_before=$(redis_cpu_us)
      fi
      rcli config resetstat >/dev/null
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
      trips=0 inner=0 served=0 cpu=0 redis_cpu=0
      if [[ $peer == tollgate* ]]; then
        # wrk counts only answers that arrived before it stopped; tollgate's own counter also
        # has the requests that were in flight then, which Redis saw too.
        sleep 0.5
        read -r trips inner < <(redis_counts)
        served=$(($(tollgate_requests "$peer") - before))
        cpu=$(($(cpu_ticks "$peer") - cpu_before))
        redis_cpu=$(($(redis_cpu_us) - redis_cpu_before))
      fi
      if [ -z "$summary" ]; then
        log "wrk gave no summary for $peer in scenario $s"
        continue
      fi
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$peer" \
        "$(field requests "$summary")" "$(field duration_us "$summary")" \
        "$(field p50_us "$summary")" "$(field p99_us "$summary")" \
        "$(field status_errors "$summary")" \
        "$(($(field connect_errors "$summary") + $(field read_errors "$summary") + $(field write_errors "$summary") + $(field timeouts "$summary")))" \
        "$trips $inner $served $cpu $redis_cpu" "$round" >>"$RAW"
    done
  done
done
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
  FDS=$(ls "/proc/$RSS_PID/fd" | wc -l)
  HWM_KB=$(awk '/VmHWM/ {print $2}' "/proc/$RSS_PID/status")
  RSS_KB=$(awk '/VmRSS/ {print $2}' "/proc/$RSS_PID/status")
  RSS_LINE="$OPEN $FDS $RSS_IDLE_KB $RSS_KB $HWM_KB"
  kill "$CLIENT_PID" 2>/dev/null || true
fi

# --- report -------------------------------------------------------------------------------
META="$WORK/meta.env"
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
  echo "versions=$(nginx -v 2>&1 | sed 's/.*version: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
} >"$META"
python3 "$HERE/report.py" "$RAW" "$META" | tee "$RESULTS/$STAMP.md"
cp "$RESULTS/$STAMP.md" "$RESULTS/latest.md"
log "results: $RESULTS/$STAMP.md (raw data and logs in $WORK)"
