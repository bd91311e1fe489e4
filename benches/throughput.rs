//! End-to-end throughput of the service beside the raw protobuf decode rate of the same batches.
//!
//!     cargo bench --bench throughput            (MCP_HEALTH_BENCH_SECS=10 by default)
//!     MCP_HEALTH_BENCH_BASELINE=/path/to/older/mcp-health cargo bench --bench throughput
//!         (the plaintext and mixed lines alternate the two builds, MCP_HEALTH_BENCH_ROUNDS=3
//!         rounds, and print each round's ratio and the medians)
//!     MCP_HEALTH_BENCH_ONLY=memory cargo bench --bench throughput   (the memory figures alone)
//!     MCP_HEALTH_BENCH_ONLY=walk cargo bench --bench throughput     (decode and walk rates alone)
//!     MCP_HEALTH_BENCH_ONLY=cluster cargo bench --bench throughput  (three instances on one Redis
//!         beside one without a store: spans per CPU-second per instance and in total)
//!     MCP_HEALTH_BENCH_ONLY=mixed cargo bench --bench throughput    (traffic as a shared pipeline
//!         carries it: ~95 % ordinary HTTP and database spans, 5 % MCP; walk rate and service)
//!     MCP_HEALTH_BENCH_ONLY=plaintext cargo bench --bench throughput  (the MCP-only plaintext
//!         line alone, interleaved with the baseline when given)
//!     MCP_HEALTH_BENCH_ONLY=profile cargo bench --bench throughput  (the stage breakdowns alone:
//!         plaintext, inline and mixed, baseline first when given)
//!     MCP_HEALTH_BENCH_PROFILE=1 ...          (every service line is followed by a window under
//!         `perf record` and its stage breakdown, CPU µs per span per stage; folded stacks for a
//!         flame graph in MCP_HEALTH_BENCH_PROFILE_DIR, by default the system's temp directory)
//!     MCP_HEALTH_BENCH_MAX_DECIDED=100000 ... (decided chains kept for revision, and on Redis
//!         written to it, as the service's default does; 0, none, by default)
//!     MCP_HEALTH_BENCH_LIMIT_MIB=2000 ...     (every service under a memory limiter of that size)
//!     MCP_HEALTH_BENCH_RATE=200000 ...        (the cluster lines' senders paced at that many spans/s
//!         each: CPU per span at the same intake, not flat out)
//!     MCP_HEALTH_BENCH_HELD_QUEUE=8 MCP_HEALTH_BENCH_HELD_CONSUMERS=10 ...   (the held-request
//!         run's pass-through queue and workers: requests held = queue + workers)
//!
//! With a baseline binary, the service is measured twice in the same run — the baseline, then
//! this build — and the two are printed side by side (shared machines are noisy: compare ratios).
//!
//! Prints: prost decode rate (one core, this process), normalize rate, the service's accepted
//! spans/s over loopback gRPC, its CPU µs per span (from /proc), spans/s per core, peak RSS, and
//! bytes per in-flight chain (held chains, measured by the correlator and by RSS growth).
//! Numbers, not assertions: speed is reported, never asserted by a test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_health::testing::loadgen::{self, EncodedBatch, SendOptions};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "support/stages.rs"]
mod stages;

#[global_allocator]
static GLOBAL: mcp_health::Mimalloc = mcp_health::Mimalloc;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn proc_cpu_secs(pid: u32) -> f64 {
    let (user, system) = stages::proc_user_system(pid);
    user + system
}

/// CPU seconds of the calling thread: the in-process rates (decode, walk) are per CPU-second
/// of the one thread that runs them, as the service's are per CPU-second of its process, so
/// other work on a shared machine does not move their ratios.
fn thread_cpu_secs() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn proc_status_kib(pid: u32, key: &str) -> u64 {
    status_field(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(), key)
}

/// The number after `key` in a `/proc/…/status` text (0 when absent).
fn status_field(status: &str, key: &str) -> u64 {
    status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Context switches of all of a process's threads: (voluntary, involuntary). Involuntary ones
/// are the threads' time taken by others on the same cores.
fn ctxt_switches(pid: u32) -> (u64, u64) {
    let mut sum = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let s = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        sum.0 += status_field(&s, "voluntary_ctxt_switches:");
        sum.1 += status_field(&s, "nonvoluntary_ctxt_switches:");
    }
    sum
}

fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Wait until the service holds no chain in flight (at most a minute): how long that took.
fn drained(prom: u16) -> Duration {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let text = scrape(prom);
        if text.contains("mcp_health_chains_in_flight") && metric(&text, "mcp_health_chains_in_flight") == 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    t.elapsed()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name) && !l.starts_with('#')).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

struct Service {
    child: Child,
    grpc: u16,
    prom: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// rotel's agent binary (PyPI `rotel`, in the venv `scripts/install-test-deps` makes).
fn rotel_agent() -> Option<std::path::PathBuf> {
    let lib = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-rotel/lib");
    std::fs::read_dir(lib).ok()?.flatten().map(|d| d.path().join("site-packages/rotel/rotel-agent")).find(|p| p.is_file())
}

/// A rotel agent taking OTLP/gRPC on a free port, exporting to its blackhole or, given a port,
/// forwarding over OTLP/gRPC to it.
struct Rotel {
    child: Child,
    grpc: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_rotel(agent: &std::path::Path) -> Rotel {
    start_rotel_to(agent, None)
}

/// `upstream`: forward to this OTLP/gRPC port the way the inline service passes spans through
/// (gRPC, uncompressed), instead of dropping them.
fn start_rotel_to(agent: &std::path::Path, upstream: Option<u16>) -> Rotel {
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, http) = (free_port(), free_port());
    let exporter: Vec<String> = match upstream {
        None => vec!["--exporter".into(), "blackhole".into()],
        Some(port) => ["--exporter", "otlp", "--otlp-exporter-endpoint", &format!("http://127.0.0.1:{port}")]
            .into_iter()
            .chain(["--otlp-exporter-protocol", "grpc", "--otlp-exporter-compression", "none"])
            .map(String::from)
            .collect(),
    };
    let child = Command::new(agent)
        .args(["start", "--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}"), "--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
        .args(&exporter)
        .arg("--pid-file")
        .arg(dir.path().join("rotel.pid"))
        .arg("--log-file")
        .arg(dir.path().join("rotel.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rotel");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        assert!(Instant::now() < deadline, "rotel did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Rotel { child, grpc, _dir: dir }
}

/// A test CA and a server certificate for `localhost` (PEM): CA, certificate, key.
fn test_pki() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["localhost".to_string()]).expect("params").signed_by(&key, &issuer).expect("cert");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// `tls`: (certificate PEM, key PEM) for the gRPC receiver; `upstream`: an OTLP/gRPC port that
/// gets pass-through and health spans (the inline deployment).
fn start_binary(bin: &str, decision_wait: &str, max_wait: &str, tls: Option<(&str, &str)>, upstream: Option<u16>) -> Service {
    start_binary_with(bin, decision_wait, max_wait, tls, upstream, "", "")
}

/// [`start_binary`] with more lines for `exporters.otlp` (indented four spaces).
fn start_binary_with(
    bin: &str,
    decision_wait: &str,
    max_wait: &str,
    tls: Option<(&str, &str)>,
    upstream: Option<u16>,
    otlp_extra: &str,
    top_extra: &str,
) -> Service {
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, prom, health) = (free_port(), free_port(), free_port());
    let tls_lines = match tls {
        Some((cert, key)) => {
            let (c, k) = (dir.path().join("server.pem"), dir.path().join("server.key"));
            std::fs::write(&c, cert).expect("write cert");
            std::fs::write(&k, key).expect("write key");
            format!("        tls:\n          cert_file: {}\n          key_file: {}\n", c.display(), k.display())
        }
        None => String::new(),
    };
    let otlp_lines = match upstream {
        Some(port) => format!(
            "  otlp:\n    endpoint: http://127.0.0.1:{port}\n    protocol: grpc\n    compression: none\n    passthrough: true\n{}    metrics: false\n{otlp_extra}",
            if otlp_extra.contains("health_spans:") { "" } else { "    health_spans: true\n" }
        ),
        None => String::new(),
    };
    // With MCP_HEALTH_BENCH_LIMIT_MIB, every service runs under `processors.memory_limiter`
    // (the binary then has mimalloc return freed memory at once).
    let limiter =
        std::env::var("MCP_HEALTH_BENCH_LIMIT_MIB").map(|m| format!("  memory_limiter:\n    limit_mib: {m}\n")).unwrap_or_default();
    // Decided chains kept for revision: none by default (the memory lines measure chains in
    // flight); `MCP_HEALTH_BENCH_MAX_DECIDED=100000` (the service's default) for the cluster
    // lines as a deployment runs them, where every decided chain is also written to the store.
    let max_decided = std::env::var("MCP_HEALTH_BENCH_MAX_DECIDED").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let cfg = format!(
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{grpc}\n{tls_lines}\
processors:\n{limiter}  mcp_health:\n    decision_wait: {decision_wait}\n    max_wait: {max_wait}\n    max_chains: 2000000\n    max_bytes: 4294967296\n    queue_size: 64\n    max_decided: {max_decided}\n\
exporters:\n  prometheus:\n    endpoint: 127.0.0.1:{prom}\n{otlp_lines}\
extensions:\n  health_check:\n    endpoint: 127.0.0.1:{health}\n\
service:\n  telemetry:\n    logs:\n      level: warn\n{top_extra}"
    );
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, cfg).expect("write config");
    let child = Command::new(bin)
        .args(["serve", "--config", path.to_str().unwrap_or_default()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mcp-health");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", health)).is_err() {
        assert!(Instant::now() < deadline, "service did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Service { child, grpc, prom, _dir: dir }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs benches as tests with no flag:
    // then only check that the batches build.
    let is_bench = std::env::args().any(|a| a == "--bench");
    let secs: u64 = std::env::var("MCP_HEALTH_BENCH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let calls_per_batch = 171; // 513 spans, about the size an SDK batch processor sends
    let reqs: Vec<ExportTraceServiceRequest> = (0..64).map(|b| loadgen::build_request(b, calls_per_batch)).collect();
    let batches: Vec<EncodedBatch> = reqs.iter().map(loadgen::encode).collect();
    let spans_per_batch = batches[0].spans;
    let bytes_per_span = batches[0].bytes.len() as f64 / spans_per_batch as f64;
    if !is_bench {
        assert!(batches.iter().all(|b| b.trace_id_offsets.len() as u64 == b.spans));
        println!("throughput bench: batches build ({} spans each); run `cargo bench --bench throughput` to measure", spans_per_batch);
        return;
    }
    println!("batch: {spans_per_batch} spans, {:.0} bytes/span encoded", bytes_per_span);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let baseline = std::env::var("MCP_HEALTH_BENCH_BASELINE").ok();
    let this = env!("CARGO_BIN_EXE_mcp-health");
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "cluster") {
        // The baseline's lines first, when given (one after the other: compare the ratios).
        if let Some(base) = &baseline {
            println!("== baseline: {base}");
            cluster(&rt, base, calls_per_batch, secs);
            println!("== this build");
        }
        cluster(&rt, this, calls_per_batch, secs);
        return;
    }
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "memory") {
        // The memory figures alone (a few seconds each), baseline first when given.
        if let Some(base) = &baseline {
            print!("baseline:   ");
            held_request_memory(&rt, base);
        }
        print!("this build: ");
        held_request_memory(&rt, this);
        if let Some(base) = &baseline {
            held_chain_memory(&rt, base, &Arc::new(batches.clone()), "baseline:   ");
        }
        held_chain_memory(&rt, this, &Arc::new(batches), "this build: ");
        return;
    }

    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "mixed") {
        mixed(&rt, this, baseline.as_deref(), secs);
        return;
    }
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "plaintext") {
        // The MCP-only plaintext line alone (interleaved with the baseline when given).
        let decode_rate = decode_rate_of(&batches, Duration::from_secs(2));
        println!("prost decode:            {:>10.0} spans per CPU-second (one thread)", decode_rate);
        let batches = Arc::new(batches);
        interleaved(this, baseline.as_deref(), "plaintext", |bin, label| {
            measure(&rt, bin, &batches, secs, decode_rate, None, None, &SendOptions::default(), label).0
        });
        return;
    }
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "inline") {
        // The inline line and rotel's two lines alone, with the nothing-out line they are read
        // against.
        let decode_rate = decode_rate_of(&batches, Duration::from_secs(2));
        println!("prost decode:            {:>10.0} spans per CPU-second (one thread)", decode_rate);
        let batches = Arc::new(batches);
        let plain = measure(&rt, this, &batches, secs, decode_rate, None, None, &SendOptions::default(), "plaintext").0;
        inline_against_rotel(&rt, this, &batches, secs, decode_rate, plain);
        return;
    }
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "profile") {
        // The stage breakdowns alone: the decode rate (for the ratios), then each service line
        // with its profiled window.
        let decode_rate = decode_rate_of(&batches, Duration::from_secs(2));
        println!("prost decode:            {:>10.0} spans per CPU-second (one thread)", decode_rate);
        let batches = Arc::new(batches);
        if let Some(base) = &baseline {
            measure(&rt, base, &batches, secs, decode_rate, None, None, &SendOptions::default(), "baseline-plaintext");
        }
        measure(&rt, this, &batches, secs, decode_rate, None, None, &SendOptions::default(), "plaintext");
        if let Some(agent) = rotel_agent() {
            for (bin, label) in baseline.iter().map(|b| (b.as_str(), "baseline-inline")).chain([(this, "inline")]) {
                let sink = start_rotel(&agent);
                measure(&rt, bin, &batches, secs, decode_rate, None, Some(sink.grpc), &SendOptions::default(), label);
            }
        }
        mixed(&rt, this, baseline.as_deref(), secs);
        return;
    }

    // With MCP_HEALTH_BENCH_ONLY=walk: the decode and the walk alone, in turns (quick A/B of
    // the walk: rebuild, run again, compare the ratio).
    if std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "walk") {
        let mixed_batches: Vec<EncodedBatch> = (0..64).map(|b| loadgen::encode(&loadgen::build_mixed_request(b, 105))).collect();
        for round in 1..=3 {
            let rate = |f: &dyn Fn(&EncodedBatch) -> u64| {
                let (t, c0) = (Instant::now(), thread_cpu_secs());
                let mut n = 0u64;
                while t.elapsed() < Duration::from_secs(2) {
                    n += batches.iter().map(f).sum::<u64>();
                }
                n as f64 / (thread_cpu_secs() - c0).max(1e-9)
            };
            let decode = rate(&|b| {
                std::hint::black_box(ExportTraceServiceRequest::decode(b.bytes.clone()).expect("decode"));
                b.spans
            });
            let walk = rate(&|b| mcp_health::normalize::wire::walk(&b.bytes, "0000000000000000").expect("walk").0.spans);
            let mixed = mixed_batches.iter().map(|b| {
                let (t, c0) = (Instant::now(), thread_cpu_secs());
                let mut n = 0u64;
                while t.elapsed() < Duration::from_millis(30) {
                    n += mcp_health::normalize::wire::walk(&b.bytes, "0000000000000000").expect("walk").0.spans;
                }
                (n, thread_cpu_secs() - c0)
            });
            let (n, cpu) = mixed.fold((0, 0.0), |(n, c), (m, d)| (n + m, c + d));
            println!(
                "round {round}: prost decode {decode:>9.0} spans/s, walk + normalize {walk:>9.0} spans/s = {:.2}x; mixed traffic's walk {:>9.0} spans/s",
                walk / decode,
                n as f64 / cpu.max(1e-9)
            );
        }
        return;
    }

    // 1. Raw prost decode rate of the same batches, one core.
    let (t, c0) = (Instant::now(), thread_cpu_secs());
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        for b in &batches {
            let r = ExportTraceServiceRequest::decode(b.bytes.clone()).expect("decode");
            std::hint::black_box(&r);
            n += b.spans;
        }
    }
    let decode_rate = n as f64 / (thread_cpu_secs() - c0).max(1e-9);
    println!("prost decode:            {:>10.0} spans per CPU-second (one thread)", decode_rate);

    // 2. Decode + normalize, one core: the receiver's per-span work.
    let (t, c0) = (Instant::now(), thread_cpu_secs());
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        for b in &batches {
            let r = ExportTraceServiceRequest::decode(b.bytes.clone()).expect("decode");
            let nb = mcp_health::normalize::normalize_request(&r);
            n += nb.spans;
        }
    }
    println!("decode + normalize:      {:>10.0} spans per CPU-second (one thread)", n as f64 / (thread_cpu_secs() - c0).max(1e-9));

    // 2b. The evidence walk over the wire bytes (what the receivers do instead of 2), one core.
    let (t, c0) = (Instant::now(), thread_cpu_secs());
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        for b in &batches {
            let (nb, _) = mcp_health::normalize::wire::walk(&b.bytes, "0000000000000000").expect("walk");
            n += nb.spans;
        }
    }
    let walk_rate = n as f64 / (thread_cpu_secs() - c0).max(1e-9);
    println!(
        "wire walk + normalize:   {:>10.0} spans per CPU-second (one thread; {:.2}x prost decode)",
        walk_rate,
        walk_rate / decode_rate
    );

    // 3. The service end to end: gRPC in, normalize, correlate, classify, metrics.
    let batches = Arc::new(batches);
    let plain = interleaved(this, baseline.as_deref(), "plaintext", |bin, label| {
        measure(&rt, bin, &batches, secs, decode_rate, None, None, &SendOptions::default(), label).0
    });
    // What zstd and TLS cost per span, same build, same batches, same run.
    let zstd = measure(&rt, this, &batches, secs, decode_rate, None, None, &SendOptions { zstd: true, ..Default::default() }, "zstd").0;
    let (ca, cert, key) = test_pki();
    let tls = measure(
        &rt,
        this,
        &batches,
        secs,
        decode_rate,
        Some((&cert, &key)),
        None,
        &SendOptions { tls_ca_pem: Some(ca), ..Default::default() },
        "tls",
    )
    .0;
    let us = |rate: f64| 1e6 / rate.max(1e-9);
    println!("transport cost (same run): {:>12} {:>12} {:>12}", "plaintext", "zstd", "TLS");
    println!("  spans/s per core:        {:>12.0} {:>12.0} {:>12.0}", plain, zstd, tls);
    println!("  service µs/span:         {:>12.3} {:>12.3} {:>12.3}", us(plain), us(zstd), us(tls));
    println!("  added µs/span:           {:>12} {:>12.3} {:>12.3}", "-", us(zstd) - us(plain), us(tls) - us(plain));

    inline_against_rotel(&rt, this, &batches, secs, decode_rate, plain);

    // Traffic as a shared pipeline carries it (mostly spans that are not MCP).
    mixed(&rt, this, baseline.as_deref(), secs);

    // What holding a large request costs: pass-through to an upstream that accepts connections
    // and never answers, so every request taken stays in the exporter's queue.
    held_request_memory(&rt, this);

    // 4. Bytes per in-flight chain: hold chains (long decision_wait) and measure.
    held_chain_memory(&rt, this, &batches, "");

    // 5. Three instances on one Redis beside one instance without a store.
    cluster(&rt, this, calls_per_batch, secs);
}

/// prost's decode rate of `batches`, one core, over `window`.
fn decode_rate_of(batches: &[EncodedBatch], window: Duration) -> f64 {
    let (t, c0) = (Instant::now(), thread_cpu_secs());
    let mut n = 0u64;
    while t.elapsed() < window {
        for b in batches {
            std::hint::black_box(ExportTraceServiceRequest::decode(b.bytes.clone()).expect("decode"));
            n += b.spans;
        }
    }
    n as f64 / (thread_cpu_secs() - c0).max(1e-9)
}

/// The inline deployment (pass-through and health spans to a real OTLP receiver, a rotel
/// blackhole) against rotel taking the same load twice, same run: dropping it (its blackhole
/// exporter) and passing it on over OTLP/gRPC to the same kind of receiver, as inline does. Only
/// the second does the same work: on loopback the sender's CPU also runs the receiving socket's
/// TCP work, which a blackhole never starts.
fn inline_against_rotel(
    rt: &tokio::runtime::Runtime,
    this: &str,
    batches: &Arc<Vec<EncodedBatch>>,
    secs: u64,
    decode_rate: f64,
    plain: f64,
) {
    let Some(agent) = rotel_agent() else {
        println!("inline and rotel runs skipped: .venv-rotel is missing (scripts/install-test-deps makes it)");
        return;
    };
    let sink = start_rotel(&agent);
    let (inline, _) = measure(rt, this, batches, secs, decode_rate, None, Some(sink.grpc), &SendOptions::default(), "inline");
    drop(sink);
    let rotel = start_rotel(&agent);
    let blackhole = measure_process(rt, rotel.child.id(), rotel.grpc, batches, secs, "rotel (blackhole exporter)");
    drop(rotel);
    let sink = start_rotel(&agent);
    let rotel = start_rotel_to(&agent, Some(sink.grpc));
    let forwarding = measure_process(rt, rotel.child.id(), rotel.grpc, batches, secs, "rotel (OTLP/gRPC exporter to a blackhole)");
    drop((rotel, sink));
    println!("inline vs rotel (same run): {:>12} {:>12} {:>12} {:>12}", "nothing out", "inline", "rotel drops", "rotel passes");
    println!("  spans/s per core:        {:>12.0} {:>12.0} {:>12.0} {:>12.0}", plain, inline, blackhole, forwarding);
    let pct = |r: f64| 100.0 * r / decode_rate;
    println!(
        "  vs decode rate:          {:>11.1}% {:>11.1}% {:>11.1}% {:>11.1}%",
        pct(plain),
        pct(inline),
        pct(blackhole),
        pct(forwarding)
    );
    println!("  mcp-health / rotel drops: {:>11.2} {:>12.2}", plain / blackhole.max(1e-9), inline / blackhole.max(1e-9));
    println!("  mcp-health / rotel passes:{:>11.2} {:>12.2}", plain / forwarding.max(1e-9), inline / forwarding.max(1e-9));
}

/// Traffic as a shared pipeline carries it (`loadgen::build_mixed_request`: ~95 % ordinary HTTP
/// and database spans, 5 % MCP, the MCP server's HTTP spans on `/mcp`): prost's decode rate and
/// the wire walk's, one core, then the service (nothing out) in spans per CPU-second, the
/// baseline first when given. What the fan-out layout costs without a filter in front.
fn mixed(rt: &tokio::runtime::Runtime, this: &str, baseline: Option<&str>, secs: u64) {
    let batches: Vec<EncodedBatch> = (0..64).map(|b| loadgen::encode(&loadgen::build_mixed_request(b, 105))).collect();
    let spans = batches[0].spans;
    println!("mixed traffic: {spans} spans a request, {:.0} bytes/span encoded, 5 % MCP", batches[0].bytes.len() as f64 / spans as f64);
    let decode_rate = decode_rate_of(&batches, Duration::from_secs(2));
    let (t, c0) = (Instant::now(), thread_cpu_secs());
    let mut n = 0u64;
    while t.elapsed() < Duration::from_secs(2) {
        for b in &batches {
            std::hint::black_box(mcp_health::normalize::wire::walk(&b.bytes, "0000000000000000").expect("walk"));
            n += b.spans;
        }
    }
    let walk_rate = n as f64 / (thread_cpu_secs() - c0).max(1e-9);
    println!("  prost decode:          {:>10.0} spans per CPU-second (one thread)", decode_rate);
    println!("  wire walk + normalize: {:>10.0} spans per CPU-second (one thread)", walk_rate);
    let batches = Arc::new(batches);
    let this_rate = interleaved(this, baseline, "mixed", |bin, label| {
        measure(rt, bin, &batches, secs, decode_rate, None, None, &SendOptions::default(), label).0
    });
    println!("mixed traffic: {this_rate:.0} spans per CPU-second, {:.2}x the walk alone", this_rate / walk_rate);
}

/// One service line of this build beside the baseline's, when one is given: the two alternate
/// for `MCP_HEALTH_BENCH_ROUNDS` rounds (3 by default), baseline first in each, so that the load
/// of the machine's neighbours falls on both alike — sequential windows of one binary differ by
/// up to 1.5× on a shared machine, more than most changes. Prints each round's pair and ratio
/// and the medians; returns this build's median (its only figure without a baseline).
fn interleaved(this: &str, baseline: Option<&str>, label: &str, mut run: impl FnMut(&str, &str) -> f64) -> f64 {
    let Some(base) = baseline else { return run(this, label) };
    let rounds: usize = std::env::var("MCP_HEALTH_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let mut pairs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let b = run(base, &format!("baseline-{label}"));
        let t = run(this, label);
        pairs.push((b, t));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("{label}, side by side ({rounds} rounds interleaved): {:>14} {:>14} {:>8}", "baseline", "this build", "ratio");
    for (i, (b, t)) in pairs.iter().enumerate() {
        println!("  round {:<2} spans/s per core:   {b:>14.0} {t:>14.0} {:>8.2}", i + 1, t / b.max(1e-9));
    }
    let (b, t) = (median(pairs.iter().map(|p| p.0).collect()), median(pairs.iter().map(|p| p.1).collect()));
    let r = median(pairs.iter().map(|p| p.1 / p.0.max(1e-9)).collect());
    println!("  median                      {b:>14.0} {t:>14.0} {r:>8.2}");
    t
}

/// Three instances of `bin` sharing one Redis (`storage: {kind: redis}`), each loaded by its own
/// sender with traces of its own (whole traces per instance, as the collector's
/// `load_balancing` exporter routes by trace id), beside one instance without a store under the
/// same load, in one run: accepted spans per CPU-second of each process and in total (the
/// three instances' CPU together; Redis's own CPU said apart). On these two cores the three
/// instances, Redis and the senders share the machine, so per-CPU-second figures are the
/// comparison, not spans/s.
fn cluster(rt: &tokio::runtime::Runtime, bin: &str, calls_per_batch: u32, secs: u64) {
    if !redis_server::available("throughput bench: three instances on one redis") {
        return;
    }
    let batches_for = |k: u32| -> Arc<Vec<EncodedBatch>> {
        Arc::new((0..64).map(|b| loadgen::encode(&loadgen::build_request(1000 * (k + 1) + b, calls_per_batch))).collect())
    };
    // With MCP_HEALTH_BENCH_RATE (spans/s per instance), each sender is paced: the lines then
    // compare CPU per span at the same intake. Flat out (the default), an instance that takes in
    // more also holds more, and meets its memory limit sooner.
    let rate: Option<f64> = std::env::var("MCP_HEALTH_BENCH_RATE").ok().and_then(|v| v.parse().ok());
    if let Some(r) = rate {
        println!("each sender paced at {r:.0} spans/s");
    }
    let load = |targets: &[(u16, Arc<Vec<EncodedBatch>>)], secs: u64| -> Vec<loadgen::LoadReport> {
        rt.block_on(async {
            let runs: Vec<_> = targets
                .iter()
                .map(|(port, b)| {
                    let (at, b) = (format!("127.0.0.1:{port}"), b.clone());
                    tokio::spawn(async move {
                        let opts = SendOptions { rate, ..Default::default() };
                        loadgen::run_with(&at, b, Duration::from_secs(secs), 2, &opts).await.expect("load")
                    })
                })
                .collect();
            let mut out = Vec::new();
            for r in runs {
                out.push(r.await.expect("sender"));
            }
            out
        })
    };
    let measure_all = |label: &str, svcs: &[Service], pids_extra: Option<u32>| {
        let targets: Vec<(u16, Arc<Vec<EncodedBatch>>)> = svcs.iter().enumerate().map(|(k, s)| (s.grpc, batches_for(k as u32))).collect();
        let _ = load(&targets, 2);
        let split0: Vec<(f64, f64, u64)> = svcs.iter().map(|s| stages::proc_user_system_faults(s.child.id())).collect();
        let switches0: Vec<(u64, u64)> = svcs.iter().map(|s| ctxt_switches(s.child.id())).collect();
        let extra0 = pids_extra.map(proc_cpu_secs).unwrap_or(0.0);
        let reps = load(&targets, secs);
        let split: Vec<(f64, f64, u64)> = svcs.iter().map(|s| stages::proc_user_system_faults(s.child.id())).collect();
        let cpu: Vec<f64> = split.iter().zip(&split0).map(|((u1, s1, _), (u0, s0, _))| (u1 + s1) - (u0 + s0)).collect();
        let switches: Vec<(u64, u64)> = svcs.iter().map(|s| ctxt_switches(s.child.id())).collect();
        let extra = pids_extra.map(proc_cpu_secs).unwrap_or(0.0) - extra0;
        println!("-- {label}");
        for (k, (r, c)) in reps.iter().zip(&cpu).enumerate() {
            println!(
                "  instance {k}: {:>10.0} spans/s accepted, {:>6.2} CPU-s, {:>10.0} spans per CPU-second ({} refused)",
                r.spans_accepted as f64 / r.elapsed.as_secs_f64(),
                c,
                r.spans_accepted as f64 / c.max(1e-9),
                r.requests_refused
            );
            // Where an instance's CPU went beside its spans: the kernel's share is mostly page
            // faults (freed pages return to the OS near the memory limit and are faulted in
            // again), and what it held as the load ended.
            let ((u0, s0, f0), (u1, s1, f1)) = (split0[k], split[k]);
            let ((v0, i0), (v1, i1)) = (switches0[k], switches[k]);
            let per_million = |n: u64| n as f64 * 1e6 / (r.spans_accepted.max(1) as f64);
            let text = scrape(svcs[k].prom);
            println!(
                "              user {:.2} s, system {:.2} s; per million spans {:.0} page faults, {:.0} context switches ({:.0} involuntary); \
                 at the end {:.0} chains in flight, RSS {:.0} MiB",
                u1 - u0,
                s1 - s0,
                per_million(f1.saturating_sub(f0)),
                per_million(v1.saturating_sub(v0) + i1.saturating_sub(i0)),
                per_million(i1.saturating_sub(i0)),
                metric(&text, "mcp_health_chains_in_flight"),
                metric(&text, "mcp_health_process_memory_rss_bytes") / f64::from(1 << 20),
            );
        }
        let spans: u64 = reps.iter().map(|r| r.spans_accepted).sum();
        let total_cpu: f64 = cpu.iter().sum();
        let per = spans as f64 / total_cpu.max(1e-9);
        print!(
            "  total:      {:>10.0} spans/s accepted, {:>6.2} CPU-s, {:>10.0} spans per CPU-second",
            spans as f64 / secs as f64,
            total_cpu,
            per
        );
        match pids_extra {
            Some(_) => println!(" ({:.0} counting Redis's {:.2} CPU-s)", spans as f64 / (total_cpu + extra).max(1e-9), extra),
            None => println!(),
        }
        per
    };
    let one = [start_binary(bin, "1s", "5s", None, None)];
    let alone = measure_all("one instance, no store", &one, None);
    drop(one);
    let r = redis_server::RedisServer::start();
    let storage = format!("storage:\n  kind: redis\n  endpoint: {}\n", r.url());
    let one_shared = [start_binary_with(bin, "1s", "5s", None, None, "", &storage)];
    let one_on_redis = measure_all("one instance, on redis", &one_shared, r.pid());
    if profiling() {
        profile_window(rt, &one_shared[0], &batches_for(0), secs, &SendOptions::default(), "on-redis");
    }
    drop(one_shared);
    let three: Vec<Service> = (0..3).map(|_| start_binary_with(bin, "1s", "5s", None, None, "", &storage)).collect();
    let shared = measure_all("three instances, one redis", &three, r.pid());
    println!("cluster (same run):       {:>16} {:>16} {:>16}", "one, no store", "one on redis", "three on redis");
    println!(
        "  spans per CPU-second:   {:>16.0} {:>16.0} {:>16.0}  (/ one without a store: {:.2}, {:.2})",
        alone,
        one_on_redis,
        shared,
        one_on_redis / alone.max(1e-9),
        shared / alone.max(1e-9)
    );
}

/// Bytes per in-flight chain of the service `bin`: chains held (long decision_wait), measured by
/// the correlator and by RSS growth.
fn held_chain_memory(rt: &tokio::runtime::Runtime, bin: &str, batches: &Arc<Vec<EncodedBatch>>, label: &str) {
    let svc = start_binary(bin, "10m", "20m", None, None);
    let pid = svc.child.id();
    let rss0 = proc_status_kib(pid, "VmRSS:");
    let held = rt.block_on(loadgen::run(&format!("127.0.0.1:{}", svc.grpc), batches.clone(), Duration::from_secs(3), 2)).expect("load");
    std::thread::sleep(Duration::from_secs(2));
    let text = scrape(svc.prom);
    let chains = metric(&text, "mcp_health_chains_in_flight");
    let ev_bytes = metric(&text, "mcp_health_evidence_bytes");
    let rss1 = proc_status_kib(pid, "VmRSS:");
    println!("{label}held chains:             {:>10.0} ({} spans)", chains, held.spans_accepted);
    println!("{label}evidence bytes/chain:    {:>10.0} (correlator's own count)", ev_bytes / chains.max(1.0));
    println!(
        "{label}RSS growth/chain:        {:>10.0} bytes (includes hash table and allocator overhead)",
        (rss1.saturating_sub(rss0) as f64 * 1024.0) / chains.max(1.0)
    );
}

/// RSS growth per byte of request held in the pass-through queue (wire bytes).
fn held_request_memory(rt: &tokio::runtime::Runtime, bin: &str) {
    let stall = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = stall.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in stall.incoming().flatten() {
            held.push(c);
        }
    });
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let queue = env("MCP_HEALTH_BENCH_HELD_QUEUE", 8);
    let consumers = env("MCP_HEALTH_BENCH_HELD_CONSUMERS", 10);
    // Health spans off: their requests would wait for the same upstream and be counted too.
    let svc = start_binary_with(
        bin,
        "1s",
        "5s",
        None,
        Some(port),
        &format!("    health_spans: false\n    sending_queue:\n      queue_size: {queue}\n      num_consumers: {consumers}\n"),
        "",
    );
    let big = Arc::new(vec![loadgen::encode(&loadgen::build_request(7, 3000))]);
    let size = big[0].bytes.len();
    let pid = svc.child.id();
    let rss0 = proc_status_kib(pid, "VmRSS:");
    let rep = rt.block_on(loadgen::run_with(&format!("127.0.0.1:{}", svc.grpc), big, Duration::from_secs(3), 1, &SendOptions::default()));
    // The chains of the requests taken are decided after decision_wait (1 s) and let go: what
    // is left is the requests waiting for the upstream.
    std::thread::sleep(Duration::from_secs(4));
    let rss1 = proc_status_kib(pid, "VmRSS:");
    let ok = rep.map(|r| r.requests_ok).unwrap_or(0);
    let grew = rss1.saturating_sub(rss0) as f64 * 1024.0;
    println!(
        "held requests:           {:>10} of {:.2} MiB each (queue of {queue}; the rest refused); RSS grew {:.1} MiB = {:.2}x the bytes held",
        ok,
        size as f64 / (1 << 20) as f64,
        grew / (1 << 20) as f64,
        grew / (ok.max(1) as f64 * size as f64)
    );
}

/// Load any OTLP/gRPC receiver process on `port`; print and return accepted spans per CPU-second.
fn measure_process(rt: &tokio::runtime::Runtime, pid: u32, port: u16, batches: &Arc<Vec<EncodedBatch>>, secs: u64, what: &str) -> f64 {
    println!("-- {what}");
    let at = format!("127.0.0.1:{port}");
    let _ = rt.block_on(loadgen::run_with(&at, batches.clone(), Duration::from_secs(2), 2, &SendOptions::default()));
    let cpu0 = proc_cpu_secs(pid);
    let rep = rt.block_on(loadgen::run_with(&at, batches.clone(), Duration::from_secs(secs), 2, &SendOptions::default())).expect("load");
    let cpu = proc_cpu_secs(pid) - cpu0;
    let per_core = rep.spans_accepted as f64 / cpu.max(1e-9);
    println!(
        "accepted:                {:>10.0} spans/s ({} requests ok, {} refused)",
        rep.spans_accepted as f64 / rep.elapsed.as_secs_f64(),
        rep.requests_ok,
        rep.requests_refused
    );
    println!("spans/s per core:        {:>10.0} (accepted spans per CPU-second of that process)", per_core);
    println!("peak RSS:                {:>10} KiB", proc_status_kib(pid, "VmHWM:"));
    per_core
}

/// Run the service binary `bin` under load; print its figures; return accepted spans per
/// CPU-second and the service (still running, for more figures).
#[allow(clippy::too_many_arguments)]
fn measure(
    rt: &tokio::runtime::Runtime,
    bin: &str,
    batches: &Arc<Vec<EncodedBatch>>,
    secs: u64,
    decode_rate: f64,
    tls: Option<(&str, &str)>,
    upstream: Option<u16>,
    opts: &SendOptions,
    label: &str,
) -> (f64, Service) {
    println!("-- service: {bin} (tls: {}, zstd: {}, pass-through and health spans out: {})", tls.is_some(), opts.zstd, upstream.is_some());
    let svc = start_binary(bin, "1s", "5s", tls, upstream);
    let pid = svc.child.id();
    let at = format!("127.0.0.1:{}", svc.grpc);
    // Warm up, let the warm-up's chains be decided, then measure.
    let _ = rt.block_on(loadgen::run_with(&at, batches.clone(), Duration::from_secs(2), 2, opts));
    drained(svc.prom);
    // What the warm-up exported, taken off the figures below (they are the window's alone).
    let exported_so_far = |text: &str| {
        (
            prom_sum(text, "mcp_health_exporter_sent_spans_total", "signal=\"passthrough\""),
            prom_sum(text, "mcp_health_exporter_sent_spans_total", "signal=\"health_spans\""),
            prom_sum(text, "mcp_health_exporter_send_failed_spans_total", ""),
        )
    };
    let before = if upstream.is_some() { exported_so_far(&scrape(svc.prom)) } else { (0.0, 0.0, 0.0) };
    let cpu0 = proc_cpu_secs(pid);
    let rep = rt.block_on(loadgen::run_with(&at, batches.clone(), Duration::from_secs(secs), 2, opts)).expect("load");
    let cpu_loaded = proc_cpu_secs(pid) - cpu0;
    // The window's CPU counts every decision of its chains: what the engine had not decided when
    // the load stopped (a backlog grows where it cannot keep up) is decided after it.
    let behind = drained(svc.prom);
    let cpu = proc_cpu_secs(pid) - cpu0;
    std::thread::sleep(Duration::from_secs(1));
    let text = scrape(svc.prom);
    let rate = rep.spans_accepted as f64 / rep.elapsed.as_secs_f64();
    println!(
        "service accepted:        {:>10.0} spans/s over {:.1}s ({} requests ok, {} refused)",
        rate,
        rep.elapsed.as_secs_f64(),
        rep.requests_ok,
        rep.requests_refused
    );
    println!(
        "service CPU:             {:>10.2} µs/span ({:.2} CPU-s for {} spans)",
        cpu * 1e6 / rep.spans_accepted.max(1) as f64,
        cpu,
        rep.spans_accepted
    );
    println!(
        "  of which after the load: {:>9.2} CPU-s ({:.1} s until every chain was decided; the window's CPU alone gives {:.0} spans per CPU-second)",
        cpu - cpu_loaded,
        behind.as_secs_f64(),
        rep.spans_accepted as f64 / cpu_loaded.max(1e-9)
    );
    let per_core = rep.spans_accepted as f64 / cpu.max(1e-9);
    println!("spans/s per core:        {:>10.0} (accepted spans per service CPU-second, every decision counted)", per_core);
    println!("  vs decode rate:        {:>10.1} %", 100.0 * per_core / decode_rate);
    println!("verdicts emitted:        {:>10.0}", metric(&text, "mcp_health_calls_total"));
    println!("service peak RSS:        {:>10} KiB", proc_status_kib(pid, "VmHWM:"));
    if upstream.is_some() {
        let after = exported_so_far(&text);
        println!(
            "exported:                {:>10.0} pass-through spans, {:.0} health spans, {:.0} dropped (in the window, and the 3 s after it)",
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2
        );
    }
    if profiling() {
        profile_window(rt, &svc, batches, secs, opts, label);
    }
    (per_core, svc)
}

/// `MCP_HEALTH_BENCH_PROFILE=1` (or `MCP_HEALTH_BENCH_ONLY=profile`): each service line is
/// followed by a window under `perf record`.
fn profiling() -> bool {
    std::env::var("MCP_HEALTH_BENCH_PROFILE").is_ok_and(|v| v != "0")
        || std::env::var("MCP_HEALTH_BENCH_ONLY").is_ok_and(|v| v == "profile")
}

/// One more window of the same load on `svc`, under `perf record`: where its CPU goes by stage
/// (see `support/stages.rs`), in µs per span. The measured window above is not profiled (perf's
/// own cost would be in it); this one's figures are shares of its own CPU time.
fn profile_window(
    rt: &tokio::runtime::Runtime,
    svc: &Service,
    batches: &Arc<Vec<EncodedBatch>>,
    secs: u64,
    opts: &SendOptions,
    label: &str,
) {
    if !stages::perf_available() {
        println!("stage breakdown skipped: perf is not installed");
        return;
    }
    let dir = std::env::var("MCP_HEALTH_BENCH_PROFILE_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let _ = std::fs::create_dir_all(&dir);
    let Some(rec) = stages::record(svc.child.id(), &dir) else {
        println!("stage breakdown skipped: perf record did not start");
        return;
    };
    let at = format!("127.0.0.1:{}", svc.grpc);
    let rep = rt.block_on(loadgen::run_with(&at, batches.clone(), Duration::from_secs(secs.min(5)), 2, opts));
    let spans = rep.map(|r| r.spans_accepted).unwrap_or(0);
    match rec.finish() {
        Some(b) => {
            let named = dir.join(format!("{label}.folded"));
            let _ = std::fs::rename(&b.folded, &named);
            let b = stages::Breakdown { folded: named, ..b };
            b.print(label, spans);
        }
        None => println!("stage breakdown skipped: no samples (perf_event_paranoid, or perf could not read the process)"),
    }
}

/// The sum of a metric's series whose labels contain `filter`.
fn prom_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
