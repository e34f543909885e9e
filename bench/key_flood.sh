#!/usr/bin/env bash
# bench/key_flood.sh: one client floods tollgate with distinct identities (a new X-User on every
# request, wrk with bench/key_flood.lua) and this records what the flood costs: the process's
# RSS before, at the end and 5 s after, the keys it holds and evicted (/metrics), and the Redis
# commands per second during the flood and in the 5 s after (INFO total_commands_processed).
# Three stores: memory, Redis exact, Redis local-first (sync: 100ms).
# Idle before and long after: Redis commands a second and tollgate's CPU (% of a core, from
# /proc) in the 5 s before the flood (pre) and from QUIET_AFTER s after it for 5 s (quiet), by
# when local-first copies nobody uses went cold (50 intervals) and were dropped; keys_quiet is
# what tollgate still holds then.
#
#   bench/key_flood.sh [TOLLGATE_BINARY]      (default target/release/tollgate)
#
# Knobs: KEYS=1000000 (distinct identities: the flood runs until wrk has sent that many)
# CONNECTIONS=32 THREADS=2 MAX_KEYS_PER_ROUTE= (empty: the default) STORES="memory exact local_first"
# QUIET_AFTER=15
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/../target/release/tollgate}
KEYS=${KEYS:-1000000}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
STORES=${STORES:-memory exact local_first}
QUIET_AFTER=${QUIET_AFTER:-15}
WORK=$(mktemp -d)
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
CLEANUP_DIR="$WORK"
need_tools nginx wrk redis-server redis-cli curl
[ -x "$BIN" ] || { echo "no tollgate binary at $BIN" >&2; exit 2; }

UP_PORT=$(free_port)
upstream_conf "$WORK" "$UP_PORT"
nginx -p "$WORK" -c "$WORK/upstream.conf" -g 'daemon off;' 2>"$WORK/up.err" &
PIDS+=($!)
wait_port "$UP_PORT"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
commands() { redis-cli -p "$REDIS_PORT" info stats | awk -F: '/^total_commands_processed/ {print $2+0}'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
# Redis commands a second and tollgate's CPU (% of a core) over the next 5 s: "ops cpu".
idle_window() {
  local c0 t0 c1 t1
  c0=$(commands); t0=$(cpu_ticks "$1")
  sleep 5
  c1=$(commands); t1=$(cpu_ticks "$1")
  awk -v a="$c0" -v b="$c1" -v x="$t0" -v y="$t1" -v hz="$HZ" 'BEGIN {printf "%d %.1f", (b - a) / 5, 100 * (y - x) / hz / 5}'
}
metric() { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v s="$1" 'index($0, s) == 1 {print $2}'; }

printf '%-12s %10s %10s %10s %10s %10s %12s %12s %12s %10s %10s %10s %9s %9s\n' store req/s rss0_MB rss_end_MB rss_5s_MB keys evicted redis_ops/s idle_ops/s pre_ops/s quiet_ops/s keys_quiet pre_cpu% quiet_cpu%
for STORE in $STORES; do
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --save '' --appendonly no --daemonize no >"$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=($REDIS_PID)
  wait_port "$REDIS_PORT"
  PORT=$(free_port)
  ADMIN_PORT=$(free_port)
  case $STORE in
    memory) store="store: { ${MAX_KEYS_PER_ROUTE:+max_keys_per_route: $MAX_KEYS_PER_ROUTE} }"; sync="" ;;
    exact) store="store: { redis: { url: redis://127.0.0.1:$REDIS_PORT, timeout: 300ms } ${MAX_KEYS_PER_ROUTE:+, max_keys_per_route: $MAX_KEYS_PER_ROUTE} }"; sync="" ;;
    local_first) store="store: { redis: { url: redis://127.0.0.1:$REDIS_PORT, timeout: 300ms } ${MAX_KEYS_PER_ROUTE:+, max_keys_per_route: $MAX_KEYS_PER_ROUTE} }"; sync=", sync: 100ms" ;;
  esac
  cat >"$WORK/tollgate.yaml" <<YAML
listen: 127.0.0.1:$PORT
admin: 127.0.0.1:$ADMIN_PORT
access_log: false
upstream: { url: "http://127.0.0.1:$UP_PORT" }
$store
identities:
  user: [ { header: X-User } ]
routes:
  - { name: login, match: { path_prefix: /login }, key: user, limits: [ { algorithm: fixed_window, limit: 5, period: 1h$sync } ] }
  - { name: search, match: { path_prefix: /search }, key: user, limits: [ { algorithm: fixed_window, limit: 5, period: 1h$sync } ] }
YAML
  "$BIN" --config "$WORK/tollgate.yaml" >"$WORK/tollgate.log" 2>&1 &
  TG=$!
  PIDS+=($TG)
  wait_port "$PORT"
  curl -s -o /dev/null -H 'X-User: warm' "http://127.0.0.1:$PORT/search"
  sleep 1
  read -r pre_ops pre_cpu <<<"$(idle_window $TG)"
  rss0=$(rss_kb $TG)
  c0=$(commands)
  start=$(date +%s.%N)
  # wrk runs for a time: long enough for KEYS requests at the rate the first 2 s show.
  wrk -t1 -c4 -d2s -s "$HERE/key_flood.lua" "http://127.0.0.1:$PORT/" >"$WORK/probe.txt"
  rate=$(awk '/Requests\/sec/ {print int($2)}' "$WORK/probe.txt")
  secs=$(( KEYS / (rate > 0 ? rate : 1) + 1 ))
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"${secs}s" -s "$HERE/key_flood.lua" "http://127.0.0.1:$PORT/" >"$WORK/wrk.txt"
  end=$(date +%s.%N)
  c1=$(commands)
  rss1=$(rss_kb $TG)
  sleep 5
  c2=$(commands)
  rss2=$(rss_kb $TG)
  reqs=$(awk '/requests in/ {print $1}' "$WORK/wrk.txt")
  rps=$(awk '/Requests\/sec/ {print int($2)}' "$WORK/wrk.txt")
  label=$([ "$STORE" = local_first ] && echo local_first || echo memory)
  keys=$(metric "tollgate_store_keys{store=\"$label\"}")
  evicted=$(metric "tollgate_store_evicted_keys_total{store=\"$label\"}")
  # A new caller on each route after the flood.
  for path in /login /search; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-User: after-the-flood' "http://127.0.0.1:$PORT$path")
    [ "$code" = 200 ] || log "$STORE: a new caller on $path got $code"
  done
  sleep $(( QUIET_AFTER > 5 ? QUIET_AFTER - 5 : 0 ))
  read -r quiet_ops quiet_cpu <<<"$(idle_window $TG)"
  keys_quiet=$(metric "tollgate_store_keys{store=\"$label\"}")
  ops=$(awk -v a="$c0" -v b="$c1" -v s="$start" -v e="$end" 'BEGIN {printf "%d", (b - a) / (e - s)}')
  idle=$(awk -v a="$c1" -v b="$c2" 'BEGIN {printf "%d", (b - a) / 5}')
  printf '%-12s %10s %10.1f %10.1f %10.1f %10s %12s %12s %12s %10s %10s %10s %9s %9s   (%s requests)\n' "$STORE" "$rps" \
    "$(echo "$rss0/1024" | bc -l)" "$(echo "$rss1/1024" | bc -l)" "$(echo "$rss2/1024" | bc -l)" \
    "${keys:-0}" "${evicted:-0}" "$ops" "$idle" "$pre_ops" "$quiet_ops" "${keys_quiet:-0}" "$pre_cpu" "$quiet_cpu" "$reqs"
  kill $TG $REDIS_PID
  wait $TG $REDIS_PID 2>/dev/null || true
done
