# The mcp-health image: the stripped `image`-profile binary on a slim Debian, with the CA bundle and
# otel-config/container.yaml (see that file for what the image runs). Two ways to get the binary:
#
#   docker build -t mcp-health .
#       compiles it here, in the Rust image (the default target, `compiled`);
#   docker build --target prebuilt -t mcp-health .
#       copies one compiled beforehand: dist/linux-${TARGETARCH}/mcp-health (`scripts/release`
#       writes the amd64 one; `--build-arg PREBUILT=path/in/the/context` names another file).
#       CI and the release workflow compile once and build the image from that binary.
#
# Multi-arch: `docker buildx build --platform linux/amd64,linux/arm64 --target prebuilt .` with
# dist/linux-amd64/mcp-health and dist/linux-arm64/mcp-health in place (the release workflow builds
# the arm64 binary on an arm64 runner, in the same bookworm Rust image, so its glibc matches the base).
# With the default target, buildx compiles for each platform (arm64 under QEMU: slow).
#
# BASE is the runtime image, `debian:bookworm-slim` by default. It is an argument so a machine that
# cannot pull from a registry can give a local Debian image of its own (scripts/image-test builds
# one with debootstrap); it must be Debian bookworm or a derivative: the binary links glibc 2.36.

ARG BASE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1.95-bookworm

# ---- build: compile in the Rust image (the default target's binary) ---------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY otel-config ./otel-config
COPY proto ./proto
# No .git in the context (.dockerignore): --version names the commit given here, else `unknown`.
ARG MCP_HEALTH_COMMIT=
ENV MCP_HEALTH_COMMIT=${MCP_HEALTH_COMMIT}
# The `image` profile (Cargo.toml): the release build, stripped, without the debug line tables the
# release profile keeps for the benches.
RUN cargo build --profile image --locked --bin mcp-health

# ---- runtime: everything but the binary, shared by both targets -------------------------------
FROM ${BASE} AS runtime
# ca-certificates: the system trust store the exporter verifies an https:// backend against
# (bookworm-slim ships none; without it every TLS export fails with an unknown issuer). Skipped
# when the base already has it (a local test base made with it), so no network is needed then.
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mcp-health
# Listens on the container's interfaces; addresses and log level move with MCP_HEALTH_* variables,
# mcp-health's own telemetry with the standard OTEL_* ones (see the file). The fan-out layout:
# received spans are never passed on. Nothing is written below / (no storage.directory, verdicts
# to stdout), so the image runs with a read-only root filesystem.
COPY otel-config/container.yaml /etc/mcp-health/config.yaml
USER 10001
EXPOSE 14317 14318 9464 13133
# SIGTERM drains (service.telemetry.shutdown_timeout: 8s in container.yaml), inside `docker stop`'s
# default 10 s; give a longer shutdown_timeout a longer `docker stop -t` / `--stop-timeout`.
STOPSIGNAL SIGTERM
# No curl in the image: the binary asks its own health check. (Kept by Docker-format images; an
# OCI-format build, buildah's default, drops HEALTHCHECK: build with `--format docker`.)
HEALTHCHECK --interval=10s --timeout=4s --retries=3 CMD ["/usr/local/bin/mcp-health", "health", "--endpoint", "127.0.0.1:13133"]
ENTRYPOINT ["/usr/local/bin/mcp-health"]
CMD ["serve", "--config", "/etc/mcp-health/config.yaml"]

# ---- prebuilt: the runtime with a binary compiled beforehand -----------------------------------
FROM runtime AS prebuilt
# Set by BuildKit/buildah for the platform being built (amd64, arm64); only this stage needs it.
ARG TARGETARCH
ARG PREBUILT=dist/linux-${TARGETARCH}/mcp-health
COPY --chmod=0755 ${PREBUILT} /usr/local/bin/mcp-health

# ---- compiled (default): the runtime with the binary compiled in `build` -----------------------
FROM runtime AS compiled
COPY --from=build /src/target/image/mcp-health /usr/local/bin/mcp-health
