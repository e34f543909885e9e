#!/usr/bin/env bash
# bench/budget.sh: the CPU budget of the request path, checked. User-space instructions per
# request, counted by valgrind's callgrind on one connection (see bench/instructions.sh: two
# runs of one build agree to about 0.1 %), for five servers in one run and one build profile:
#
#   floor         examples/hyper_floor, forwarding only                          (yardstick)
#   floor+redis   examples/hyper_floor, one EVALSHA of decide.lua per request    (yardstick)
#   plain         tollgate, a route without limits (/plain/)
#   exact         tollgate, one exact gcra limit: one EVALSHA per request (/allowed/)
#   local-first   tollgate, the same limit with `sync: 100ms`                  (/allowed/)
#
# Per request means the work a request adds: what a server does by itself on its timers is
# measured in an idle window and taken out, and so are the tasks that run once an interval
# (the local-first sync rounds, the suggest record's publication; see `measure` and `APART`
# below). About a minute and a half.
#
# and fails (exit 1) when a path is over its budget:
#
#   plain ≤ 1.10 × floor,  exact ≤ 1.10 × floor+redis,  local-first ≤ 1.15 × floor
#
# Exit 2: the measurement itself failed (a server did not start, a request was not answered
# 2xx, nothing was counted). The budgets are in docs/performance.md.
#
# The build: the shipped release profile (fat LTO, one codegen unit) for tollgate and the
# floor alike, so that the ratios are those of what ships. A profile of its own would not be
# cheaper: with fat LTO the dependencies are compiled to bitcode only and generated once, at
# the link, while a profile without LTO generates code for every dependency; on the 2-core
# machine a fresh build of both took 9 min 15 s of CPU for release and 10 min for release
# without LTO and with 16 codegen units (10.8 and 18.5 min of wall time, each beside another
# engineer's test build). PROFILE=NAME measures another profile's builds.
#
# Needs (installs nothing): valgrind (callgrind_control), wrk, nginx (the upstream, in
# /usr/sbin or on PATH), redis-server, curl, python3, cargo. Debian packages: valgrind wrk
# nginx redis-server curl python3.
#
# Usage: bench/budget.sh
# Knobs (environment):
#   PROFILE=release        the cargo profile both servers are built with
#   NO_BUILD=1             measure what target/<profile>/ holds
#   TOLLGATE_BIN, FLOOR_BIN  measure these binaries instead (implies no build)
#   SECONDS_MEASURED=6     seconds counted idle, then as many under load, per server
#   KEEP=DIR               keep each callgrind profile in DIR, for callgrind_annotate
#   BUDGET_PLAIN=1.10 BUDGET_EXACT=1.10 BUDGET_LOCAL=1.15
# Everything listens on 127.0.0.1; every process started here is stopped on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PROFILE=${PROFILE:-release}
MEASURED=${SECONDS_MEASURED:-6}
BUDGET_PLAIN=${BUDGET_PLAIN:-1.10}
BUDGET_EXACT=${BUDGET_EXACT:-1.10}
BUDGET_LOCAL=${BUDGET_LOCAL:-1.15}

LOG_TAG=budget
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin"
missing=()
for tool in valgrind callgrind_control wrk nginx redis-server curl python3; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "missing: ${missing[*]} (Debian packages: valgrind wrk nginx redis-server curl python3)"
  exit 2
fi

# cargo builds profile `dev` into target/debug, every other into target/<profile>.
TARGET_DIR=${CARGO_TARGET_DIR:-"$ROOT/target"}
OUT_DIR=$PROFILE
[ "$PROFILE" = dev ] && OUT_DIR=debug
TOLLGATE=${TOLLGATE_BIN:-"$TARGET_DIR/$OUT_DIR/tollgate"}
FLOOR=${FLOOR_BIN:-"$TARGET_DIR/$OUT_DIR/examples/hyper_floor"}
if [ "${NO_BUILD:-0}" != 1 ] && [ -z "${TOLLGATE_BIN:-}${FLOOR_BIN:-}" ]; then
  log "building tollgate and the hyper floor (profile $PROFILE)"
  started=$SECONDS
  (cd "$ROOT" && cargo build --locked --profile "$PROFILE" --bin tollgate --example hyper_floor)
  log "built in $((SECONDS - started)) s"
fi
for bin in "$TOLLGATE" "$FLOOR"; do
  [ -x "$bin" ] || { log "no $bin"; exit 2; }
done
log "measuring $TOLLGATE against $FLOOR"

WORK=$(mktemp -d)
CLEANUP_DIR=$WORK
UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
PORT=$(free_port)
ADMIN=$(free_port)
upstream_and_redis "$WORK" "$UP_PORT" "$REDIS_PORT"

# The servers' configurations: bench/routes.yaml's routes, and a route without limits for the
# plain path (last, so that routing passes the others first).
config_head() { # with_store
  echo "listen: 127.0.0.1:$PORT"
  echo "admin: 127.0.0.1:$ADMIN"
  printf 'upstream:\n  url: http://127.0.0.1:%s\n  timeout: 30s\naccess_log: false\n' "$UP_PORT"
  [ "$1" = 1 ] || return 0
  printf 'store:\n  redis:\n    url: redis://127.0.0.1:%s\n    key_prefix: "bench:"\n    timeout: 5s\n  on_error: deny\n' "$REDIS_PORT"
}
routes() {
  sed '/^response:/i\  - name: plain\n    match: { path_prefix: /plain/ }' "$HERE/routes.yaml"
}
config_head 0 >"$WORK/floor.yaml"
config_head 1 >"$WORK/floor-redis.yaml"
{ config_head 1; routes; } >"$WORK/exact.yaml"
{ config_head 1; routes | sed -E 's/^( *- \{ algorithm: .*[^ ]) *\} *$/\1, sync: 100ms }/'; } >"$WORK/local.yaml"
grep -q 'sync: 100ms' "$WORK/local.yaml" || { log "no local-first limit in $WORK/local.yaml"; exit 2; }

# measure NAME BIN CONFIG SCENARIO: prints "<requests> <per request> <idle work per second>
# <interval tasks' work per second>". After start-up and 1 s of warm-up, two windows are
# counted: SECONDS_MEASURED seconds with no load (what the server's timers do by themselves:
# the configuration file's poll, the metrics' upkeep, the watches of the store), then as long
# under `wrk -t1 -c1` (bench/wrk.lua's SCENARIO). Per request is the loaded window less the
# interval tasks (APART) and less the idle window's rate over its length, divided by the
# requests answered: under callgrind a server answers a few hundred to a few thousand requests
# a second, as the machine's load lets it, so work per second counted per request would move
# with that load.
measure() {
  local name=$1 bin=$2 config=$3 scenario=$4 out="$WORK/$1.callgrind"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$bin" --config "$config" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_port "$PORT" 60 || { cat "$WORK/$name.log" >&2; return 1; }  # valgrind starts slowly
  # Every serving thread connected to Redis (and its scripts loaded) before the warm-up, so
  # that no start-up work lands in the count: tollgate's /readyz, the floor's log lines.
  case $name in
    floor*)
      local deadline=$((SECONDS + 60)) threads
      threads=$(nproc)
      until [ "$(grep -c 'serving thread ready' "$WORK/$name.log")" -ge "$threads" ]; do
        [ $SECONDS -lt $deadline ] || { log "$name: serving threads not ready"; return 1; }
        sleep 0.2
      done
      ;;
    *) wait_ready "http://127.0.0.1:$ADMIN/readyz" 60 ;;
  esac
  load "$scenario" 1 >/dev/null
  local t0 t1 t2 summary
  callgrind_control -i on "$pid" >/dev/null 2>&1
  t0=$(date +%s.%N)
  sleep "$MEASURED"
  callgrind_control -d "$pid" >/dev/null 2>&1
  t1=$(date +%s.%N)
  summary=$(load "$scenario" "$MEASURED")
  callgrind_control -d "$pid" >/dev/null 2>&1
  t2=$(date +%s.%N)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  # Only answered requests count: an error (a 5xx, a 429, a failed connection) would measure
  # another path.
  local requests errors
  requests=$(sed -nE 's/.*WRKSUMMARY requests=([0-9]+).*/\1/p' <<<"$summary")
  errors=$(grep -oE '(status|connect|read|write)_errors=[1-9][0-9]*|timeouts=[1-9][0-9]*' <<<"$summary" || true)
  if [ -z "$requests" ] || [ "$requests" -lt 100 ] || [ -n "$errors" ]; then
    log "$name: ${requests:-no} requests, errors: ${errors:-none}"
    return 1
  fi
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out".1 "$KEEP/$name.idle.callgrind"
    cp "$out".2 "$KEEP/$name.callgrind"
  fi
  local idle loaded apart_idle apart_loaded rounds_loaded
  idle=$(awk '/^summary:/ { print $2 }' "$out".1)
  loaded=$(awk '/^summary:/ { print $2 }' "$out".2)
  apart_idle=$(inclusive "$out".1 "${APART[@]}")
  apart_loaded=$(inclusive "$out".2 "${APART[@]}")
  rounds_loaded=$(inclusive "$out".2 "${APART[0]}")
  if [ "$name" = local-first ] && [ "$rounds_loaded" = 0 ]; then
    log "$name: no ${APART[0]} in the profile (renamed? update APART in bench/budget.sh)"
    return 1
  fi
  python3 -c "
idle_rate = ($idle - $apart_idle) / ($t1 - $t0)
per = ($loaded - $apart_loaded - idle_rate * ($t2 - $t1)) / $requests
print($requests, round(per), round(idle_rate), round($apart_loaded / ($t2 - $t1)))"
}

# Tasks that run once an interval whatever the traffic, their cost per run growing with the
# keys they carry: the local-first sync rounds (every `sync` interval) and the publication of
# the suggest record (every 5 s). Under callgrind a server answers a few hundred to a few
# thousand requests a second, so a round falls every few dozen requests (at full speed, every
# several thousand) and a window of a few seconds holds a publication or none: their
# instructions are counted apart, by the inclusive cost of each task's future
# (bench/sync_cost.sh measures a round's cost). The first must be found in the local-first
# run. What the rounds cost elsewhere (the Redis connection's task reading their replies)
# still counts per request: local-first moves by up to 10 % between runs.
APART=('tollgate::control::sync::rounds::{{closure}}' 'tollgate::suggest::publish_loop::{{closure}}')
inclusive() { # profile fn...: the inclusive instructions of these functions in it (0 without)
  local profile=$1
  shift
  callgrind_annotate --inclusive=yes --threshold=100 "$profile" 2>/dev/null |
    awk -v fns="$(printf '%s\n' "$@")" '
      BEGIN { n = split(fns, want, "\n") }
      { for (i = 1; i <= n; i++) if (want[i] != "" && index($0, ":" want[i] " [")) { gsub(",", "", $1); sum += $1 } }
      END { print sum + 0 }'
}

load() { # scenario seconds: wrk's summary line
  SCENARIO=$1 wrk -t1 -c1 -d"$2"s -s "$HERE/wrk.lua" "http://127.0.0.1:$PORT" | grep WRKSUMMARY
}

declare -A PER
for run in "floor $FLOOR floor plain" "floor+redis $FLOOR floor-redis allowed" \
  "plain $TOLLGATE exact plain" "exact $TOLLGATE exact allowed" \
  "local-first $TOLLGATE local allowed"; do
  read -r name bin config scenario <<<"$run"
  log "$name: ${MEASURED}s under callgrind"
  result=$(measure "$name" "$bin" "$WORK/$config.yaml" "$scenario") || exit 2
  read -r n per background apart_rate <<<"$result"
  PER[$name]=$per
  log "$name: $n requests, $per instructions each; apart: $background a second idle, interval tasks $apart_rate a second"
done

python3 - "${PER[floor]}" "${PER[floor+redis]}" "${PER[plain]}" "${PER[exact]}" \
  "${PER[local-first]}" "$BUDGET_PLAIN" "$BUDGET_EXACT" "$BUDGET_LOCAL" "$PROFILE" <<'EOF'
import sys
floor, floor_redis, plain, exact, local = map(int, sys.argv[1:6])
budgets = list(map(float, sys.argv[6:9]))
print(f"instructions per request, one connection, profile {sys.argv[9]}:")
print(f"  {'floor':<12}{floor:>9,}")
print(f"  {'floor+redis':<12}{floor_redis:>9,}")
over = []
for (name, value, yard, yard_name), budget in zip(
    [("plain", plain, floor, "floor"), ("exact", exact, floor_redis, "floor+redis"),
     ("local-first", local, floor, "floor")], budgets):
    ratio = value / yard
    verdict = "ok" if ratio <= budget else "OVER BUDGET"
    if ratio > budget:
        over.append(name)
    print(f"  {name:<12}{value:>9,}  {ratio:.3f}x {yard_name} (budget {budget:.2f}x)  {verdict}")
if over:
    print("over budget: " + ", ".join(over))
    sys.exit(1)
print("within budget")
EOF
