//! The container image, built from the released binary and run as a user would: scripts/image-test
//! (podman: build with `--target prebuilt`, read-only, uid 10001, HEALTHCHECK healthy, the eight
//! calls sent from outside give their eight verdicts, SIGTERM drains within the compose file's
//! stop_grace_period). Here rather than as a step of scripts/test so `scripts/test --test image`
//! runs it alone and a failure is one named test in the run's summary.
//!
//! It needs scripts/release's output, named by MCP_HEALTH_DIST (scripts/test builds it before
//! `cargo test` and sets it: a test never compiles the release binary itself, which would wait on
//! cargo's build-directory lock): without it, SKIPPED. Without podman: SKIPPED outside CI, a
//! failure under CI=true (scripts/install-test-deps installs it).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_image_runs_read_only_healthy_decides_the_eight_calls_and_drains_on_sigterm() {
    let Some(dist) = std::env::var_os("MCP_HEALTH_DIST") else {
        println!("SKIPPED: MCP_HEALTH_DIST is not set (scripts/test runs scripts/release and sets it)");
        return;
    };
    let have_podman = Command::new("podman").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have_podman {
        assert!(std::env::var_os("CI").is_none(), "podman is missing under CI: scripts/install-test-deps installs it");
        println!("SKIPPED: podman is not installed (scripts/install-test-deps installs it)");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/image-test")).arg(&dist).current_dir(&root).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The figures (size, stop time) in the test's output: `cargo test -- --nocapture` shows them.
    println!("{stderr}");
    assert!(out.status.success(), "scripts/image-test failed:\n{stderr}");
    for line in
        ["HEALTHCHECK: healthy", "runs as uid 10001 on a read-only root filesystem", "eight verdicts", "SIGTERM: exit 0", "image size"]
    {
        assert!(stderr.contains(line), "scripts/image-test did not say '{line}':\n{stderr}");
    }
}
