# syntax=docker/dockerfile:1
#
# tollgate container image.
#
#   docker build -t tollgate .
#   docker run -p 8080:8080 -p 9901:9901 -e UPSTREAM_URL=http://app:3000 tollgate
#   docker run -v $PWD/my.yaml:/etc/tollgate/config.yaml:ro tollgate     # your own config
#   docker run tollgate check                                            # validate the config
#
# Ports (as set in the default config, config.example.yaml):
#   8080  the proxy listener (`listen`)
#   9901  the admin listener (`admin`): GET /healthz (alive), GET /readyz (200, or 503 while draining)
# Paths:
#   /usr/local/bin/tollgate       the binary (the entrypoint)
#   /etc/tollgate/config.yaml     the configuration, found through TOLLGATE_CONFIG; the image
#                                 ships config.example.yaml there; mount a file over it to replace it
# Stopping: SIGTERM (docker stop) drains in-flight requests for up to `shutdown_timeout`, then exits 0.

# ---- build ------------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# --locked: build exactly the dependency versions in Cargo.lock.
RUN cargo build --release --locked \
    && strip target/release/tollgate

# ---- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: for https:// upstreams and rediss:// stores.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# An unprivileged user; the default ports are above 1024, so no extra capability is needed.
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tollgate
COPY --from=build /src/target/release/tollgate /usr/local/bin/tollgate
COPY config.example.yaml /etc/tollgate/config.yaml
ENV TOLLGATE_CONFIG=/etc/tollgate/config.yaml
# 8080: proxy traffic. 9901: admin (/healthz, /readyz).
EXPOSE 8080 9901
USER tollgate:tollgate
STOPSIGNAL SIGTERM
ENTRYPOINT ["tollgate"]
