//! Where a service's CPU goes, by stage, from a `perf record` of the running process (the bench
//! profiles the service from outside: nothing in the service times itself, so production pays
//! nothing for this).
//!
//! `perf record -e cpu-clock:u --call-graph dwarf` samples the process's user time with whole
//! stacks; each sample is given to the stage of the innermost frame that names one (by module
//! path: `mcp_health::normalize::…` is the walk, `h2::…` the framing, …), so the allocator's or
//! `memcpy`'s time counts for whoever called them. The user time of the window is shared out in
//! proportion to the samples; the kernel's time (`/proc/PID/stat`'s stime: sockets, futexes,
//! epoll) is reported as its own line, perf here being limited to user space
//! (`kernel.perf_event_paranoid=2`). The folded stacks are written beside, for a flame graph
//! (`inferno-flamegraph`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The stages, in the order of the data path; a sample goes to the first rule that matches its
/// innermost frame, then the next frame out, and so on.
const RULES: &[(&str, &[&str])] = &[
    ("walk + normalize", &["mcp_health::normalize::"]),
    ("correlate", &["mcp_health::correlate::"]),
    (
        "classify",
        &[
            "mcp_health::classify::",
            "mcp_health::engine::classify_with_clocks",
            "mcp_health::engine::verdicts_",
            "mcp_health::engine::session_context",
        ],
    ),
    ("verdict encoding (health spans)", &["mcp_health::emit::health_spans", "HealthSpanSink"]),
    ("verdict log", &["mcp_health::emit::verdict_log", "VerdictLog"]),
    (
        "metrics",
        &["mcp_health::emit::metrics", "MetricsSink", "opentelemetry_sdk::metrics", "opentelemetry::metrics", "mcp_health::telemetry"],
    ),
    ("status page", &["mcp_health::emit::status", "StatusSink"]),
    ("emission (exporters)", &["mcp_health::emit::", "tonic::client", "tonic::transport::channel"]),
    ("queue hops", &["mcp_health::flow::queue", "tokio::sync::"]),
    ("store (records, Redis protocol)", &["mcp_health::state::", "redis::"]),
    ("engine (steps, state)", &["mcp_health::engine::", "mcp_health::service::", "mcp_health::evidence::"]),
    (
        "receive + framing",
        &[
            "mcp_health::receive::",
            "mcp_health::flow::",
            "h2::",
            "hyper::",
            "hyper_util::",
            "tonic::",
            "tower::",
            "zstd",
            "rustls::",
            "ring::",
            "http_body",
            "axum::",
            "bytes::",
        ],
    ),
    ("runtime, wake-ups", &["tokio::", "mio::", "parking_lot", "std::thread", "std::sys"]),
];

/// Frames that are the allocator's (counted apart as well, as a share of all samples).
fn is_alloc(sym: &str) -> bool {
    sym.starts_with("mi_")
        || sym.starts_with("_mi_")
        || sym.starts_with("__rust_alloc")
        || sym.starts_with("__rust_dealloc")
        || sym.starts_with("__rust_realloc")
        || sym.contains("malloc")
        || sym.starts_with("free")
        || sym.starts_with("cfree")
        || sym.starts_with("_int_free")
        || sym.starts_with("__libc_free")
        || sym.starts_with("realloc")
}

/// A `perf record` of one process, started before the load and stopped after it.
pub struct Recording {
    child: Child,
    data: PathBuf,
    cpu0: (f64, f64),
    pid: u32,
}

/// `perf` on the PATH and allowed to sample this user's processes.
pub fn perf_available() -> bool {
    Command::new("perf").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// (user, system) CPU seconds of a process.
pub fn proc_user_system(pid: u32) -> (f64, f64) {
    let (user, system, _) = proc_user_system_faults(pid);
    (user, system)
}

/// (user, system) CPU seconds and minor page faults of a process.
pub fn proc_user_system_faults(pid: u32) -> (f64, f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks (USER_HZ, 100 on Linux) for the times; field 7 is minor faults.
    (get(11) / 100.0, get(12) / 100.0, get(7) as u64)
}

/// Start sampling `pid` (499 Hz, user space, DWARF stacks) into `dir`.
pub fn record(pid: u32, dir: &Path) -> Option<Recording> {
    let data = dir.join(format!("perf-{pid}.data"));
    let child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock:u", "-F", "499", "--call-graph", "dwarf,32768", "-p", &pid.to_string(), "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // perf attaches within a few ms; give it time before the load starts.
    std::thread::sleep(std::time::Duration::from_millis(300));
    Some(Recording { child, data, cpu0: proc_user_system(pid), pid })
}

/// The stage breakdown of a recording.
pub struct Breakdown {
    /// (stage, share of the user-space samples).
    pub stages: Vec<(String, f64)>,
    /// Share of the samples whose innermost frame is the allocator's.
    pub alloc_share: f64,
    pub user_secs: f64,
    pub system_secs: f64,
    pub samples: u64,
    /// Folded stacks (`inferno-flamegraph`'s input).
    pub folded: PathBuf,
}

impl Recording {
    /// Stop sampling and read the samples: the breakdown, and the folded stacks written beside
    /// the data file.
    pub fn finish(mut self) -> Option<Breakdown> {
        let cpu1 = proc_user_system(self.pid);
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        let script = Command::new("perf")
            .args(["script", "-F", "comm,ip,sym", "--no-inline", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&script.stdout);
        let mut folded: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_stage: BTreeMap<&'static str, u64> = BTreeMap::new();
        let (mut samples, mut alloc) = (0u64, 0u64);
        for block in text.split("\n\n") {
            let mut lines = block.lines().filter(|l| !l.trim().is_empty());
            let Some(head) = lines.next() else { continue };
            let comm = head.split_whitespace().next().unwrap_or("?").to_string();
            // Leaf first, as perf prints them.
            let frames: Vec<String> = lines.map(frame_symbol).collect();
            if frames.is_empty() {
                continue;
            }
            samples += 1;
            if frames.first().is_some_and(|f| is_alloc(f)) {
                alloc += 1;
            }
            *by_stage.entry(stage_of(&frames)).or_default() += 1;
            let mut stack = comm;
            for f in frames.iter().rev() {
                stack.push(';');
                stack.push_str(&f.replace(';', ":"));
            }
            *folded.entry(stack).or_default() += 1;
        }
        let _ = std::fs::remove_file(&self.data);
        if samples == 0 {
            return None;
        }
        let folded_path = self.data.with_extension("folded");
        let body: String = folded.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        std::fs::write(&folded_path, body).ok()?;
        let mut stages: Vec<(String, f64)> = RULES
            .iter()
            .map(|(name, _)| *name)
            .chain(["other"])
            .map(|name| (name.to_string(), *by_stage.get(name).unwrap_or(&0) as f64 / samples as f64))
            .collect();
        stages.retain(|(_, s)| *s > 0.0);
        Some(Breakdown {
            stages,
            alloc_share: alloc as f64 / samples as f64,
            user_secs: cpu1.0 - self.cpu0.0,
            system_secs: cpu1.1 - self.cpu0.1,
            samples,
            folded: folded_path,
        })
    }
}

/// A frame line of `perf script` (`\t    55d0c3a1b2c0 mcp_health::x::y::h0123…`): its symbol,
/// without the legacy mangling's hash.
fn frame_symbol(line: &str) -> String {
    let mut parts = line.trim().splitn(2, ' ');
    let _ip = parts.next();
    let sym = parts.next().unwrap_or("[unknown]").trim();
    let sym = sym.split(" (").next().unwrap_or(sym);
    let sym = sym.split('+').next().unwrap_or(sym);
    match sym.rfind("::h") {
        Some(i) if sym.len() - i == 19 && sym[i + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => sym[..i].to_string(),
        _ => sym.to_string(),
    }
}

/// The stage of a sample: its innermost frame that a rule names.
fn stage_of(frames: &[String]) -> &'static str {
    for f in frames {
        // `<mcp_health::x::Y as Trait>::method`: the type's path is the module.
        let f = f.trim_start_matches('<');
        for (name, prefixes) in RULES {
            if prefixes.iter().any(|p| f.starts_with(p) || (!p.contains("::") && f.contains(p))) {
                return name;
            }
        }
    }
    "other"
}

impl Breakdown {
    /// Print the breakdown in µs per span (`spans`: accepted in the profiled window).
    pub fn print(&self, label: &str, spans: u64) {
        let per = |secs: f64| secs * 1e6 / spans.max(1) as f64;
        println!(
            "stage breakdown, {label} ({} samples; {:.3} µs/span user, {:.3} µs/span kernel):",
            self.samples,
            per(self.user_secs),
            per(self.system_secs)
        );
        for (stage, share) in &self.stages {
            println!("  {:<34} {:>8.3} µs/span {:>6.1} %", stage, per(self.user_secs) * share, 100.0 * share);
        }
        println!("  {:<34} {:>8.3} µs/span", "kernel (sockets, futex, epoll)", per(self.system_secs));
        println!(
            "  (of the user samples, {:.1} % in the allocator, counted above for its callers; folded stacks: {})",
            100.0 * self.alloc_share,
            self.folded.display()
        );
    }
}
