# bench/lib.sh: what bench/run.sh and bench/instructions.sh share. Sourced, not run.
#   LOG_TAG       prefix of log lines
#   CLEANUP_DIR   removed on exit, after every process in PIDS has been stopped

log() { printf '[%s %s] %s\n' "${LOG_TAG:-bench}" "$(date +%H:%M:%S)" "$*" >&2; }

# need_tools TOOL...: installs the Debian packages of the same names for any that are missing
# (nginx and haproxy live in /usr/sbin); redis-server and python3 must already be there.
need_tools() {
  local need=() tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || need+=("$tool")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  export PATH="$PATH:/usr/sbin"
  command -v redis-server >/dev/null || { log "redis-server is required"; exit 1; }
  command -v python3 >/dev/null || { log "python3 is required"; exit 1; }
}

# Every background process started goes into PIDS; all are stopped on exit.
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  [ -z "${CLEANUP_DIR:-}" ] || rm -rf "$CLEANUP_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # port [seconds]
  local deadline=$((SECONDS + ${2:-20}))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { log "nothing listens on port $1"; return 1; }
    sleep 0.1
  done
}
