#!/usr/bin/env bash
# bench/instructions.sh: user-space instructions tollgate executes per request, counted by
# valgrind's callgrind. Unlike requests/s or CPU time, the count barely moves when other work
# shares the machine, so two builds can be compared on a busy 2-core box. Kernel time (the
# socket writes and reads, about half of the real cost) is not counted. See
# docs/performance.md.
#
# Usage: bench/instructions.sh [BIN...]      (default: target/release/tollgate)
# Knobs: SCENARIOS="allowed flood" SHORT=8 LONG=16 (seconds of load per run)
#
# Each build runs twice under callgrind with the same load (wrk, 1 thread, 10 connections)
# for SHORT and LONG seconds; the difference of the two totals divided by the difference of
# the requests served is the per-request cost, free of start-up and shutdown.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SCENARIOS=${SCENARIOS:-"allowed flood"}
SHORT=${SHORT:-8}
LONG=${LONG:-16}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/target/release/tollgate")

LOG_TAG=instructions
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
need_tools valgrind nginx wrk
WORK=$(mktemp -d)
CLEANUP_DIR=$WORK

UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
TG_PORT=$(free_port)
TG_ADMIN=$(free_port)
upstream_conf "$WORK" "$UP_PORT"
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
cat "$HERE/routes.yaml" >>"$WORK/tollgate.yaml"

nginx -p "$WORK" -c "$WORK/upstream.conf" -g 'daemon off;' >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no --dir "$WORK" \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"

served() {
  curl -fsS "http://127.0.0.1:$TG_ADMIN/metrics" |
    awk '/^tollgate_requests_total/ { sum += $NF } END { printf "%d\n", sum }'
}

# One run: prints "<requests> <instructions>".
measure() { # bin scenario seconds
  local out="$WORK/callgrind.out"
  rm -f "$out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --config "$WORK/tollgate.yaml" \
    >"$WORK/tollgate.log" 2>&1 &
  local pid=$!
  wait_port "$TG_ADMIN" 60  # valgrind starts slowly
  local before after
  before=$(served)
  SCENARIO=$2 wrk -t1 -c10 -d"$3"s -s "$HERE/wrk.lua" "http://127.0.0.1:$TG_PORT" >/dev/null
  after=$(served)
  kill -TERM "$pid"
  wait "$pid" || true
  echo "$((after - before)) $(awk '/^summary:/ {print $2}' "$out")"
}

printf '| build | scenario | instructions / request |\n|---|---|---:|\n'
for bin in "${BINS[@]}"; do
  for scenario in $SCENARIOS; do
    log "$bin: $scenario, ${SHORT}s and ${LONG}s under callgrind"
    read -r n1 i1 < <(measure "$bin" "$scenario" "$SHORT")
    read -r n2 i2 < <(measure "$bin" "$scenario" "$LONG")
    if [ "$n2" -le "$n1" ]; then
      log "the longer run served no more requests ($n1, $n2): no estimate"
      continue
    fi
    printf '| %s | %s | %s |\n' "$bin" "$scenario" \
      "$(python3 -c "print(f'{($i2 - $i1) / ($n2 - $n1):,.0f}')")"
  done
done
