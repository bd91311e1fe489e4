//! Memory bounded whatever the requests hold, by default too.
//!
//! Issue 10: memory bounded whatever the requests hold. With `processors.memory_limiter` at
//! 256 MiB and the backend down (every accepted request stays queued for pass-through), bursts of
//! 64 concurrent 4 MiB requests of realistic MCP spans drove the resident set to 406 MB: the
//! resident set was only sampled, and between two samples the requests were read, decoded and
//! queued. Now memory is reserved before each step that allocates; this test holds the bound.
//!
//! Issue 35: the embedded default (health spans on, the verdict log) under the same kind of flood
//! peaked at 565–764 MiB against its 512 MiB limit, and 331 MiB under a configured 256 MiB: tens
//! of thousands of calls fell due in one engine step, and their verdicts, log lines and health
//! span encodings were held at once before any sample of the resident set could count them. The
//! engine now decides a bounded number of calls per step; both floods hold the same bound as the
//! pass-through one.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;

const LIMIT_MIB: u64 = 256;

/// What the limit does not cover, and why 64 MiB, for every flood here: the limiter counts what
/// requests reserve and what the engine's evidence holds against the soft limit (205 MiB at
/// 256 MiB, 410 MiB at 512 MiB), on top of what the resident set showed at start (the binary,
/// the runtime and its tables) and corrects its count from the resident set every
/// `check_interval`. What it cannot count before the next sample is the engine's own structures
/// around the evidence of chains admitted since (map entries, join indexes; not measured apart:
/// the resident set settles ~1.5× the wire size per accepted request above what is reserved and
/// counted as evidence), what one engine step decides (its calls, verdicts, log lines and health
/// span encodings; bounded by the calls a step decides, see `DECIDE_PER_STEP` in
/// `src/service/mod.rs`), the bytes hyper has taken off the sockets before the receiver reads them
/// (HTTP/2 flow-control windows) and the allocator's slack between freeing and returning pages.
/// The spike allowance (a fifth of the limit) is the collector's room for exactly that; 64 MiB
/// over the hard limit is what a pod sized to its limit can take. Measured on two shared cores
/// (debug build), four runs each: pass-through at 256 MiB 239–279 MiB; the embedded default's
/// flood 431–473 MiB at 512 MiB and 223–252 MiB at 256 MiB (before steps were bounded: 456–670
/// and 256–384 MiB).
const OVERHEAD_MIB: u64 = 64;

/// The process's resident set, from `/proc/<pid>/status` (`VmRSS`, in kB).
fn vm_rss(pid: u32) -> Option<u64> {
    vm(pid, "VmRSS:")
}

/// A `/proc/<pid>/status` figure in bytes: `VmRSS:` now, `VmHWM:` the peak since start (every
/// page ever resident at once, not a sample that may miss a spike).
fn vm(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rss_stays_under_the_memory_limit_with_64_requests_of_4_mib_and_the_backend_down() {
    let dead = dead_port();
    let svc = Service::start(Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        passthrough: true,
        // Only what is passed through is queued: health spans and own metrics would only add noise.
        health_spans: false,
        otlp_metrics: false,
        memory_limit_mib: Some(LIMIT_MIB),
        // The collector's default: the bound must not depend on sampling often (between two
        // samples of the resident set, every request read and decoded is the reservations' to bound).
        memory_check_interval: "1s",
        // Chains are held for a long decision wait, so their evidence stays in memory too.
        decision_wait: "30s",
        max_wait: "60s",
        ..Cfg::default()
    })
    .await;

    // Realistic MCP spans (client, server and verifier span per call), just under 4 MiB a request.
    let template = mcp_health::testing::loadgen::encode(&mcp_health::testing::loadgen::build_request(1, 3640));
    let wire = template.bytes.len();
    assert!((3_900_000..=4 << 20).contains(&wire), "request of {wire} bytes");
    let spans_per_request = template.spans;

    // Sample the resident set the whole time, from outside the process.
    let pid = svc.pid();
    let idle_rss = vm_rss(pid).expect("VmRSS");
    let peak = Arc::new(AtomicU64::new(idle_rss));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = vm_rss(pid) {
                    peak.fetch_max(r, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    // 64 senders, each with its own 4 MiB request on its own connection, all at once; a refused
    // request is retried as an OTLP exporter does (here: up to 5 attempts, 100 ms apart).
    let mut sends = Vec::new();
    for sender in 0..64u32 {
        let body = mcp_health::testing::loadgen::stamp(&template, sender + 1);
        let addr = svc.grpc_addr();
        sends.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0u64, 0u64);
            for _attempt in 0..5 {
                match grpc_export_raw(addr, body.clone()).await {
                    Ok(_) => {
                        ok += 1;
                        break;
                    }
                    Err(st) => {
                        assert!(is_busy(&st), "a refusal must be retryable: {st:?}");
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            (ok, refused)
        }));
    }
    let (mut accepted, mut refused) = (0u64, 0u64);
    for s in sends {
        let (ok, no) = s.await.expect("send task");
        accepted += ok;
        refused += no;
    }
    assert!(accepted > 0, "some requests fit under the limit");
    assert!(refused > 0, "64 requests of 4 MiB do not all fit in 256 MiB with the backend down");

    // Nothing unaccounted: every span the service received was accepted or refused and counted.
    // Every refused request counts 1 in `requests.refused`; one refused after it was decoded
    // also counts its spans in `spans.received` and `spans.refused` (one refused before it was
    // read has no spans anyone saw).
    let text =
        svc.wait_metric("mcp_health_spans_received_total", Duration::from_secs(30), |v| v >= (accepted * spans_per_request) as f64).await;
    let received = prom_sum(&text, "mcp_health_spans_received_total").unwrap_or(0.0) as u64;
    let refused_counted = prom_sum(&text, "mcp_health_spans_refused_total").unwrap_or(0.0) as u64;
    let requests_counted = prom_sum(&text, "mcp_health_requests_refused_total").unwrap_or(0.0) as u64;
    let memory_refusals: Vec<&str> =
        text.lines().filter(|l| l.starts_with("mcp_health_requests_refused_total") && !l.contains("reason=\"memory_limit\"")).collect();
    assert!(memory_refusals.is_empty(), "every refusal is the memory limit's: {memory_refusals:?}");
    let accepted_spans = accepted * spans_per_request;
    assert!(received >= accepted_spans, "received {received} < accepted {accepted_spans}");
    assert_eq!((received - accepted_spans) % spans_per_request, 0, "whole requests only: received {received}");
    let refused_decoded = (received - accepted_spans) / spans_per_request;
    assert!(refused_decoded <= refused, "{refused_decoded} refused after decoding, {refused} refused in all");
    let refused_unread = refused - refused_decoded;
    assert_eq!(
        (refused_counted, requests_counted),
        (refused_decoded * spans_per_request, refused),
        "refused counted: {refused_decoded} decoded requests of {spans_per_request} spans, {refused_unread} unread requests\n{text}"
    );

    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    // What the accepted requests hold once everything refused is freed: queued for pass-through
    // (the backend is down) and their evidence in the engine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = vm_rss(pid).unwrap_or(0);
    eprintln!(
        "settled RSS {} MiB: {:.2}x wire per accepted request held (resident set over idle / accepted wire bytes)",
        settled >> 20,
        settled.saturating_sub(idle_rss) as f64 / (accepted as f64 * wire as f64)
    );
    let reserved = prom_sum(&text, "mcp_health_memory_reserved_bytes").unwrap_or(0.0);
    let evidence = prom_sum(&text, "mcp_health_memory_evidence_bytes").unwrap_or(0.0);
    eprintln!(
        "limit {LIMIT_MIB} MiB: idle RSS {} MiB, peak RSS {} MiB; {accepted} accepted, {refused} refused ({refused_unread} unread) attempts \
         with 64 requests of {wire} B; reserved {:.1} MiB (queued: {:.2}x wire per accepted request), evidence {:.1} MiB",
        idle_rss >> 20,
        peak >> 20,
        reserved / (1u64 << 20) as f64,
        reserved / (accepted as f64 * wire as f64),
        evidence / (1u64 << 20) as f64,
    );
    assert!(peak <= (LIMIT_MIB + OVERHEAD_MIB) << 20, "peak RSS {} MiB over the {LIMIT_MIB} MiB limit + {OVERHEAD_MIB} MiB", peak >> 20);
    // Refusing data is not being unhealthy; the accepted requests stay queued (the backend is
    // down), so the service may go on refusing until they are exported or given up on.
    assert_eq!(svc.health_status().await, Some(200));
}

/// The embedded default (no configuration file; only its ports moved with `--set`), stopped
/// when dropped.
struct DefaultService {
    child: std::process::Child,
    ports: Ports,
    dir: tempfile::TempDir,
}

impl DefaultService {
    /// Started and answering its health check. A process that exits before it answers (a port
    /// picked here taken by another test's process before this one bound it) is started again
    /// on new ports, up to three times; one that neither answers nor exits fails the test with
    /// what it logged.
    async fn start(env: &[(&str, String)], extra: &[&str]) -> DefaultService {
        for _ in 0..3 {
            let mut svc = Self::spawn(env, extra);
            let health: std::net::SocketAddr = ([127, 0, 0, 1], svc.ports.health).into();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if http_get(health, "/").await.is_ok_and(|r| r.status == 200) {
                    return svc;
                }
                if svc.child.try_wait().ok().flatten().is_some() {
                    eprintln!("the embedded default exited before it answered; starting it again:\n{}", svc.stderr());
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the embedded default did not answer its health check within 60 s; it logged:\n{}",
                    svc.stderr()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("the embedded default exited before it answered, three times");
    }

    fn spawn(env: &[(&str, String)], extra: &[&str]) -> DefaultService {
        let ports = Ports::pick();
        let dir = tempfile::tempdir().unwrap();
        let mut sets = vec![
            format!("receivers.otlp.protocols.grpc.endpoint=127.0.0.1:{}", ports.grpc),
            format!("receivers.otlp.protocols.http.endpoint=127.0.0.1:{}", ports.http),
            format!("exporters.prometheus.endpoint=127.0.0.1:{}", ports.prometheus),
            format!("extensions.health_check.endpoint=127.0.0.1:{}", ports.health),
        ];
        sets.extend(extra.iter().map(|s| s.to_string()));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health"));
        cmd.arg("serve").env_remove("RUST_LOG").env_remove("OTEL_EXPORTER_OTLP_PROTOCOL");
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let child = cmd
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .expect("spawn mcp-health");
        DefaultService { child, ports, dir }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }
}

impl Drop for DefaultService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after `key=` in a log line.
fn log_field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(&format!("{key}="))? + key.len() + 1..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The memory limiter in force, from the start-up log line: (hard limit, soft limit) in MiB.
fn effective_limit(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr.lines().find(|l| l.contains("memory limiter:"))?;
    let (hard, spike) = (log_field(line, "limit_mib")?, log_field(line, "spike_limit_mib")?);
    Some((hard, hard - spike))
}

/// The flood of the embedded default (its fan-out: health spans for every verdict, the verdict
/// log, the backend down), `extra` set with `--set`: 48 senders of 4 MiB requests, 3 requests
/// each, retried when refused — ~600 MiB on the wire, several times that decoded. Returns the
/// peak resident set (`VmHWM`) against the limit in force, or `None` (skipped) where that limit
/// is a cgroup's far above what the flood can reach.
async fn flood_the_embedded_default(extra: &[&str]) -> Option<()> {
    let dead = dead_port();
    let svc = DefaultService::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{}", dead.port))], extra).await;
    let stderr = svc.stderr();
    let (limit, soft) = effective_limit(&stderr).unwrap_or_else(|| panic!("the effective limit is logged at start\n{stderr}"));
    // A cgroup limit far above 512 MiB cannot be reached here without taking the machine's memory.
    if limit > 1024 {
        println!("SKIPPED: the default memory limit here is {limit} MiB (80% of the cgroup limit); the flood reaches ~1 GiB");
        return None;
    }
    let template = mcp_health::testing::loadgen::encode(&mcp_health::testing::loadgen::build_request(1, 3640));
    let grpc: std::net::SocketAddr = ([127, 0, 0, 1], svc.ports.grpc).into();
    let mut sends = Vec::new();
    for sender in 0..48u32 {
        let template = template.clone();
        sends.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0u64, 0u64);
            for round in 0..3u32 {
                let body = mcp_health::testing::loadgen::stamp(&template, 1 + sender * 3 + round);
                for _attempt in 0..5 {
                    // The bound here is memory, not latency: while a debug build on two shared
                    // cores decodes the requests it took, a refusal of another took up to 38 s
                    // to come back (measured on this machine kind); the client waits for it.
                    match grpc_export_raw_within(grpc, body.clone(), Duration::from_secs(120)).await {
                        Ok(_) => {
                            ok += 1;
                            break;
                        }
                        Err(st) => {
                            assert!(is_busy(&st), "a refusal must be retryable: {st:?}");
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
            (ok, refused)
        }));
    }
    let (mut accepted, mut refused) = (0u64, 0u64);
    for s in sends {
        let (ok, no) = s.await.unwrap_or_else(|e| panic!("send task: {e}\n--- stderr ---\n{}", svc.stderr()));
        accepted += ok;
        refused += no;
    }
    // The verdicts of what was accepted are decided `decision_wait` after it came, a burst of
    // them at once: the peak is read once the engine has decided every chain it took in.
    let prometheus: std::net::SocketAddr = ([127, 0, 0, 1], svc.ports.prometheus).into();
    eventually_async(Duration::from_secs(180), "every chain taken in is decided", || async {
        let text = http_get(prometheus, "/metrics").await.ok()?.text();
        prom_sum(&text, "mcp_health_chains_in_flight").filter(|v| *v == 0.0)
    })
    .await;
    let peak = vm(svc.child.id(), "VmHWM:").expect("VmHWM");
    eprintln!(
        "embedded default{}: limit {limit} MiB (soft {soft} MiB), peak RSS {} MiB; {accepted} accepted, {refused} refused attempts",
        if extra.is_empty() { String::new() } else { format!(" with {}", extra.join(" ")) },
        peak >> 20
    );
    assert!(accepted > 0, "some requests fit under the limit");
    assert!(refused > 0, "144 requests of 4 MiB with the backend down do not all fit in {limit} MiB");
    assert!(
        peak <= (limit + OVERHEAD_MIB) << 20,
        "peak RSS {} MiB over the {limit} MiB limit + {OVERHEAD_MIB} MiB\n--- stderr ---\n{}",
        peak >> 20,
        svc.stderr()
    );
    Some(())
}

/// Without `processors.memory_limiter` (the embedded default) and with the backend down, a
/// flood of 4 MiB requests took the process to 1,972 MB. The default limiter (80 % of a cgroup
/// limit, 512 MiB without one) now holds it: the peak resident set stays under the limit plus
/// [`OVERHEAD_MIB`], and what does not fit is refused retryably.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_default_bounds_memory_with_the_backend_down() {
    flood_the_embedded_default(&[]).await;
}

/// The same flood under a configured limit (`processors.memory_limiter.limit_mib: 256`), health
/// spans on: the limit holds as the default's does, within [`OVERHEAD_MIB`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_configured_limit_of_256_mib_holds_the_flood_with_health_spans_on() {
    flood_the_embedded_default(&["processors.memory_limiter.limit_mib=256"]).await;
}

/// OTLP/JSON expands by its shape, not its size: bodies of many tiny spans took the process to
/// 600 MB under a 256 MiB limit while protobuf stayed under it (JSON reserved 8 times its size; a
/// span written `{}` is 3 bytes of text and a 264-byte struct, one with ids and an enum name ~100
/// bytes and ~570 decoded, and enum names were read through a `serde_json` tree). Now JSON
/// reserves a bound from its text before it is decoded: refused at the limit like protobuf
/// (retryably), or for good (413) when even an idle process could not decode it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_bodies_of_tiny_spans_are_refused_at_the_memory_limit() {
    let dead = dead_port();
    let svc = Service::start(Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        passthrough: true,
        health_spans: false,
        otlp_metrics: false,
        memory_limit_mib: Some(LIMIT_MIB),
        memory_check_interval: "1s",
        decision_wait: "30s",
        max_wait: "60s",
        ..Cfg::default()
    })
    .await;
    let wrap = |spans: Vec<String>| format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#, spans.join(",")).into_bytes();
    // Just under 4 MiB: ~40 k spans with ids, half with enum names.
    let tiny = |sender: u32| -> Vec<u8> {
        let mut spans = Vec::new();
        let mut len = 0;
        for i in 0u32.. {
            let kind = if i % 2 == 0 { "\"SPAN_KIND_CLIENT\"" } else { "3" };
            let s = format!(r#"{{"traceId":"{sender:016x}{i:016x}","spanId":"{i:016x}","name":"t","kind":{kind}}}"#);
            len += s.len() + 1;
            if len > (4 << 20) - 200 {
                break;
            }
            spans.push(s);
        }
        wrap(spans)
    };
    // Empty spans (invalid, rejected after decoding, but decoded first): 256 KiB of text are
    // ~45 MB of structs.
    let empty = |bytes: usize| wrap(vec!["{}".to_string(); bytes / 3]);
    let http = svc.http_addr();
    let post = move |b: Vec<u8>| async move {
        for _attempt in 0..8 {
            let r = http_request(http, "POST", "/v1/traces", &[("Content-Type", "application/json")], &b).await.expect("post");
            match r.status {
                200 => return (1, 0),
                429 | 503 => tokio::time::sleep(Duration::from_millis(100)).await,
                other => panic!("a refusal must be retryable (429/503), got {other}: {}", r.text()),
            }
        }
        (0, 1)
    };
    let mut sends = Vec::new();
    for sender in 0..48u32 {
        let bodies = [empty(256 << 10), tiny(sender)];
        sends.push(tokio::spawn(async move {
            let (mut ok, mut gave_up) = (0u64, 0u64);
            for b in bodies {
                let (o, g) = post(b).await;
                ok += o;
                gave_up += g;
            }
            (ok, gave_up)
        }));
    }
    let (mut accepted, mut gave_up) = (0u64, 0u64);
    for s in sends {
        let (ok, no) = s.await.expect("send task");
        accepted += ok;
        gave_up += no;
    }
    // A body no process under this limit could decode is refused for good, not "retry later".
    let huge = http_request(http, "POST", "/v1/traces", &[("Content-Type", "application/json")], &empty(4 << 20)).await.expect("post");
    assert_eq!(huge.status, 413, "{}", huge.text());
    let peak = vm(svc.pid(), "VmHWM:").expect("VmHWM");
    let text = svc.metrics_text().await;
    let refused = text
        .lines()
        .filter(|l| l.starts_with("mcp_health_requests_refused_total") && l.contains("reason=\"memory_limit\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    eprintln!(
        "JSON of tiny spans: limit {LIMIT_MIB} MiB, peak RSS {} MiB; {accepted} of 96 bodies accepted ({gave_up} given up), {refused} refusals",
        peak >> 20
    );
    assert!(accepted > 0, "some requests fit under the limit");
    assert!(refused > 0.0, "96 bodies decoding to 45-25 MB each do not all fit in {LIMIT_MIB} MiB at once");
    assert!(peak <= (LIMIT_MIB + OVERHEAD_MIB) << 20, "peak RSS {} MiB over the {LIMIT_MIB} MiB limit + {OVERHEAD_MIB} MiB", peak >> 20);
}

/// Issue 35: a request refused before its body is read (the memory limit is reached, or a queue
/// it needs is full) is answered after the body is read and dropped, so a client still sending
/// gets the 503 and its `Retry-After`, not a broken pipe. A flood of 3.4 MB bodies from a Python
/// client (`http.client`, which raises on a write into a closed connection) against a service
/// whose memory limit is already reached: every request gets a status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_http_bodies_are_answered_not_cut_off() {
    // A limit below what the idle process holds: every request is refused before it is read.
    let svc = Service::start(Cfg { exporter: None, memory_limit_mib: Some(16), memory_check_interval: "100ms", ..Cfg::default() }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let port = svc.http_addr().port();
    let script = r#"
import http.client, json, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
body = bytes(3_400_000)
seen = {}
lock = threading.Lock()
def send():
    for _ in range(3):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
            r = c.getresponse()
            r.read()
            what = f"{r.status} retry-after={r.getheader('Retry-After')}"
        except Exception as e:
            what = type(e).__name__
        finally:
            c.close()
        with lock:
            seen[what] = seen.get(what, 0) + 1
threads = [threading.Thread(target=send) for _ in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(seen))
"#;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3").arg("-c").arg(script).arg(port.to_string()).arg("16").output().expect("run python3")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    let seen = seen.as_object().unwrap();
    assert_eq!(seen.values().filter_map(|v| v.as_u64()).sum::<u64>(), 48, "{seen:?}");
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        vec!["503 retry-after=1"],
        "every refusal answered with its status, no broken pipe: {seen:?}"
    );
    svc.terminate(Duration::from_secs(15)).await;
}
