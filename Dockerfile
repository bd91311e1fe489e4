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
COPY otel-config/mcp-health.yaml /etc/mcp-health/config.yaml
USER 10001
EXPOSE 14317 14318 9464 13133
ENTRYPOINT ["/usr/local/bin/mcp-health"]
CMD ["serve", "--config", "/etc/mcp-health/config.yaml"]
