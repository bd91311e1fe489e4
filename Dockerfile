# Multi-stage build: compile in the Rust image, run from a slim Debian with only the binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY otel-config ./otel-config
COPY proto ./proto
RUN cargo build --release --locked --bin mcp-health

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 mcp-health
COPY --from=build /src/target/release/mcp-health /usr/local/bin/mcp-health
# Listens on the container's interfaces; addresses and log level move with MCP_HEALTH_* variables,
# mcp-health's own telemetry with the standard OTEL_* ones (see the file).
COPY otel-config/container.yaml /etc/mcp-health/config.yaml
USER 10001
EXPOSE 14317 14318 9464 13133
# No curl in the image: the binary asks its own health check.
HEALTHCHECK --interval=10s --timeout=4s --retries=3 CMD ["/usr/local/bin/mcp-health", "health", "--endpoint", "127.0.0.1:13133"]
ENTRYPOINT ["/usr/local/bin/mcp-health"]
CMD ["serve", "--config", "/etc/mcp-health/config.yaml"]
