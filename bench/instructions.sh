#!/usr/bin/env bash
# bench/instructions.sh: user-space instructions tollgate executes per request, counted by
# valgrind's callgrind. Unlike requests/s or CPU time, the count barely moves when other work
# shares the machine, so two builds can be compared on a busy 2-core box. Kernel time (the
# socket writes and reads, about half of the real cost) is not counted. See
# docs/performance.md.
#
# Usage: bench/instructions.sh [BIN...]      (default: target/release/tollgate)
# Knobs: SCENARIOS="allowed flood" SECONDS_MEASURED=8 CONNECTIONS=1
#        KEEP=DIR (keep each callgrind profile there, for callgrind_annotate)
#        SYNC=100ms (every limit local-first with that interval, as bench/run.sh's tollgate-sync)
#        RATE=40 (a fixed rate instead of back-to-back requests: oha -q RATE -c CONNECTIONS,
#          so each connection waits between requests as a real client does; plain, allowed,
#          flood and multi only)
#
# Each build starts under callgrind with instrumentation off, gets one second of warm-up
# load, then is measured for SECONDS_MEASURED seconds of `wrk -t1 -c CONNECTIONS`; the total
# divided by the requests wrk completed is the per-request cost, free of start-up. With one
# connection every request takes the same path (read, forward, answer, wait), and two runs
# of one build agree to within about 0.1%; with more connections the count moves by a few
# thousand with how many requests each wake-up happens to find. Any binary that takes
# `--config FILE` can be measured, such as the hyper floor (examples/hyper_floor.rs).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SCENARIOS=${SCENARIOS:-"allowed flood"}
MEASURED=${SECONDS_MEASURED:-8}
CONNECTIONS=${CONNECTIONS:-1}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/target/release/tollgate")

LOG_TAG=instructions
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
need_tools valgrind nginx wrk
[ -z "${RATE:-}" ] || need_oha || { log "RATE needs oha"; exit 1; }
WORK=$(mktemp -d)
CLEANUP_DIR=$WORK

UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
TG_PORT=$(free_port)
TG_ADMIN=$(free_port)
# The routes of bench/run.sh's scenarios.
cat >"$WORK/tollgate.yaml" <<EOF
listen: 127.0.0.1:$TG_PORT
admin: 127.0.0.1:$TG_ADMIN
upstream:
  url: http://127.0.0.1:$UP_PORT
  timeout: 30s
access_log: false
store:
  redis:
    url: redis://127.0.0.1:$REDIS_PORT
    key_prefix: "bench:"
    timeout: 5s
  on_error: deny
EOF
if [ -n "${SYNC:-}" ]; then
  sed -E "s/^( *- \{ algorithm: .*[^ ]) *\} *$/\1, sync: $SYNC }/" "$HERE/routes.yaml" \
    >>"$WORK/tollgate.yaml"
else
  cat "$HERE/routes.yaml" >>"$WORK/tollgate.yaml"
fi

upstream_and_redis "$WORK" "$UP_PORT" "$REDIS_PORT"

# One run: prints "<requests> <instructions>".
# Load for SECONDS seconds: wrk back to back, or oha at RATE; prints the requests completed.
load() { # scenario seconds
  if [ -z "${RATE:-}" ]; then
    SCENARIO=$1 wrk -t1 -c"$CONNECTIONS" -d"$2"s -s "$HERE/wrk.lua" "http://127.0.0.1:$TG_PORT" |
      awk '/requests in/ { print $1 }'
    return
  fi
  local path
  case $1 in plain) path=/plain/ ;; flood) path=/over/ ;; multi) path=/multi/ ;; *) path=/allowed/ ;; esac
  "$OHA" -z "$2"s -q "$RATE" -c "$CONNECTIONS" --no-tui --output-format json \
    -H "X-User-Id: u1" "http://127.0.0.1:$TG_PORT$path" |
    python3 -c 'import json, sys; print(sum(json.load(sys.stdin)["statusCodeDistribution"].values()))'
}

measure() { # bin scenario
  local out="$WORK/callgrind.out"
  rm -f "$out"*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$1" --config "$WORK/tollgate.yaml" >"$WORK/tollgate.log" 2>&1 &
  local pid=$!
  wait_port "$TG_PORT" 60  # valgrind starts slowly
  # Connected to Redis before the warm-up: under callgrind the connection (and the scripts'
  # SHA1s) can land after it, costing a few hundred instructions a request in the measure.
  wait_ready "http://127.0.0.1:$TG_ADMIN/readyz" 60
  load "$2" 1 >/dev/null
  callgrind_control -i on "$pid" >/dev/null
  local requests
  requests=$(load "$2" "$MEASURED")
  callgrind_control -d "$pid" >/dev/null
  kill -TERM "$pid"
  wait "$pid" || true
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out".1 "$KEEP/$(basename "$1").$2.callgrind"
  fi
  echo "$requests $(awk '/^summary:/ { print $2 }' "$out".1)"
}

printf '| build | scenario | instructions / request |\n|---|---|---:|\n'
for bin in "${BINS[@]}"; do
  for scenario in $SCENARIOS; do
    log "$bin: $scenario, ${MEASURED}s under callgrind"
    read -r n i < <(measure "$bin" "$scenario")
    printf '| %s | %s | %s |\n' "$bin" "$scenario" \
      "$(python3 -c "print(f'{$i / $n:,.0f}')")"
  done
done
