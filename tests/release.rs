//! The release artifacts as a user gets them (scripts/release's dist/<version>/): the tarball
//! unpacked and its binary run (`--version`, `validate` of every shipped configuration), the
//! checksums, the SBOM; and the GitHub workflows checked by actionlint.
//!
//! The artifacts are named by MCP_HEALTH_DIST (scripts/test runs scripts/release before
//! `cargo test` and sets it; a test never compiles the release binary itself, which would wait on
//! cargo's build-directory lock): without it these tests print SKIPPED.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dist() -> Option<PathBuf> {
    let d = std::env::var_os("MCP_HEALTH_DIST")?;
    let d = root().join(d);
    assert!(d.is_dir(), "MCP_HEALTH_DIST={} is not a directory", d.display());
    Some(d)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package of this machine's architecture (the release workflow runs these tests on x86_64
/// and on aarch64).
fn name() -> String {
    format!("mcp-health-{VERSION}-{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// The tarball unpacked in a temporary directory; the package's directory in it.
fn unpacked(dist: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let tarball = dist.join(format!("{}.tar.gz", name()));
    assert!(tarball.is_file(), "no {}", tarball.display());
    run(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(tmp.path()));
    let dir = tmp.path().join(name());
    (tmp, dir)
}

#[test]
fn the_tarball_holds_the_binary_the_documents_and_every_shipped_config() {
    let Some(dist) = dist() else {
        println!("SKIPPED: MCP_HEALTH_DIST is not set (scripts/test runs scripts/release and sets it)");
        return;
    };
    let (_tmp, dir) = unpacked(&dist);
    for f in ["mcp-health", "LICENSE", "README.md", "CHANGELOG.md"] {
        assert!(dir.join(f).is_file(), "{f} missing from the tarball");
    }
    let tracked = run(Command::new("git").args(["ls-files", "otel-config"]).current_dir(root()));
    let tracked: Vec<&str> = tracked.lines().collect();
    assert!(tracked.len() > 5, "otel-config tracked: {tracked:?}");
    for f in tracked {
        assert!(dir.join(f).is_file(), "{f} missing from the tarball");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir.join("mcp-health")).unwrap().permissions());
    assert_eq!(mode & 0o111, 0o111, "the binary is executable by all");
    // Stripped (the `image` profile): no symbol table, which would name it in the section names.
    let bin = std::fs::read(dir.join("mcp-health")).unwrap();
    assert!(!bin.windows(7).any(|w| w == b".symtab"), "the binary has a symbol table: not stripped");
    assert!(bin.len() < 40_000_000, "the binary is {} bytes: debug information left in?", bin.len());
}

#[test]
fn the_packaged_binary_names_its_version_and_validates_every_shipped_config() {
    let Some(dist) = dist() else {
        println!("SKIPPED: MCP_HEALTH_DIST is not set (scripts/test runs scripts/release and sets it)");
        return;
    };
    let (_tmp, dir) = unpacked(&dist);
    let bin = dir.join("mcp-health");
    let version = run(Command::new(&bin).arg("--version"));
    assert!(version.starts_with(&format!("mcp-health {VERSION} (commit ")), "--version: {version}");
    assert!(!version.contains("commit unknown"), "--version names no commit: {version}");

    // Every mcp-health configuration shipped: the .yaml files of otel-config/ but the collector's
    // (collector*.yaml) and the tap's verifier rules (verifiers.*), checked as `serve` would check
    // them before it binds, in an environment without OTEL_* variables.
    let mut checked = BTreeSet::new();
    for e in std::fs::read_dir(dir.join("otel-config")).unwrap() {
        let f = e.unwrap().file_name().into_string().unwrap();
        if !f.ends_with(".yaml") || f.starts_with("collector") || f.starts_with("verifiers") {
            continue;
        }
        let out = Command::new(&bin)
            .args(["validate", &format!("otel-config/{f}")])
            .current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "validate otel-config/{f}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(": ok"),
            "validate otel-config/{f}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        checked.insert(f);
    }
    for f in ["container.yaml", "default.yaml", "mcp-health.yaml", "mcp-health.inline.yaml", "mcp-health.compose.yaml"] {
        assert!(checked.contains(f), "{f} was not validated (checked: {checked:?})");
    }
}

#[test]
fn the_checksums_match_and_the_sbom_lists_the_crates_of_the_binary() {
    let Some(dist) = dist() else {
        println!("SKIPPED: MCP_HEALTH_DIST is not set (scripts/test runs scripts/release and sets it)");
        return;
    };
    let sums = run(Command::new("sha256sum").args(["--strict", "-c", "SHA256SUMS"]).current_dir(&dist));
    for f in [format!("{}.tar.gz", name()), format!("{}.cdx.json", name())] {
        assert!(sums.contains(&format!("{f}: OK")), "SHA256SUMS does not cover {f}: {sums}");
    }
    let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(dist.join(format!("{}.cdx.json", name()))).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    let component = &sbom["metadata"]["component"];
    assert_eq!(component["name"], "mcp-health", "{component:#}");
    assert_eq!(component["version"], VERSION, "{component:#}");
    let names: BTreeSet<&str> = sbom["components"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    for dep in ["tokio", "tonic", "rustls", "ring", "redb", "rusqlite"] {
        assert!(names.contains(dep), "the SBOM lists no {dep}");
    }
    // The binary's crates (and the build dependencies that generate its code), not the tests':
    // no direct dev-dependency. (`cargo metadata` unifies features with the dev-dependencies', so
    // a crate such a feature adds may still be listed: proptest, through const-hex's optional
    // dependency.)
    assert!(names.contains("tonic-prost-build"), "the SBOM lists no build dependency");
    assert!(!names.contains("rcgen"), "the SBOM lists the dev-dependency rcgen");
    // Every component with a version, a package URL a scanner can match and its license.
    for c in sbom["components"].as_array().unwrap() {
        assert!(c["version"].is_string() && c["purl"].as_str().is_some_and(|p| p.starts_with("pkg:cargo/")), "{c:#}");
        assert!(c["licenses"].as_array().is_some_and(|l| !l.is_empty()), "no license: {c:#}");
    }
    // Not the tests' crates, nor another platform's (the binary's, for this triple).
    assert!(!names.contains("windows-sys"), "the SBOM lists windows-sys: {names:?}");
    // No path of the machine that built it.
    let text = std::fs::read_to_string(dist.join(format!("{}.cdx.json", name()))).unwrap();
    assert!(!text.contains(root().to_str().unwrap()), "the SBOM names the build directory {}", root().display());
}

#[test]
fn every_workflow_passes_actionlint() {
    let venv = root().join(".venv-actionlint/bin/actionlint");
    let actionlint = if venv.is_file() { venv } else { PathBuf::from("actionlint") };
    if Command::new(&actionlint).arg("-version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "actionlint is missing under CI: scripts/install-test-deps installs it");
        println!("SKIPPED: actionlint is not installed (scripts/install-test-deps installs it)");
        return;
    }
    let workflows: Vec<PathBuf> = std::fs::read_dir(root().join(".github/workflows"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    assert!(!workflows.is_empty(), "no workflow in .github/workflows");
    // actionlint checks the workflows (and the `run:` scripts with shellcheck where installed);
    // action.yml is no workflow: it is read as YAML at least, and every action it uses named.
    let out = Command::new(&actionlint).args(["-no-color"]).args(&workflows).current_dir(root()).output().unwrap();
    assert!(out.status.success(), "actionlint:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let action = root().join("action.yml");
    if action.is_file() {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&action).unwrap()).expect("action.yml is YAML");
        assert!(v["runs"]["using"].is_string(), "action.yml names no runs.using");
    }
}
