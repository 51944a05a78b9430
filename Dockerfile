# syntax=docker/dockerfile:1
# kiln's service images, one binary each, built from one builder stage:
#   docker build --target kiln-api -t kiln/kiln-api .        (kiln-scheduler, kiln-runner,
#   kiln-log-ingest, kiln-item-batch, kiln-advisor, kiln-predictor likewise;
#   deploy/compose/compose.yaml builds all seven)
#
# Static with musl: the binaries run FROM scratch, with nothing but the CA certificates, the
# gRPC health probe of the healthchecks and, for the runner, the static kiln-agent it puts into
# batch workers' containers. musl rather than glibc's static linking (scripts/build-agent.sh's
# +crt-static): a static glibc cannot resolve host names without its NSS modules, and every
# address in compose is a host name; musl's resolver reads /etc/resolv.conf and /etc/hosts
# itself. The C parts (aws-lc-sys, the bundled SQLite) build with musl-gcc and cmake.

# The toolchain of rust-toolchain.toml.
ARG RUST_VERSION=1.95.0
ARG RUST_TARGET=x86_64-unknown-linux-musl

FROM golang:1.25-bookworm AS probe
# grpc-health-probe for the compose healthchecks: the services serve grpc.health.v1.
ARG GRPC_HEALTH_PROBE_VERSION=v0.4.63
RUN CGO_ENABLED=0 GOBIN=/out go install \
      "github.com/grpc-ecosystem/grpc-health-probe@${GRPC_HEALTH_PROBE_VERSION}"

FROM node:20-bookworm AS ui
# The web UI, built into kiln-api (its embed-ui feature): the package versions are ui/'s lock file's.
WORKDIR /ui
COPY ui/package.json ui/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY ui/ ./
RUN npm run build

FROM rust:${RUST_VERSION}-bookworm AS builder
ARG RUST_TARGET
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools cmake ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add "${RUST_TARGET}"
WORKDIR /src
COPY . .
COPY --from=ui /ui/dist ui/dist
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "${RUST_TARGET}" \
      -p kiln-api -p kiln-scheduler -p kiln-runner -p kiln-log-ingest -p kiln-item-batch -p kiln-advisor \
      -p kiln-predictor -p kiln-agent --features kiln-api/embed-ui \
 && mkdir -p /out/bin /out/data \
 && for bin in kiln-api kiln-scheduler kiln-runner kiln-log-ingest kiln-item-batch kiln-advisor kiln-predictor \
      kiln-agent; do \
      cp "target/${RUST_TARGET}/release/${bin}" /out/bin/; \
      if ldd "/out/bin/${bin}" 2>&1 | grep -q '=>'; then echo "${bin} is not static" >&2; exit 1; fi; \
    done

# What every final image has: CA certificates, the probe, a data directory of the service user.
FROM scratch AS base
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=probe /out/grpc-health-probe /usr/local/bin/grpc-health-probe
COPY --from=builder --chown=10001:10001 /out/data /var/lib/kiln
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# Not root: a numeric user (scratch has no /etc/passwd).
USER 10001:10001
WORKDIR /var/lib/kiln

FROM base AS kiln-api
COPY --from=builder /out/bin/kiln-api /usr/local/bin/kiln-api
EXPOSE 7070 9470
ENTRYPOINT ["/usr/local/bin/kiln-api"]

FROM base AS kiln-log-ingest
COPY --from=builder /out/bin/kiln-log-ingest /usr/local/bin/kiln-log-ingest
EXPOSE 7071 9471
ENTRYPOINT ["/usr/local/bin/kiln-log-ingest"]

FROM base AS kiln-scheduler
COPY --from=builder /out/bin/kiln-scheduler /usr/local/bin/kiln-scheduler
EXPOSE 7073 9473
ENTRYPOINT ["/usr/local/bin/kiln-scheduler"]

FROM base AS kiln-runner
COPY --from=builder /out/bin/kiln-runner /usr/local/bin/kiln-runner
COPY --from=builder /out/bin/kiln-agent /usr/local/bin/kiln-agent
EXPOSE 7074 9474
ENTRYPOINT ["/usr/local/bin/kiln-runner"]

# compose's jobs-firewall: kiln-runner with `docker.firewall = "keeper"` in the Docker host's
# network namespace, keeping the iptables rules of the jobs' network (docs/security/network.md).
# Debian, for the iptables program (nf_tables; `docker.iptables = "iptables-legacy"` for a host
# whose engine uses the legacy tables). Runs as root with CAP_NET_ADMIN only.
FROM debian:bookworm-slim AS kiln-jobs-firewall
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/bin/kiln-runner /usr/local/bin/kiln-runner
ENTRYPOINT ["/usr/local/bin/kiln-runner"]

FROM base AS kiln-item-batch
COPY --from=builder /out/bin/kiln-item-batch /usr/local/bin/kiln-item-batch
EXPOSE 7075 9475
ENTRYPOINT ["/usr/local/bin/kiln-item-batch"]

FROM base AS kiln-advisor
COPY --from=builder /out/bin/kiln-advisor /usr/local/bin/kiln-advisor
EXPOSE 7076 9476
ENTRYPOINT ["/usr/local/bin/kiln-advisor"]

FROM base AS kiln-predictor
COPY --from=builder /out/bin/kiln-predictor /usr/local/bin/kiln-predictor
EXPOSE 7077 7078 9477
ENTRYPOINT ["/usr/local/bin/kiln-predictor"]
