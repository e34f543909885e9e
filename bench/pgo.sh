#!/usr/bin/env bash
# bench/pgo.sh: builds tollgate with profile-guided optimisation. An instrumented build serves
# the benchmark's own traffic (bench/wrk.lua's scenarios against bench/routes.yaml, exact and
# local-first, a real Redis and an nginx upstream), and the release build then uses that
# profile to lay out and inline the request path. See docs/performance.md for what it gains.
#
#   bench/pgo.sh            -> target/pgo/release/tollgate (printed at the end)
#   PGO_BUILD=hyper_floor bench/pgo.sh -> target/pgo/release/examples/hyper_floor: the hyper
#                              floor trained and built the same way, so that tollgate's
#                              profile-guided build is compared with a floor built alike
#
# Knobs: SECONDS_PER_SCENARIO=4, PGO_BUILD=tollgate|hyper_floor, PGO_PROFILE_DIR (where the
# instrumented build writes its raw profiles; default a fresh temporary directory. The path is
# part of the instrumented build's flags, so a fixed one lets cargo reuse dependencies built
# earlier with the same flags, as the Dockerfile's dependency layer does). Needs the rustup
# component llvm-tools (installed when missing) for llvm-profdata of the compiler's own LLVM
# version.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PER_SCENARIO=${SECONDS_PER_SCENARIO:-4}
LOG_TAG=pgo
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
need_tools nginx wrk
WORK=$(mktemp -d)
CLEANUP_DIR=$WORK
RAW=${PGO_PROFILE_DIR:-$WORK/raw}

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | awk '/^host:/ { print $2 }')
PROFDATA="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if ! [ -x "$PROFDATA" ]; then
  log "installing the rustup component llvm-tools (llvm-profdata)"
  rustup component add llvm-tools >&2
fi

case ${PGO_BUILD:-tollgate} in
  tollgate) TARGET_ARGS=(--bin tollgate) BUILT=release/tollgate ;;
  hyper_floor) TARGET_ARGS=(--example hyper_floor) BUILT=release/examples/hyper_floor ;;
  *) log "PGO_BUILD: tollgate or hyper_floor"; exit 2 ;;
esac
log "building the instrumented ${PGO_BUILD:-tollgate} (target/pgo-gen)"
rm -rf "$RAW"
(cd "$ROOT" && RUSTFLAGS="-Cprofile-generate=$RAW" \
  cargo build --release --locked "${TARGET_ARGS[@]}" --target-dir target/pgo-gen) >&2
INSTRUMENTED="$ROOT/target/pgo-gen/$BUILT"
# The build scripts were instrumented too and wrote profiles of their own while building:
# only the training's go into the profile.
rm -rf "$RAW"

UP_PORT=$(free_port)
REDIS_PORT=$(free_port)
upstream_and_redis "$WORK" "$UP_PORT" "$REDIS_PORT"

# One training run: the instrumented build serves every scenario, then exits on SIGTERM
# (the profile is written at a normal exit).
train() { # sync_interval ("" for exact)
  local port config="$WORK/tollgate$1.yaml"
  port=$(free_port)
  cat >"$config" <<EOF
listen: 127.0.0.1:$port
upstream: { url: "http://127.0.0.1:$UP_PORT", timeout: 30s }
access_log: false
store:
  redis: { url: "redis://127.0.0.1:$REDIS_PORT", key_prefix: "pgo$1:", timeout: 5s }
  on_error: deny
EOF
  if [ -n "$1" ]; then
    sed -E "s/^( *- \{ algorithm: .*[^ ]) *\} *$/\1, sync: $1 }/" "$HERE/routes.yaml" >>"$config"
  else
    cat "$HERE/routes.yaml" >>"$config"
  fi
  "$INSTRUMENTED" --config "$config" >"$WORK/tollgate$1.log" 2>&1 &
  local pid=$!
  wait_port "$port" 60
  for scenario in plain allowed mixed flood multi; do
    log "training: ${1:-exact}, $scenario, ${PER_SCENARIO}s"
    SCENARIO=$scenario wrk -t2 -c50 -d"${PER_SCENARIO}s" -s "$HERE/wrk.lua" \
      "http://127.0.0.1:$port" >/dev/null
  done
  kill -TERM "$pid"
  wait "$pid" || true
}
train ""
train 100ms

"$PROFDATA" merge -o "$WORK/merged.profdata" "$RAW"
rm -rf "$RAW"
log "building with the profile (target/pgo)"
(cd "$ROOT" && RUSTFLAGS="-Cprofile-use=$WORK/merged.profdata" \
  cargo build --release --locked "${TARGET_ARGS[@]}" --target-dir target/pgo) >&2
echo "$ROOT/target/pgo/$BUILT"
