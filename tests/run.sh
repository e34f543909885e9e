#!/usr/bin/env bash
# The README's test command:
#
#   tests/run.sh
#
# On a fresh Debian/Ubuntu machine with a Rust toolchain (rustup's
# cargo; see https://rustup.rs) it installs what the tests need and is missing (apt-get, as
# root or through sudo; npm packages into tests/clients; a Python venv for the OTLP receiver),
# then runs the whole suite. cargo-nextest is not needed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# rustup installs into ~/.cargo/bin, which non-login shells may not have on PATH.
if ! command -v cargo >/dev/null 2>&1; then
    if [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
        # shellcheck source=/dev/null
        . "${CARGO_HOME:-$HOME/.cargo}/env"
    fi
fi
command -v cargo >/dev/null 2>&1 \
    || die "cargo not found on PATH or in ${CARGO_HOME:-$HOME/.cargo}/bin: install Rust with rustup (https://rustup.rs), then re-run .ci/run"

log "toolchain"
if command -v rustup >/dev/null 2>&1; then
    rustup --version 2>/dev/null || true
    rustup show active-toolchain || true
fi
rustc --version --verbose
cargo --version

# What the tests drive, by Debian package (one apt-get for whatever is missing):
# - redis-server: the tests start their own Redis servers (this script never starts one);
# - chromium, chromium-driver: the console's browser tests (tests/it/console.rs);
# - python3-requests, python3-flask, gunicorn, curl, nodejs, npm: real clients and apps
#   (tests/it/real_clients.rs: Python's http.client and requests, Flask on gunicorn, curl,
#   Node's fetch and Express); /usr/bin/python3 is the Python they run on;
# - python3-venv: a venv for the OTLP receiver of tests/it/traces.rs (below).
python=python3
[[ -x /usr/bin/python3 ]] && python=/usr/bin/python3
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
"$python" -c 'import requests' 2>/dev/null || missing+=(python3-requests)
"$python" -c 'import flask' 2>/dev/null || missing+=(python3-flask)
"$python" -c 'import gunicorn' 2>/dev/null || missing+=(gunicorn)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
"$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing ${missing[*]}"
    SUDO=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "${missing[*]} missing and installing needs root: run as root or install sudo"
        SUDO=(sudo)
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
redis-server --version
chromium --version
chromedriver --version
node --version
log "npm ci (tests/clients)"
(cd tests/clients && npm ci --no-audit --no-fund)

# tests/it/traces.rs starts a real OTLP receiver (tests/clients/otlp_receiver.py) on grpcio,
# protobuf and opentelemetry-proto, installed into a venv of their own (Debian's protobuf is
# older than opentelemetry-proto's generated code needs).
otlp_venv=tests/clients/.venv-otlp
if ! "$otlp_venv/bin/python" -c 'import grpc, google.protobuf, opentelemetry.proto' 2>/dev/null; then
    log "creating $otlp_venv (grpcio, protobuf, opentelemetry-proto)"
    "$python" -m venv "$otlp_venv"
    "$otlp_venv/bin/pip" install --quiet grpcio protobuf opentelemetry-proto
fi

log "tests"
# No incremental caches: a fresh clone builds once, and the caches cost disk and time.
export CARGO_INCREMENTAL=0
# The suite. Its output is also kept to print one closing total:
# the last binary cargo runs is the criterion benchmark (in test mode), whose own closing
# lines are not a test summary.
output=$(mktemp)
trap 'rm -f "$output"' EXIT
set +e
cargo test --locked --all-targets --no-fail-fast 2>&1 | tee "$output"
status=${PIPESTATUS[0]}
set -e
passed=$(awk '/^test result:/ {n += $4} END {print n + 0}' "$output")
failed=$(awk '/^test result:/ {n += $6} END {print n + 0}' "$output")
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
