//! Compiles mcp-health's own gRPC API (proto/mcp_health/v1/gate.proto) with `protox`, a protobuf
//! compiler written in Rust, so a fresh machine needs no `protoc`; `tonic-prost-build` then
//! generates the messages, the server trait and the client into OUT_DIR.
//!
//! It also records the rustc version for `mcp_health.build.info` (Cargo re-runs build scripts
//! when the compiler changes), and the commit the binary was built from for `--version`: an
//! operator comparing two instances needs more than `0.1.0`. `MCP_HEALTH_COMMIT` overrides it
//! (an image built from a context without `.git`); without either it is `unknown`.

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
    println!("cargo:rustc-env=MCP_HEALTH_COMMIT={}", commit());
    let fds = protox::compile(["mcp_health/v1/gate.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}

/// The short commit hash, `-dirty` when tracked files differ from it. Re-run when HEAD moves.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=MCP_HEALTH_COMMIT");
    if let Ok(c) = std::env::var("MCP_HEALTH_COMMIT") {
        if !c.trim().is_empty() {
            return c.trim().to_string();
        }
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    // HEAD and the branch it points at, wherever the git directory is (a worktree's `.git` is a file).
    for file in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])) {
        println!("cargo:rerun-if-changed={r}");
    }
    let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]) else { return "unknown".into() };
    let dirty = std::process::Command::new("git").args(["diff-index", "--quiet", "HEAD", "--"]).status().is_ok_and(|s| s.code() == Some(1));
    if dirty {
        format!("{hash}-dirty")
    } else {
        hash
    }
}
