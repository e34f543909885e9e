# syntax=docker/dockerfile:1
#
# tollgate container image.
#
#   docker build -t tollgate .
#   docker run -p 8080:8080 -p 9901:9901 -e UPSTREAM_URL=http://app:3000 tollgate
#   docker run -v $PWD/my.yaml:/etc/tollgate/config.yaml:ro tollgate     # your own config
#   docker run tollgate check                                            # validate the config
#
# docs/operations.md describes the image, and deploy/ has a Compose file and Kubernetes
# manifests that use it.
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
# User: tollgate, uid/gid 10001. The image has no curl or wget; bash and coreutils are there
# (deploy/docker-compose.yml shows a /readyz healthcheck over bash's /dev/tcp).
# Size: roughly the ~75 MB of debian:bookworm-slim plus a few MB of packages and the stripped
# binary (see docs/operations.md for the estimate).

# ---- build ------------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Profile-guided: bench/pgo.sh builds an instrumented tollgate, runs the benchmark's traffic
# through it (an nginx upstream, a Redis, wrk; installed here for the build only) and builds
# again with that profile, which takes about a fifth of the CPU off a request
# (docs/performance.md). Should any of that fail, the image gets the plain release build.
# --locked: build exactly the dependency versions in Cargo.lock.
RUN if apt-get update \
       && apt-get install -y --no-install-recommends nginx wrk redis-server python3 \
       && bash bench/pgo.sh; \
    then cp target/pgo/release/tollgate /tollgate; \
    else echo "profile-guided build failed: building without a profile" >&2 \
         && cargo build --release --locked && cp target/release/tollgate /tollgate; \
    fi \
    && strip /tollgate

# ---- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: the system trust store, for anything else run in the container. tollgate
# itself does not read it: https:// upstreams and rediss:// stores are verified against its
# built-in Mozilla roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# An unprivileged user; the default ports are above 1024, so no extra capability is needed.
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tollgate
COPY --from=build /tollgate /usr/local/bin/tollgate
COPY config.example.yaml /etc/tollgate/config.yaml
ENV TOLLGATE_CONFIG=/etc/tollgate/config.yaml
# 8080: proxy traffic. 9901: admin (/healthz, /readyz).
EXPOSE 8080 9901
USER tollgate:tollgate
STOPSIGNAL SIGTERM
ENTRYPOINT ["tollgate"]
