//! `mcp-health serve`: the service. Binds every listener first (so a port conflict fails at once
//! with the address named), then runs until SIGTERM or Ctrl-C, decides what is in flight, flushes
//! exports and exits within `service.telemetry.shutdown_timeout`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use clap::Args;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::Config;
use crate::emit::metrics::{MetricsPipeline, MetricsSettings, OtlpMetricsTarget, QueueMetricExporterHandle};
use crate::emit::otlp_traces::{self, SenderSettings};
use crate::emit::prometheus;
use crate::emit::sink::{HealthSpanSink, MetricsSink, Sinks};
use crate::emit::verdict_log::VerdictLog;
use crate::engine::Engine;
use crate::evidence::time::Moment;
use crate::receive::admit::Admission;
use crate::receive::listen::{self, Listener, ListenerName, Protocol};
use crate::receive::{otlp_grpc, otlp_http};
use crate::service::{run_engine, Heartbeat};

#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// YAML configuration (collector style); the embedded default when absent.
    #[arg(long, short)]
    pub config: Option<String>,
    /// Override one setting, as the collector's `--set`: a dotted key and a value, e.g.
    /// `--set receivers.otlp.protocols.grpc.endpoint=0.0.0.0:4317`. Repeatable; later wins.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Bind(std::io::Error),
    /// A certificate or key that cannot be used; `0` is the key (`receivers.otlp.protocols.grpc.tls.cert_file`).
    #[error("{0}: {1}")]
    Tls(String, crate::config::tls::TlsError),
    #[error(transparent)]
    Metrics(#[from] crate::emit::metrics::MetricsError),
    #[error(transparent)]
    Export(#[from] otlp_traces::ExportError),
    #[error(transparent)]
    ExportTarget(#[from] crate::emit::otlp_target::TargetError),
    #[error("cannot open verdict log {0}: {1}")]
    VerdictLog(String, std::io::Error),
    #[error(transparent)]
    Lockfile(crate::config::lockfile::LockError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot open the state store at {0}: {1}")]
    Store(String, crate::state::StoreError),
    #[error("the engine stopped unexpectedly; verdicts can no longer be decided")]
    EngineStopped,
    /// The exporter would send into this service's own receiver.
    #[error("exporter: {0}")]
    ExportLoop(String),
}

pub fn run(a: ServeArgs) -> ExitCode {
    let cfg = match Config::load_with(a.config.as_deref(), &a.set) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logs(&cfg.service.telemetry.logs);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads())
        .enable_all()
        .thread_name("mcp-health")
        .on_thread_park(crate::receive::memory::on_thread_idle)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {}", ServeError::Runtime(e));
            return ExitCode::from(1);
        }
    };
    // SIGHUP with a valid configuration restarts the pipeline with it, as the collector's
    // SIGHUP does: the running one drains (chains in flight decided, exports flushed, listeners
    // closed) and a new one starts from the new file. An invalid file is logged and the running
    // configuration kept. The log settings apply only at the next start (the subscriber is global).
    let mut cfg = cfg;
    let r = loop {
        let (reload_tx, mut reload_rx) = mpsc::channel::<Config>(1);
        let next: Arc<std::sync::Mutex<Option<Config>>> = Arc::default();
        let slot = next.clone();
        let stop = async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                Some(c) = reload_rx.recv() => *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(c),
            }
        };
        let source = ConfigSource { path: a.config.clone(), sets: a.set.clone(), reload: Some(reload_tx) };
        let r = rt.block_on(serve(cfg, source, stop));
        let reloaded = next.lock().unwrap_or_else(|p| p.into_inner()).take();
        match (r, reloaded) {
            (Ok(()), Some(new)) => {
                tracing::info!("SIGHUP: the pipeline was restarted with the new configuration");
                cfg = new;
            }
            (r, _) => break r,
        }
    };
    // A task still stuck (an engine that never yields) must not hold the process past its
    // shutdown timeout: the runtime is left behind, not joined.
    rt.shutdown_background();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn init_logs(logs: &crate::config::Logs) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&logs.level));
    // Logs go to stderr: stdout carries verdict lines in the default configuration.
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if logs.encoding == "json" {
        // One object per line with `timestamp`, `level`, `target`, `message` and the event's
        // fields at the top level (flattened), as a log pipeline expects; never ANSI colours.
        let _ = fmt.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init();
    } else {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let _ = fmt.with_ansi(ansi).try_init();
    }
}

/// SIGTERM, SIGINT, SIGQUIT and SIGUSR1 all drain (decide what is in flight, flush, exit): none
/// of them ends the process with chains in flight lost. SIGHUP is handled apart ([`on_sighup`]).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [SignalKind::terminate(), SignalKind::quit(), SignalKind::user_defined1()];
        let mut streams: Vec<_> = kinds.into_iter().filter_map(|k| signal(k).ok()).collect();
        if streams.is_empty() {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
        let any = futures_any(&mut streams);
        tokio::select! {
            _ = any => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The first of several signal streams to fire.
#[cfg(unix)]
async fn futures_any(streams: &mut [tokio::signal::unix::Signal]) {
    std::future::poll_fn(|cx| {
        for s in streams.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// SIGHUP: reopen the verdict log (log rotation) and check the configuration file again. An
/// invalid file is logged and the running configuration kept; a valid one is reported, and the
/// settings it changes take effect at the next start (a live reload of the engine is not built).
#[cfg(unix)]
async fn on_sighup(source: ConfigSource, reopen: Option<Arc<std::sync::atomic::AtomicBool>>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
    while hup.recv().await.is_some() {
        if let Some(r) = &reopen {
            r.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match source.path.as_deref().map(|p| Config::load_with(Some(p), &source.sets)) {
            Some(Ok(cfg)) => match &source.reload {
                Some(tx) => {
                    tracing::info!("SIGHUP: the configuration file is valid; restarting the pipeline with it");
                    let _ = tx.try_send(cfg);
                }
                None => tracing::info!("SIGHUP: verdict log reopened; the configuration file is valid (changes apply at the next start)"),
            },
            Some(Err(e)) => tracing::error!(error = %e, "SIGHUP: the configuration file is invalid; the running configuration is kept"),
            None => tracing::info!("SIGHUP: verdict log reopened (embedded default configuration)"),
        }
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

pub use crate::emit::otlp_target::parse_otel_headers;

/// Run the service until `shutdown` resolves.
/// Where the running configuration came from, so SIGHUP checks the same thing again.
#[derive(Clone, Debug, Default)]
pub struct ConfigSource {
    /// The file (`None`: the embedded default).
    pub path: Option<String>,
    /// The `--set` overrides.
    pub sets: Vec<String>,
    /// Where SIGHUP hands a valid new configuration (the driver then restarts the pipeline with
    /// it); `None`: SIGHUP only checks the file.
    pub reload: Option<mpsc::Sender<Config>>,
}

pub async fn serve(cfg: Config, config_path: ConfigSource, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ServeError> {
    // Table and cache limits, before anything fills a table.
    cfg.processors.mcp_health.state_limits.apply();
    cfg.processors.mcp_health.receipts.apply();
    let service_name =
        cfg.service.telemetry.service_name.clone().or_else(|| env("OTEL_SERVICE_NAME")).unwrap_or_else(|| "mcp-health".into());

    // Exporter settings: config first, then the standard OTEL_* variables; the same checks
    // `validate` runs.
    let crate::cli::validate::Prepared { otlp, targets } = crate::cli::validate::prepare(&cfg, &env)?;
    let prom_cfg = cfg.exporters.prometheus.clone();
    // Two queues, each with its own workers: pass-through (what clients sent), and mcp-health's
    // own output (health spans, incident records, own metrics). A backend that is slow for one
    // kind, or a stuck request of one, never holds the other up (issue 11: oversize health-span
    // requests used to stall pass-through too).
    let wants_own = otlp.as_ref().is_some_and(|o| (o.health_spans && targets.traces.is_some()) || (o.metrics && targets.metrics.is_some()));
    let wants_pass =
        otlp.as_ref().is_some_and(|o| o.passthrough && (targets.traces.is_some() || targets.metrics.is_some() || targets.logs.is_some()));
    let (queue_tx, queue_rx) = match &otlp {
        Some(o) if wants_own => {
            let (tx, rx) = otlp_traces::queue(o.sending_queue.queue_size);
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let (pass_tx, pass_rx) = match &otlp {
        Some(o) if wants_pass => {
            let (tx, rx) = otlp_traces::queue(o.sending_queue.queue_size);
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let metrics = MetricsPipeline::build(MetricsSettings {
        resource: opentelemetry_sdk::Resource::builder()
            .with_service_name(service_name.clone())
            // Own metrics come back through a loop like health spans; marked the same way.
            .with_attribute(opentelemetry::KeyValue::new(crate::receive::loops::EMITTER, crate::receive::loops::instance_id()))
            .build(),
        prometheus: prom_cfg.is_some(),
        otlp: match (&otlp, &queue_tx) {
            (Some(o), Some(q)) if o.metrics && targets.metrics.is_some() => {
                Some(OtlpMetricsTarget { exporter: QueueMetricExporterHandle::new(q.clone()), interval: o.metrics_interval })
            }
            _ => None,
        },
        cardinality_limit: prom_cfg.as_ref().map_or(2000, |p| p.cardinality_limit),
    })?;
    let meters = metrics.meters.clone();

    let mut export_handles = Vec::new();
    if let Some(o) = &otlp {
        let settings = SenderSettings {
            targets: targets.clone(),
            workers: o.sending_queue.num_consumers,
            retry: o.retry_on_failure.clone(),
            max_request_bytes: o.max_request_bytes,
        };
        let meter = opentelemetry::metrics::MeterProvider::meter(&metrics.provider, "mcp-health");
        let queues: Vec<(&'static str, &mpsc::Sender<otlp_traces::Outgoing>)> =
            [("otlp", queue_tx.as_ref()), ("otlp/passthrough", pass_tx.as_ref())]
                .into_iter()
                .filter_map(|(n, q)| q.map(|q| (n, q)))
                .collect();
        crate::emit::metrics::observe_exporter_queues(&meter, &queues);
        for rx in [queue_rx, pass_rx].into_iter().flatten() {
            export_handles.extend(otlp_traces::spawn(settings.clone(), rx, meters.clone())?);
        }
    }
    let sender = queue_tx.filter(|_| targets.traces.is_some());
    let passthrough = otlp.as_ref().is_some_and(|o| o.passthrough);
    let health = otlp.as_ref().is_some_and(|o| o.health_spans);

    let verdict_log = match &cfg.exporters.verdict_log {
        Some(v) => Some(VerdictLog::open(&v.path).map_err(|e| ServeError::VerdictLog(v.path.clone(), e))?),
        None => None,
    };
    let proc_cfg = &cfg.processors.mcp_health;
    let pins = match &proc_cfg.lockfile {
        Some(p) => Some(Arc::new(crate::config::lockfile::load_lockfile(p).map_err(ServeError::Lockfile)?)),
        None => None,
    };
    let (ingest_tx, ingest_rx) = mpsc::channel(proc_cfg.queue_size);
    // Tasks that live as long as this pipeline, ended when it is (see the end of this function).
    let mut background: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // Memory is bounded by default: without `processors.memory_limiter` a limiter still runs.
    let memory_cfg = cfg.processors.memory_limiter.as_ref();
    let memory_limit = crate::receive::memory::effective_limit(memory_cfg, crate::receive::memory::SystemMemory::read());
    match &memory_limit {
        Some(l) => tracing::info!(
            limit_mib = l.hard >> 20,
            spike_limit_mib = l.spike >> 20,
            basis = l.basis.as_str(),
            "memory limiter: data is refused (retryably) above limit - spike"
        ),
        None => tracing::warn!("memory limiter off (processors.memory_limiter.limit_mib: 0): memory is not bounded"),
    }
    let memory = memory_limit.map(|l| {
        let limiter = Arc::new(crate::receive::memory::MemoryLimiter::from_limit(l));
        let every = memory_cfg.map_or(Duration::from_secs(1), |m| m.check_interval);
        background.push(tokio::spawn(sample_memory(limiter.clone(), every)));
        crate::emit::metrics::observe_memory_limiter(
            &opentelemetry::metrics::MeterProvider::meter(&metrics.provider, "mcp-health"),
            &limiter,
        );
        limiter
    });
    let admission = Admission {
        ingest: ingest_tx,
        passthrough: pass_tx.clone().filter(|_| passthrough),
        meters: meters.clone(),
        strip_tool_definitions: proc_cfg.strip_tool_definitions,
        memory: memory.clone(),
        refusal_log: crate::receive::admit::refusal_log(),
    };
    let mut sinks = Sinks::default();
    sinks.push(MetricsSink::new(meters.clone()));
    if let Some(s) = sender.as_ref().filter(|_| health) {
        sinks.push(HealthSpanSink::new(
            s.clone(),
            service_name.clone(),
            meters.clone(),
            otlp.as_ref().map_or(crate::config::DEFAULT_MAX_REQUEST_BYTES, |o| o.max_request_bytes),
        ));
    }
    let reopen = verdict_log.as_ref().map(|l| l.reopen.clone());
    if let Some(log) = verdict_log {
        sinks.push(log);
    }
    #[cfg(unix)]
    background.push(tokio::spawn(on_sighup(config_path, reopen)));
    #[cfg(not(unix))]
    let _ = (config_path, reopen);
    drop(sender);
    drop(pass_tx);

    // Bind everything before serving anything. Certificates are read here, once: a renewed one
    // takes effect at the next start (no hot reload).
    check_open_file_limit(&cfg);
    let tls = |prefix: &str, t: Option<&crate::config::TlsServerSettings>, alpn: &[&[u8]]| {
        t.map(|t| t.build(alpn).map_err(|e| ServeError::Tls(format!("{prefix}.tls.{}", e.key()), e))).transpose()
    };
    let grpc_l = match &cfg.receivers.otlp.protocols.grpc {
        Some(g) => {
            let tls = tls("receivers.otlp.protocols.grpc", g.tls.as_ref(), &[b"h2"])?;
            let l = Listener::new(bind(&g.endpoint).await?, ListenerName::OtlpGrpc, g.connections(), tls, Protocol::Http2);
            Some((l, g.max_recv_msg_size_mib << 20, g.tls.is_some(), crate::config::ReceiverAuth::token(&g.auth)))
        }
        None => None,
    };
    let http_l = match &cfg.receivers.otlp.protocols.http {
        Some(h) => {
            let tls = tls("receivers.otlp.protocols.http", h.tls.as_ref(), &[b"http/1.1"])?;
            let l = Listener::new(bind(&h.endpoint).await?, ListenerName::OtlpHttp, h.connections(), tls, Protocol::Http1);
            Some((l, h.max_request_body_size, h.tls.is_some(), crate::config::ReceiverAuth::token(&h.auth)))
        }
        None => None,
    };
    let prom_l = match &prom_cfg {
        Some(p) => Some(Listener::new(bind(&p.endpoint).await?, ListenerName::Prometheus, p.connections(), None, Protocol::Http1)),
        None => None,
    };
    let health_l = match &cfg.extensions.health_check {
        Some(h) => Some(Listener::new(bind(&h.endpoint).await?, ListenerName::HealthCheck, h.connections(), None, Protocol::Http1)),
        None => None,
    };
    let gate_l = match &cfg.extensions.gate {
        Some(g) => {
            let tls = tls("extensions.gate", g.tls.as_ref(), &[b"h2"])?;
            let l = Listener::new(bind(&g.endpoint).await?, ListenerName::Gate, g.connections(), tls, Protocol::Http2);
            Some((l, g.unpinned, g.tls.is_some()))
        }
        None => None,
    };

    let tick = (proc_cfg.decision_wait / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let (stop_tx, stop_rx) = oneshot::channel();
    let mut engine_cfg = super::replay::engine_config(&cfg);
    engine_cfg.pins = pins.clone();
    // Asked for durable (or shared) state and not getting it is an error at start, not a silent
    // downgrade.
    match &cfg.storage {
        Some(crate::config::Storage::Embedded { directory }) => {
            let store =
                crate::state::StoreHandle::open_directory(directory).map_err(|e| ServeError::Store(directory.display().to_string(), e))?;
            tracing::info!(directory = %directory.display(), "state store opened");
            engine_cfg.store = Some(store);
        }
        Some(crate::config::Storage::Redis { endpoint, timeout, retry_after, tombstone_ttl }) => {
            let shown = crate::state::redis::redact(&endpoint.0);
            let settings = crate::state::RedisSettings {
                endpoint: endpoint.0.clone(),
                timeout: *timeout,
                retry_after: *retry_after,
                tombstone_ttl: *tombstone_ttl,
            };
            let store = crate::state::StoreHandle::open_redis(settings).map_err(|e| ServeError::Store(shown.clone(), e))?;
            tracing::info!(endpoint = %shown, "shared state store (redis) opened");
            engine_cfg.store = Some(store);
        }
        None => {}
    }
    let shared = engine_cfg.store.clone().filter(|s| s.is_shared()).map(|s| (s, engine_cfg.sessions.clone()));
    let engine = Engine::new(engine_cfg);
    let heartbeat = Heartbeat::new(Moment::wall_now());
    let gate_state = gate_l.as_ref().map(|(_, unpinned, _)| {
        let hb = heartbeat.clone();
        crate::gate::GateState {
            pins,
            board: engine.board(),
            unpinned: *unpinned,
            store_down: Some(std::sync::Arc::new(move || hb.is_store_down())),
            shared,
        }
    });
    // The engine steps at least every tick; silent for much longer than that, it is stuck.
    let stall_after = (tick * 40).max(Duration::from_secs(10));
    let mut engine_task = tokio::spawn(run_engine(ingest_rx, engine, sinks, tick, stop_rx, heartbeat.clone(), memory));

    let (down_tx, down_rx) = watch::channel(false);
    let (health_down_tx, health_down_rx) = watch::channel(false);
    let mut health_task = None;
    let wait_down = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let mut servers = Vec::new();
    if let Some((l, max, tls, token)) = grpc_l {
        tracing::info!(addr = %l.local_addr().map_or(String::new(), |a| a.to_string()), tls, "OTLP/gRPC receiver listening");
        let adm = admission.clone();
        let sd = wait_down(down_rx.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = otlp_grpc::serve(l, adm, max, token, sd).await {
                tracing::error!(error = %e, "OTLP/gRPC receiver failed");
            }
        }));
    }
    if let Some((l, max, tls, token)) = http_l {
        tracing::info!(addr = %l.local_addr().map_or(String::new(), |a| a.to_string()), tls, "OTLP/HTTP receiver listening");
        servers.push(spawn_http(l, otlp_http::router(admission.clone(), max, token), wait_down(down_rx.clone())));
    }
    drop(admission);
    if let (Some((l, _, tls)), Some(state)) = (gate_l, gate_state) {
        tracing::info!(addr = %l.local_addr().map_or(String::new(), |a| a.to_string()), tls, "gate gRPC API listening");
        let sd = wait_down(down_rx.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = crate::gate::service::serve(l, state, sd).await {
                tracing::error!(error = %e, "gate gRPC API failed");
            }
        }));
    }
    if let (Some(l), Some(reader)) = (prom_l, metrics.prometheus.clone()) {
        tracing::info!(addr = %l.local_addr().map_or(String::new(), |a| a.to_string()), "Prometheus endpoint listening on /metrics");
        let exemplars = metrics.meters.exemplars.clone();
        // OpenMetrics (with exemplars) when the scraper asks for it, as Prometheus does; the
        // text format otherwise.
        let app = Router::new().route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let (reader, exemplars) = (reader.clone(), exemplars.clone());
                async move {
                    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
                    let format = prometheus::Format::negotiate(accept);
                    ([(axum::http::header::CONTENT_TYPE, format.content_type())], prometheus::render_as(&reader, format, Some(&exemplars)))
                }
            }),
        );
        servers.push(spawn_http(l, app, wait_down(down_rx.clone())));
    }
    if let Some(l) = health_l {
        let hb = heartbeat.clone();
        let started = std::time::Instant::now();
        let app = Router::new().route(
            "/",
            get(move || {
                let hb = hb.clone();
                async move {
                    let h = hb.health(Moment::wall_now(), stall_after);
                    let code = if h.is_ok() { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
                    (code, axum::Json(serde_json::json!({"status": h.as_str(), "uptime_seconds": started.elapsed().as_secs()})))
                }
            }),
        );
        // Not shut down with the others: it answers 503 from the start of the drain until the
        // drain ends (the process exits, or a reload starts the next pipeline), so a load
        // balancer stops sending before the receivers close.
        health_task = Some(spawn_http(l, app, wait_down(health_down_rx.clone())));
    }

    // Run until asked to stop, or until the engine dies or stops stepping: a service that can no
    // longer decide verdicts exits non-zero rather than accept spans it will never judge.
    let mut watchdog = tokio::time::interval(Duration::from_secs(1));
    let mut failed = false;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = &mut engine_task => {
                match r {
                    Err(e) if e.is_panic() => tracing::error!("the engine panicked"),
                    _ => tracing::error!("the engine stopped"),
                }
                failed = true;
                break;
            }
            _ = watchdog.tick() => {
                if heartbeat.health(Moment::wall_now(), stall_after * 3) == crate::service::health::Health::Stuck {
                    tracing::error!(?stall_after, "the engine is stuck");
                    failed = true;
                    break;
                }
            }
        }
    }
    tracing::info!("shutting down: deciding chains in flight and flushing exports");
    heartbeat.set_draining();
    let limit = cfg.service.telemetry.shutdown_timeout.unwrap_or(Duration::from_secs(10));
    let finish = async {
        let _ = down_tx.send(true);
        for s in servers {
            let _ = s.await;
        }
        let _ = stop_tx.send(());
        if !failed {
            let _ = (&mut engine_task).await;
        }
        // The metrics provider first: its last collection goes into the exporter queue, and its
        // exporter then lets go of the queue, so the workers drain it and end.
        let provider = metrics.provider.clone();
        let _ = tokio::time::timeout(
            Duration::from_secs(4),
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(3))),
        )
        .await;
        for h in export_handles {
            let _ = h.await;
        }
    };
    if tokio::time::timeout(limit, finish).await.is_err() {
        tracing::warn!(?limit, "shutdown timeout reached; exiting with exports pending");
    }
    // What outlives the pipeline's servers: the health check, the SIGHUP handler, the memory
    // sampler. Ended here so that a reload can bind the same ports and handle the next SIGHUP.
    let _ = health_down_tx.send(true);
    if let Some(h) = health_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    for b in background {
        b.abort();
    }
    if failed {
        return Err(ServeError::EngineStopped);
    }
    Ok(())
}

fn spawn_http(l: Listener, app: Router, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(listen::serve_http(l, app, shutdown))
}

/// Raise the open-file limit as far as allowed, and say so when the listeners' `max_connections`
/// together could still exhaust it (then a flood on one listener can starve the others again).
fn check_open_file_limit(cfg: &Config) {
    let Some(limit) = listen::raise_open_file_limit() else { return };
    let p = &cfg.receivers.otlp.protocols;
    let total: usize = [
        p.grpc.as_ref().map(|g| g.max_connections),
        p.http.as_ref().map(|h| h.max_connections),
        cfg.exporters.prometheus.as_ref().map(|p| p.max_connections),
        cfg.extensions.health_check.as_ref().map(|h| h.max_connections),
        cfg.extensions.gate.as_ref().map(|g| g.max_connections),
    ]
    .into_iter()
    .flatten()
    .sum();
    // Files the service needs besides connections: the state store, the verdict log, exporters.
    let reserve = 128;
    if total as u64 + reserve > limit {
        tracing::warn!(
            open_file_limit = limit,
            max_connections_total = total,
            "the listeners' max_connections add up to more than the open-file limit allows; lower them or raise the limit (ulimit -n)"
        );
    }
}

/// Sample the process's memory for the memory limiter; log each crossing of the soft limit.
async fn sample_memory(limiter: Arc<crate::receive::memory::MemoryLimiter>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(rss) = crate::receive::memory::process_rss() else { continue };
        let (soft, hard) = limiter.limits();
        match limiter.sample(rss) {
            Some(true) => tracing::warn!(
                rss_mib = rss >> 20,
                soft_mib = soft >> 20,
                hard_mib = hard >> 20,
                "memory above the soft limit: refusing data (retryable) until it is back under"
            ),
            Some(false) => tracing::info!(rss_mib = rss >> 20, soft_mib = soft >> 20, "memory back under the soft limit: accepting data"),
            None => {}
        }
    }
}

/// Bind `host:port`; a name (`localhost:4317`) is resolved and its first address bound.
async fn bind(endpoint: &str) -> Result<tokio::net::TcpListener, ServeError> {
    let bad = |m: String| ServeError::Bind(std::io::Error::new(std::io::ErrorKind::InvalidInput, m));
    let addr: SocketAddr = match endpoint.parse() {
        Ok(a) => a,
        Err(_) => tokio::net::lookup_host(endpoint)
            .await
            .map_err(|e| bad(format!("cannot resolve {endpoint}: {e}")))?
            .next()
            .ok_or_else(|| bad(format!("{endpoint} resolves to no address")))?,
    };
    otlp_grpc::bind(addr).await.map_err(ServeError::Bind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otel_headers_parse() {
        assert_eq!(
            parse_otel_headers("api-key=abc%20def, X-Tenant = t1,bad"),
            vec![("api-key".to_string(), "abc def".to_string()), ("x-tenant".to_string(), "t1".to_string())]
        );
    }
}
