#!/usr/bin/env bash
# bench/sync_cost.sh: what the rounds of a local-first limit (`sync: 100ms`) cost Redis, for
# one or more tollgate builds in one run: the before/after of a change to sync.lua or to the
# rounds. Each build is loaded alone, against a Redis of its own started for the run, through
# the real path: bench/routes.yaml's `allowed` gcra limit with `sync: 100ms`, two serving
# threads, wrk rotating X-User-Id over 1,000 users (SCENARIO=allowed), so each round writes
# and reads about 1,000 keys.
#
# Usage: bench/sync_cost.sh [BIN...]      (default: target/release/tollgate)
# Knobs: DURATION=8s CONNECTIONS=10 REPEAT=2 (runs of every build, interleaved)
#
# Per run: the requests, the rounds (tollgate_sync_rounds_total, a write and a read each),
# the keys per round (tollgate_sync_keys, which records both), Redis's CPU (INFO cpu,
# used_cpu_user + used_cpu_sys) over the measured window per request, per round and per key
# and round (its write and its read), and the commands Redis ran per key and round (INFO
# commandstats: the commands the scripts call, besides the script calls themselves). Redis
# CPU per call is steady even on a shared machine: its own process, single-threaded, does
# nothing else.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=${DURATION:-8s}
CONNECTIONS=${CONNECTIONS:-10}
REPEAT=${REPEAT:-2}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/target/release/tollgate")

LOG_TAG=sync_cost
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
need_tools nginx wrk curl
WORK=$(mktemp -d)
CLEANUP_DIR=$WORK

UP_PORT=$(free_port)
start_upstream "$WORK" "$UP_PORT"

rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@" | tr -d '\r'; }
# CPU time Redis has used so far, in microseconds.
redis_cpu_us() {
  rcli info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%d\n", s * 1000000 }'
}
# "<script calls> <commands the scripts ran>" since the last CONFIG RESETSTAT.
redis_calls() {
  rcli info commandstats | awk -F'[_:=,]' '/^cmdstat_/ {
      name = $2; calls = $4
      if (name ~ /^(info|config)/) next
      if (name ~ /^(eval|evalsha|ping|hello|client|script)/) trips += calls
      else inner += calls
    }
    END { printf "%d %d\n", trips, inner }'
}
# The sum of a metric's samples (all label sets) on tollgate's /metrics.
metric() { # name
  curl -fsS "http://127.0.0.1:$TG_ADMIN/metrics" |
    awk -v name="$1" '$1 == name || index($1, name "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}

# One measured run of a build: prints a table row.
measure() { # bin run
  local bin=$1 run=$2 redis_pid tg_pid
  REDIS_PORT=$(free_port)
  TG_PORT=$(free_port)
  TG_ADMIN=$(free_port)
  mkdir -p "$WORK/redis-$REDIS_PORT"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --dir "$WORK/redis-$REDIS_PORT" >"$WORK/redis-$REDIS_PORT.log" 2>&1 &
  redis_pid=$!
  PIDS+=("$redis_pid")
  wait_port "$REDIS_PORT"
  {
    cat <<EOF
listen: 127.0.0.1:$TG_PORT
admin: 127.0.0.1:$TG_ADMIN
workers: 2
upstream:
  url: http://127.0.0.1:$UP_PORT
  timeout: 10s
access_log: false
store:
  redis:
    url: redis://127.0.0.1:$REDIS_PORT
    key_prefix: "bench-sync:"
    timeout: 1s
  on_error: deny
EOF
    # routes.yaml's routes with `sync: 100ms` on every limit (bench/run.sh does the same).
    sed -E 's/^( *- \{ algorithm: .*[^ ]) *\} *$/\1, sync: 100ms }/' "$HERE/routes.yaml"
  } >"$WORK/tollgate.yaml"
  "$bin" check --config "$WORK/tollgate.yaml" >/dev/null
  "$bin" --config "$WORK/tollgate.yaml" >"$WORK/tollgate-$run.log" 2>&1 &
  tg_pid=$!
  PIDS+=("$tg_pid")
  wait_port "$TG_PORT"
  wait_port "$TG_ADMIN"
  # Warm-up: every user's key exists and the rounds carry all of them.
  SCENARIO=allowed wrk -t1 -c"$CONNECTIONS" -d2s -s "$HERE/wrk.lua" "http://127.0.0.1:$TG_PORT" >/dev/null
  rcli config resetstat >/dev/null
  local cpu0 rounds0 keys0 errors0 cpu1 rounds1 keys1 errors1 line
  cpu0=$(redis_cpu_us)
  rounds0=$(metric 'tollgate_sync_rounds_total{result="ok"}')
  errors0=$(metric 'tollgate_sync_rounds_total{result="error"}')
  keys0=$(metric tollgate_sync_keys_sum)
  line=$(SCENARIO=allowed wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -s "$HERE/wrk.lua" \
    "http://127.0.0.1:$TG_PORT" | grep '^WRKSUMMARY')
  cpu1=$(redis_cpu_us)
  rounds1=$(metric 'tollgate_sync_rounds_total{result="ok"}')
  errors1=$(metric 'tollgate_sync_rounds_total{result="error"}')
  keys1=$(metric tollgate_sync_keys_sum)
  read -r trips inner < <(redis_calls)
  kill "$tg_pid" "$redis_pid"
  wait "$tg_pid" "$redis_pid" 2>/dev/null || true
  python3 - "$bin" "$run" "$line" $((cpu1 - cpu0)) $((rounds1 - rounds0)) \
    $((errors1 - errors0)) $((keys1 - keys0)) "$trips" "$inner" <<'EOF'
import sys
bin_, run, line, cpu, rounds, errors, keys, trips, inner = sys.argv[1:]
cpu, rounds, errors, keys, trips, inner = map(int, (cpu, rounds, errors, keys, trips, inner))
f = dict(kv.split("=") for kv in line.split()[1:])
requests, seconds = int(f["requests"]), int(f["duration_us"]) / 1e6
key_rounds = keys / 2  # each key is written and read once a round
print(f"| {bin_} | {run} | {requests / seconds:,.0f} | {rounds} | {errors} | "
      f"{key_rounds / max(rounds, 1):,.0f} | {cpu / requests:.2f} | "
      f"{cpu / max(rounds, 1):,.0f} | {cpu / max(key_rounds, 1):.2f} | "
      f"{inner / max(key_rounds, 1):.2f} | {trips} |")
EOF
}

printf '| build | run | req/s | rounds | failed | keys / round | Redis µs / request | Redis µs / round | Redis µs / key and round | Redis commands / key and round | script calls |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for run in $(seq "$REPEAT"); do
  for bin in "${BINS[@]}"; do
    log "$bin: run $run, $DURATION of wrk -c$CONNECTIONS"
    measure "$bin" "$run"
  done
done
