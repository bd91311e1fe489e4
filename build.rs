//! Compiles mcp-health's own gRPC API (proto/mcp_health/v1/gate.proto) with `protox`, a protobuf
//! compiler written in Rust, so a fresh machine needs no `protoc`; `tonic-prost-build` then
//! generates the messages, the server trait and the client into OUT_DIR.
//!
//! It also records the rustc version for `mcp_health.build.info` (Cargo re-runs build scripts
//! when the compiler changes).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default();
    println!("cargo:rustc-env=MCP_HEALTH_RUSTC_VERSION={version}");
    let fds = protox::compile(["mcp_health/v1/gate.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
