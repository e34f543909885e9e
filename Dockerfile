#
# tollgate container image.
#
#   docker build -t tollgate .                       # profile-guided (bench/pgo.sh)
#   docker build --build-arg PGO=0 -t tollgate .     # plain release build, quicker
#   docker run -p 8080:8080 -p 9901:9901 -e UPSTREAM_URL=http://app:3000 tollgate
#   docker run -v $PWD/my.yaml:/etc/tollgate/config.yaml:ro tollgate     # your own config
#   docker run tollgate check                                            # validate the config
#
# docs/operations.md describes the image (its size and build time among it), and deploy/ has a
# Compose file and Kubernetes manifests that use it.
#
# Ports (as set in the default config, config.example.yaml):
#   8080  the proxy listener (`listen`)
#   9901  the admin listener (`admin`): GET /healthz (alive), GET /readyz (200; 503 while
#         draining, or while Redis is unreachable with on_error: deny), GET /metrics (Prometheus)
# Paths:
#   /usr/local/bin/tollgate       the binary (the entrypoint)
#   /etc/tollgate/config.yaml     the configuration, found through TOLLGATE_CONFIG; the image
#                                 ships config.example.yaml there; mount a file over it to replace it
# Stopping: SIGTERM (docker stop) drains in-flight requests for up to `shutdown_timeout`, then exits 0.
# SIGHUP (or a change to the config file, checked every second) reloads the configuration.
# User: uid/gid 10001 (named tollgate). Health: `tollgate health` asks /readyz; the image has no
# curl or wget.
#
# Layers: the build tools, then the dependencies (rebuilt only when Cargo.toml or Cargo.lock
# change), then the sources, so that a source change rebuilds tollgate and not what it depends on.

# ---- build ------------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
# What the profile-guided build trains with (bench/pgo.sh): an nginx upstream, a Redis, wrk,
# python3 (free ports), and llvm-profdata from the rustup component llvm-tools. Before anything
# from the repository, so that no change to it installs them again.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx wrk redis-server python3 \
    && rm -rf /var/lib/apt/lists/* \
    && rustup component add llvm-tools
WORKDIR /src
# PGO=1: profile-guided (bench/pgo.sh builds an instrumented tollgate, runs the benchmark's
# traffic through it and builds again with that profile, which takes about a fifth of the CPU off
# a request; docs/performance.md). PGO=0: the plain release build.
ARG PGO=1
# Where the instrumented build writes its raw profiles. The path is part of that build's flags:
# fixed, it lets the dependencies built below be reused.
ENV PGO_PROFILE_DIR=/tmp/tollgate-pgo
# The dependencies, against stub sources (an empty library and main, and the bench target the
# manifest names), with the same flags as the build of the sources: PGO=1 instrumented, as
# bench/pgo.sh builds it, PGO=0 plain. --locked: exactly the versions in Cargo.lock.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/hot_path.rs \
    && if [ "$PGO" = 1 ]; then \
         RUSTFLAGS="-Cprofile-generate=$PGO_PROFILE_DIR" \
           cargo build --release --locked --bin tollgate --target-dir target/pgo-gen; \
       else \
         cargo build --release --locked --bin tollgate; \
       fi \
    && rm -rf src benches "$PGO_PROFILE_DIR"
# The sources. Files keep the build context's modification times, which can be older than the
# stubs built above: touching the crate roots makes cargo rebuild tollgate itself. The build
# with the profile compiles the dependencies again: the profile covers their code too.
# Should the profile-guided path fail, the image gets the plain release build (the log says so).
# build.rs puts the commit into `tollgate_build_info`; the context has no .git, so pass it:
# --build-arg TOLLGATE_COMMIT=$(git rev-parse --short=12 HEAD) (else the image says unknown).
ARG TOLLGATE_COMMIT=unknown
COPY bench bench
COPY benches benches
COPY examples examples
COPY build.rs build.rs
COPY src src
RUN touch src/main.rs src/lib.rs \
    && if [ "$PGO" = 1 ] && bash bench/pgo.sh; then \
         cp target/pgo/release/tollgate /tollgate; \
       else \
         { [ "$PGO" != 1 ] || echo "profile-guided build failed: building without a profile" >&2; } \
         && cargo build --release --locked --bin tollgate \
         && cp target/release/tollgate /tollgate; \
       fi \
    && strip /tollgate

# ---- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: the system trust store, for anything else run in the container. tollgate
# itself does not read it: https:// upstreams and rediss:// stores are verified against its
# built-in Mozilla roots (or upstream.ca_file).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# An unprivileged user; the default ports are above 1024, so no extra capability is needed. It
# has a name for ps and ls; USER below names it by number.
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tollgate
COPY config.example.yaml /etc/tollgate/config.yaml
COPY --from=build /tollgate /usr/local/bin/tollgate
ENV TOLLGATE_CONFIG=/etc/tollgate/config.yaml
# 8080: proxy traffic. 9901: admin (/healthz, /readyz, /metrics).
EXPOSE 8080 9901
# Numeric: Kubernetes checks `runAsNonRoot` against the image's user only when it is a number
# (a name would need `runAsUser` in every manifest).
USER 10001:10001
# GET /readyz on the admin address of the configuration in TOLLGATE_CONFIG: exit 0 on 2xx, 1
# with the reason otherwise (`docker inspect` shows it). Its own timeout (2 s) is shorter than
# the check's, so a hung listener is reported as such.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["tollgate", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tollgate"]
