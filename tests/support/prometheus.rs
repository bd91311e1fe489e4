//! A real Prometheus for the end-to-end tests: started on loopback with a 1 s scrape of one
//! target, queried over its HTTP API, killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::http_get;

pub fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

/// Whether to run; panics with instructions when the binaries are missing and skipping was not asked for.
pub fn prometheus_available() -> bool {
    let missing: Vec<&str> = ["prometheus", "promtool"].into_iter().filter(|b| on_path(b).is_none()).collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("MCP_HEALTH_SKIP_PROMETHEUS").is_ok_and(|v| v == "1") {
        eprintln!("skipping: {} not on PATH and MCP_HEALTH_SKIP_PROMETHEUS=1", missing.join(", "));
        return false;
    }
    panic!(
        "{} not found on PATH. Install Prometheus (Debian/Ubuntu: `apt-get install prometheus`, which provides \
         prometheus and promtool), or set MCP_HEALTH_SKIP_PROMETHEUS=1 to skip this test.",
        missing.join(" and ")
    );
}

/// A Prometheus server, killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Prometheus {
    pub async fn start(target: std::net::SocketAddr) -> Prometheus {
        Prometheus::start_with_rules(target, None).await
    }

    /// Start with `rule_files` pointing at `rules` (the project's alert rules, unchanged).
    pub async fn start_with_rules(target: std::net::SocketAddr, rules: Option<&std::path::Path>) -> Prometheus {
        Prometheus::start_with(target, rules, &[]).await
    }

    /// Start with extra command-line flags (`--enable-feature=exemplar-storage`).
    pub async fn start_with(target: std::net::SocketAddr, rules: Option<&std::path::Path>, flags: &[&str]) -> Prometheus {
        Prometheus::start_with_targets(&[target], rules, flags).await
    }

    /// Scrape several targets in one job (`instance` tells them apart).
    pub async fn start_with_targets(targets: &[std::net::SocketAddr], rules: Option<&std::path::Path>, flags: &[&str]) -> Prometheus {
        let target = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let cfg = dir.path().join("prometheus.yml");
            std::fs::write(
                &cfg,
                format!(
                    "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n{}scrape_configs:\n  - job_name: mcp-health\n    scrape_interval: 1s\n    static_configs:\n      - targets: [{target}]\n",
                    rules.map_or(String::new(), |r| format!("rule_files:\n  - {}\n", r.display()))
                ),
            )
            .unwrap();
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let log = dir.path().join("prometheus.log");
            let child = Command::new("prometheus")
                .arg(format!("--config.file={}", cfg.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address={addr}"))
                .args(flags)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join("prometheus.out")).unwrap())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start prometheus");
            let mut p = Prometheus { child, addr, _dir: dir, log };
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(Some(_)) = p.child.try_wait() {
                    last = std::fs::read_to_string(&p.log).unwrap_or_default();
                    break; // most likely the port was taken in between: try another
                }
                if http_get(addr, "/-/ready").await.is_ok_and(|r| r.status == 200) {
                    return p;
                }
                if std::time::Instant::now() >= deadline {
                    panic!("prometheus not ready within 60 s:\n{}", std::fs::read_to_string(&p.log).unwrap_or_default());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("prometheus did not start:\n{last}");
    }

    /// GET an API path; the parsed JSON of a 200 answer.
    pub async fn api(&self, path_and_query: &str) -> Option<serde_json::Value> {
        let r = http_get(self.addr, path_and_query).await.ok()?;
        if r.status != 200 {
            return None;
        }
        serde_json::from_slice(&r.body).ok()
    }

    /// Prometheus's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of an instant query with a single scalar-like result.
    pub async fn query(&self, q: &str) -> Option<String> {
        let r = http_get(self.addr, &format!("/api/v1/query?query={}", urlencode(q))).await.ok()?;
        if r.status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        if v["status"] != "success" {
            return None;
        }
        let result = v["data"]["result"].as_array()?;
        let first = result.first()?;
        first["value"][1].as_str().map(str::to_string)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
