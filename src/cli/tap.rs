//! `mcp-health tap`: the evidence tap (see `crate::tap`).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::service::signals::shutdown_signal;
use crate::service::tasks::Tasks;
use crate::tap::{export, http, stdio, verify};

/// Arguments of `mcp-health tap`.
#[derive(Args, Debug, Default)]
#[command(after_help = "\
Examples:
  mcp-health tap -- npx -y @modelcontextprotocol/server-everything     wrap a stdio server
  mcp-health tap --otlp-endpoint http://127.0.0.1:4317 -- python server.py
  mcp-health tap --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000   in front of an HTTP server
  mcp-health tap --listen 127.0.0.1:8080 --upstream https://mcp.example.com/mcp   a remote server over TLS
  mcp-health tap --record evidence.jsonl -- python server.py      record the evidence to a file (CI)
  mcp-health tap --listen 127.0.0.1:0 --upstream http://127.0.0.1:8000 --record evidence.jsonl -- npm test
      run a test command against the tap ($MCP_HEALTH_TAP_URL), exit with its code; then
      mcp-health replay evidence.jsonl --fail-on state=false_success,effect_unknown

In a client's MCP configuration, put `mcp-health tap --` before the server command, or point the
client at the --listen address instead of the server's. Spans go to --otlp-endpoint (default
$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, $OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4317);
when it is down, spans are dropped and counted and the proxied traffic is not affected. With
--record and no --otlp-endpoint, spans only go to the file.")]
pub(crate) struct TapArgs {
    /// OTLP/gRPC endpoint for the spans.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// A header sent with every export, `name=value` (repeatable), e.g. `authorization=Bearer …`
    /// for a receiver that requires a token; `OTEL_EXPORTER_OTLP_HEADERS` is read too. Never printed.
    #[arg(long = "otlp-header", value_name = "NAME=VALUE")]
    pub otlp_headers: Vec<String>,
    /// `grpc` (default), `http/protobuf` or `http/json` (else `OTEL_EXPORTER_OTLP_PROTOCOL`).
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,
    /// TLS to the collector: trust only the CAs in this PEM file (else `OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// else the system's roots for an `https://` endpoint).
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_file: Option<std::path::PathBuf>,
    /// TLS to the collector: a client certificate (PEM, with --otlp-client-key) for a receiver
    /// that requires one (else `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`).
    #[arg(long, value_name = "FILE", requires = "otlp_client_key")]
    pub otlp_client_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM; else `OTEL_EXPORTER_OTLP_CLIENT_KEY`).
    #[arg(long, value_name = "FILE", requires = "otlp_client_cert")]
    pub otlp_client_key: Option<std::path::PathBuf>,
    /// `service.name` of the spans (the client's identity where the protocol has no session).
    #[arg(long, value_name = "NAME", env = "OTEL_SERVICE_NAME", default_value = "mcp-health-tap")]
    pub service_name: String,
    /// HTTP mode: listen here (port 0: any free port; the bound address is printed on stderr).
    #[arg(long, value_name = "ADDR", requires = "upstream")]
    pub listen: Option<SocketAddr>,
    /// HTTP mode: the streamable-HTTP MCP server (`http://` or `https://host:port[/prefix]`).
    #[arg(long, value_name = "URL", requires = "listen")]
    pub upstream: Option<String>,
    /// HTTP mode, `https://` upstream: trust only the CAs in this PEM file (default: the system's roots).
    #[arg(long, value_name = "FILE", requires = "upstream", conflicts_with = "upstream_insecure_skip_verify")]
    pub upstream_ca_file: Option<String>,
    /// HTTP mode, `https://` upstream: accept any certificate (unauthenticated; for tests and labs).
    #[arg(long, requires = "upstream")]
    pub upstream_insecure_skip_verify: bool,
    /// HTTP mode: forward every request body unchanged, also a 2026-07-28 request without trace
    /// context (by default it gets the tap's `traceparent` in `_meta`, so a server that honours
    /// `_meta` continues the tap's trace and no call is split over two traces).
    #[arg(long, requires = "upstream")]
    pub no_trace_context: bool,
    /// HTTP mode: longest wait for the upstream's response head (then 504).
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,
    /// HTTP mode: longest wait for a connection to the upstream (then 502, `timeout`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// stdio mode: `server.address` of the spans (default: the command's file name).
    #[arg(long, value_name = "NAME")]
    pub server_address: Option<String>,
    /// Outcome verifiers: a YAML file of rules (tool → check) run after each matching call's
    /// response; findings go out as spans in the call's trace (docs/tap-and-verifiers.md, "Outcome verifiers").
    #[arg(long, value_name = "FILE")]
    pub verifiers: Option<std::path::PathBuf>,
    /// Sign the verifiers' findings with this Ed25519 key (a file holding `ed25519:<hex seed>`,
    /// as `mcp-health keygen` writes it): a service that trusts its public key
    /// (`processors.mcp_health.receipts.trusted_keys`) takes only signed receipts as outcome
    /// evidence, so the server being checked cannot verify itself.
    #[arg(long, value_name = "FILE", env = "MCP_HEALTH_TAP_SIGNING_KEY_FILE")]
    pub signing_key: Option<std::path::PathBuf>,
    /// Append the evidence spans to this file, one OTLP/JSON request per line, as `mcp-health
    /// replay` reads it (e.g. `replay FILE --fail-on …` in CI). Spans still go over OTLP only when
    /// --otlp-endpoint is given too.
    #[arg(long, value_name = "FILE")]
    pub record: Option<std::path::PathBuf>,
    /// stdio mode: the server command and its arguments, after `--`. HTTP mode: a command to run
    /// against the tap (a test suite), with `MCP_HEALTH_TAP_URL` set to the tap's address; the tap
    /// stops when it exits and exits with its code.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The variable that tells a command run by an HTTP-mode tap where the tap listens
/// (`http://127.0.0.1:PORT`, the upstream's path prefix not included).
pub(crate) const TAP_URL_ENV: &str = "MCP_HEALTH_TAP_URL";

/// Run `command` once the tap listens, with [`TAP_URL_ENV`] pointing at it. Returns its exit
/// code (128 + the signal when a signal ended it; 127 when it could not start), or 1 when the tap
/// never listened.
async fn run_under_tap(command: Vec<OsString>, bound: tokio::sync::oneshot::Receiver<SocketAddr>) -> i32 {
    let Ok(addr) = bound.await else { return 1 };
    let Some((program, args)) = command.split_first() else { return 1 };
    let mut child = match tokio::process::Command::new(program)
        .args(args)
        .env(TAP_URL_ENV, format!("http://{addr}"))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-health tap: cannot start {program:?}: {e}");
            return 127;
        }
    };
    match child.wait().await {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            st.code().or_else(|| st.signal().map(|s| 128 + s)).unwrap_or(1)
        }
        Err(e) => {
            eprintln!("mcp-health tap: waiting for {program:?}: {e}");
            1
        }
    }
}

/// A signing-key file (`mcp-health keygen` writes one). Its text is never printed.
fn load_signing_key(path: &std::path::Path) -> Result<crate::evidence::receipt::SigningKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the key file: {}", e.kind()))?;
    crate::evidence::receipt::SigningKey::parse(&text).map_err(|e| e.to_string())
}

/// The OTLP endpoint: the flag, else the OTLP environment variables, else the local default.
pub(crate) fn resolve_endpoint(flag: Option<&str>) -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    flag.map(str::to_string)
        .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .unwrap_or_else(|| "http://127.0.0.1:4317".into())
}

pub(crate) fn run(a: TapArgs) -> ExitCode {
    if a.listen.is_none() && a.command.is_empty() {
        eprintln!("mcp-health tap: give a server command after `--` (stdio), or --listen and --upstream (HTTP)");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().thread_name("mcp-health-tap").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-health tap: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let tap = match Tap::from_args(a) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("mcp-health tap: {e}");
            return ExitCode::from(2);
        }
    };
    let code = rt.block_on(tap.run());
    // The stdin pump may still be blocked in read(2): exit without waiting for it.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

/// The tap's arguments, with what they name read and checked: the verifier rules, the export
/// headers, the signing key.
struct Tap {
    args: TapArgs,
    endpoint: String,
    rules: Option<Arc<verify::RuleSet>>,
    export_headers: Vec<(String, String)>,
    signer: Option<Arc<crate::evidence::receipt::SigningKey>>,
}

impl Tap {
    /// Read and check what the arguments name; the error is a usage error (exit 2).
    fn from_args(args: TapArgs) -> Result<Tap, String> {
        let endpoint = resolve_endpoint(args.otlp_endpoint.as_deref());
        let rules = args.verifiers.as_deref().map(verify::RuleSet::load).transpose().map_err(|e| e.to_string())?.map(Arc::new);
        let mut export_headers = Vec::new();
        for h in &args.otlp_headers {
            match h.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => export_headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string())),
                // The value may be a credential: the flag is named, never echoed.
                _ => return Err("--otlp-header takes NAME=VALUE".into()),
            }
        }
        let signer =
            args.signing_key.as_deref().map(load_signing_key).transpose().map_err(|e| format!("--signing-key: {e}"))?.map(Arc::new);
        if signer.is_some() && rules.is_none() {
            eprintln!("mcp-health tap: --signing-key without --verifiers signs nothing");
        }
        Ok(Tap { args, endpoint, rules, export_headers, signer })
    }

    fn export_settings(&self) -> export::ExportSettings {
        let a = &self.args;
        let mut settings = export::ExportSettings::new(self.endpoint.clone(), a.service_name.clone());
        settings.headers = self.export_headers.clone();
        settings.protocol = a.otlp_protocol.clone();
        settings.record = a.record.clone();
        settings.send = a.record.is_none() || a.otlp_endpoint.is_some();
        if a.otlp_ca_file.is_some() || a.otlp_client_cert.is_some() {
            settings.tls = Some(crate::config::tls_client::TlsClientSetting {
                ca_file: a.otlp_ca_file.clone(),
                cert_file: a.otlp_client_cert.clone(),
                key_file: a.otlp_client_key.clone(),
                ..Default::default()
            });
        }
        settings
    }

    /// The exporter, the verifiers, then the proxy until it ends; the verifiers and the exporter
    /// are given their grace to report and flush. Returns the exit code.
    async fn run(self) -> i32 {
        let (sink, exporter) = match export::spawn(self.export_settings()) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("mcp-health tap: {e}");
                return 2;
            }
        };
        let (pool, runner) = match self.rules {
            Some(r) => {
                let (p, run) = verify::VerifierPool::spawn(r, sink.clone(), self.signer);
                (Some(p), Some(run))
            }
            None => (None, None),
        };
        let code = if self.args.listen.is_some() { run_http(self.args, sink, pool).await } else { run_stdio(self.args, sink, pool).await };
        if let Some(run) = runner {
            // Checks queued or running get a grace period to report before the spans are flushed.
            let st = run.finish(Duration::from_secs(10)).await;
            let g = |c: &std::sync::atomic::AtomicU64| st.get(c);
            eprintln!(
                "mcp-health tap: verifiers: {} confirmed, {} missing, {} failed, {} errors, {} not run (queue full)",
                g(&st.confirmed),
                g(&st.missing),
                g(&st.failed),
                g(&st.errors),
                g(&st.queue_full)
            );
        }
        let (_sent, dropped) = exporter.finish(Duration::from_secs(3)).await;
        if dropped > 0 {
            eprintln!("mcp-health tap: {dropped} spans could not be exported");
        }
        code
    }
}

/// HTTP mode: serve until a drain signal (the service's: `service::signals`) or until the
/// command run against the tap ends. The command's task is supervised as the service's are, in
/// a named set: its end ends the tap, and the tap exits with its code.
async fn run_http(a: TapArgs, sink: export::SpanSink, verifiers: Option<verify::VerifierPool>) -> i32 {
    let upstream = match http::parse_upstream(a.upstream.as_deref().unwrap_or("")) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("mcp-health tap: {e}");
            return 2;
        }
    };
    let Some(listen) = a.listen else { return 2 };
    let settings = http::HttpSettings {
        listen,
        upstream: upstream.clone(),
        response_timeout: a.upstream_timeout,
        connect_timeout: a.connect_timeout,
        verifiers,
        upstream_tls: http::UpstreamTls { ca_file: a.upstream_ca_file.clone(), insecure_skip_verify: a.upstream_insecure_skip_verify },
        propagate_trace_context: !a.no_trace_context,
    };
    let shown = http::shown_upstream(&upstream);
    // A command after `--` runs against the tap; its end is the tap's.
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let (code_tx, code_rx) = tokio::sync::oneshot::channel::<i32>();
    let mut tasks = Tasks::default();
    let under_test = !a.command.is_empty();
    if under_test {
        let command = a.command.clone();
        tasks.add(
            "command under test",
            tokio::spawn(async move {
                let _ = code_tx.send(run_under_tap(command, bound_rx).await);
            }),
        );
    }
    let on_bound = |addr: SocketAddr| {
        eprintln!("mcp-health tap: listening on http://{addr}, forwarding to {shown}");
        let _ = bound_tx.send(addr);
    };
    let stop = shutdown_signal();
    let served = {
        let shutdown = async {
            tokio::select! {
                _ = stop => {}
                _ = tasks.ended() => {}
            }
        };
        http::run(settings, sink, on_bound, shutdown).await
    };
    // On a signal, the command under test still runs: its end is waited for.
    tasks.join().await;
    let tested = if under_test { Some(code_rx.await.unwrap_or(1)) } else { None };
    match served {
        // A CA file that cannot be read is a usage error, as a bad --upstream is.
        Err(e) if e.starts_with("--upstream") || e.starts_with("no system CA") => {
            eprintln!("mcp-health tap: {e}");
            2
        }
        Ok(r) => {
            if r.unobserved_events > 0 || r.stats.parse_errors > 0 || r.stats.oversize > 0 {
                eprintln!(
                    "mcp-health tap: {} exchanges, {} events not observed (queue or byte budget full, or a request body past the parse limit), {} unparseable messages, {} bodies or events past the parse limit",
                    r.exchanges, r.unobserved_events, r.stats.parse_errors, r.stats.oversize
                );
            }
            tested.unwrap_or(0)
        }
        Err(e) => {
            eprintln!("mcp-health tap: {e}");
            1
        }
    }
}

/// stdio mode: run the server command behind the tap until it exits (signals go to it); the
/// tap exits with its code.
async fn run_stdio(a: TapArgs, sink: export::SpanSink, verifiers: Option<verify::VerifierPool>) -> i32 {
    match stdio::run(a.command, a.server_address, sink, verifiers).await {
        Ok(r) => {
            if r.unobserved_chunks > 0 {
                eprintln!("mcp-health tap: {} chunks forwarded but not observed (observer queue full)", r.unobserved_chunks);
            }
            r.exit_code
        }
        Err(e) => {
            eprintln!("mcp-health tap: {e}");
            127
        }
    }
}
