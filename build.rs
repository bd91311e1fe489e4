//! Compiles mcp-health's own gRPC API (proto/mcp_health/v1/gate.proto) with `protox`, a protobuf
//! compiler written in Rust, so a fresh machine needs no `protoc`; `tonic-prost-build` then
//! generates the messages, the server trait and the client into OUT_DIR.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["mcp_health/v1/gate.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
