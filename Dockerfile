# Multi-stage build: compile in the Rust image, run from a slim Debian with the binary and the CA
# bundle. `docker build -t mcp-health .`; see otel-config/container.yaml for what the image runs.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY otel-config ./otel-config
COPY proto ./proto
# The `image` profile (Cargo.toml): the release build, stripped, without the debug line tables the
# release profile keeps for the benches.
RUN cargo build --profile image --locked --bin mcp-health

FROM debian:bookworm-slim
# ca-certificates: the system trust store the exporter verifies an https:// backend against
# (bookworm-slim ships none; without it every TLS export fails with an unknown issuer).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 mcp-health
COPY --from=build /src/target/image/mcp-health /usr/local/bin/mcp-health
# Listens on the container's interfaces; addresses and log level move with MCP_HEALTH_* variables,
# mcp-health's own telemetry with the standard OTEL_* ones (see the file). The fan-out layout:
# received spans are never passed on.
COPY otel-config/container.yaml /etc/mcp-health/config.yaml
USER 10001
EXPOSE 14317 14318 9464 13133
# SIGTERM drains (service.telemetry.shutdown_timeout: 8s in container.yaml), inside `docker stop`'s
# default 10 s; give a longer shutdown_timeout a longer `docker stop -t` / `--stop-timeout`.
STOPSIGNAL SIGTERM
# No curl in the image: the binary asks its own health check.
HEALTHCHECK --interval=10s --timeout=4s --retries=3 CMD ["/usr/local/bin/mcp-health", "health", "--endpoint", "127.0.0.1:13133"]
ENTRYPOINT ["/usr/local/bin/mcp-health"]
CMD ["serve", "--config", "/etc/mcp-health/config.yaml"]
