//! `mcp-health serve`: the service. Binds every listener first (so a port conflict fails at once
//! with the address named), then runs until SIGTERM or Ctrl-C, decides what is in flight, flushes
//! exports and exits within `service.telemetry.shutdown_timeout`.
//!
//! The service is a [`Supervisor`] over a few long-lived parts: the [`Pipeline`] (export queues
//! and workers, metrics, the engine and its sinks), the [`Listeners`] and the signals. SIGHUP
//! reconciles the running parts with the configuration file without closing anything that did
//! not change (the engine and its calls in flight always survive); SIGTERM, at any moment, drains.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::emit::metrics::{MetricsPipeline, MetricsSettings, OtlpMetricsTarget, QueueMetricExporterHandle};
use crate::emit::otlp_traces::{self, SenderSettings};
use crate::emit::sink::{HealthSpanSink, MetricsSink, Sinks};
use crate::emit::verdict_log::VerdictLog;
use crate::engine::Engine;
use crate::evidence::time::Moment;
use crate::flow::queue::{self, OnFull};
use crate::receive::admit::Admission;
use crate::receive::listen;
use crate::service::listeners::{ListenError, Listeners, Served};
use crate::service::reload::{self, SinkSwap, SwappableSink};
use crate::service::tasks::Tasks;
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
    #[error("cannot open the evidence journal at {0}: {1}")]
    Journal(String, crate::state::journal::JournalError),
    /// A part of the running service (the engine, a listener, an exporter task) ended or stalled.
    #[error("a part of the service ended unexpectedly ({0}); verdicts can no longer be decided and sent")]
    PartEnded(String),
    /// The exporter would send into this service's own receiver.
    #[error("exporter: {0}")]
    ExportLoop(String),
}

impl From<ListenError> for ServeError {
    fn from(e: ListenError) -> Self {
        match e {
            ListenError::Bind(e) => ServeError::Bind(e),
            ListenError::Tls(k, e) => ServeError::Tls(k, e),
        }
    }
}

pub fn run(a: ServeArgs) -> ExitCode {
    let cfg = match Config::load_with(a.config.as_deref(), &a.set) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Log settings and the worker threads are read here, once: a SIGHUP reload keeps them.
    init_logs(&cfg.service.telemetry.logs);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads())
        .enable_all()
        .thread_name("mcp-health")
        .on_thread_park(crate::flow::memory::on_thread_idle)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {}", ServeError::Runtime(e));
            return ExitCode::from(1);
        }
    };
    // The signal handlers are installed before anything else, so a SIGTERM at any moment (while
    // the state store opens, while the listeners bind, during a reload) drains and exits rather
    // than being lost or killing the process with chains in flight.
    let stop = {
        let _in_runtime = rt.enter();
        shutdown_signal()
    };
    let source = ConfigSource { path: a.config.clone(), sets: a.set.clone() };
    let r = rt.block_on(serve(cfg, source, stop));
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
/// of them ends the process with chains in flight lost. SIGHUP reloads ([`Supervisor::reload`]).
///
/// The handlers are installed when this is called, not when the future is first polled: from
/// then on none of these signals can end the process unhandled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::quit(), SignalKind::user_defined1()];
        let mut streams: Vec<_> = kinds.into_iter().filter_map(|k| signal(k).ok()).collect();
        async move {
            if streams.is_empty() {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
            futures_any(&mut streams).await
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
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

/// SIGHUP, as a stream the supervisor waits on (never fires where there is no SIGHUP).
struct Hangups {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn install() -> Hangups {
        #[cfg(unix)]
        {
            Hangups { hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok() }
        }
        #[cfg(not(unix))]
        Hangups {}
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(h) = &mut self.hup {
            if h.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

pub use crate::emit::otlp_target::parse_otel_headers;

/// Where the running configuration came from, so SIGHUP reads the same thing again.
#[derive(Clone, Debug, Default)]
pub struct ConfigSource {
    /// The file (`None`: the embedded default).
    pub path: Option<String>,
    /// The `--set` overrides.
    pub sets: Vec<String>,
}

/// Run the service until `shutdown` resolves (or a part of it fails), reloading the
/// configuration on SIGHUP without closing anything that did not change.
pub async fn serve(cfg: Config, source: ConfigSource, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ServeError> {
    tokio::pin!(shutdown);
    let hangups = Hangups::install();
    // A SIGTERM while the pipeline starts (a state store that takes its time to answer) exits
    // at once: nothing was received yet, so nothing is left to decide.
    let pipeline = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        p = Pipeline::start(&cfg) => p?,
    };
    // Bind everything before serving anything: a port conflict fails at once with the address
    // named. Certificates are read here, and again at every SIGHUP (and `tls.reload_interval`).
    check_open_file_limit(&cfg);
    let mut listeners = Listeners::default();
    let plan = listeners.prepare(&cfg).await.map_err(ServeError::from)?;
    listeners.commit(plan, &pipeline.served).await;
    let mut sup = Supervisor { running: cfg, source, pipeline, listeners, hangups };
    let end = sup.supervise(&mut shutdown).await;
    sup.drain(end).await
}

/// Why the supervisor stopped: asked to, or a part that must run ended or stalled.
#[derive(Debug)]
enum End {
    Asked,
    Failed(String),
}

/// The long-lived parts of the service and what watches them: the pipeline (engine, exporters,
/// metrics), the listeners, and the signals. Any part that ends or stalls ends the service with
/// a message naming it; SIGHUP reconciles the running parts with the file; SIGTERM drains.
struct Supervisor {
    /// The configuration in effect (the last reload's, less what only a restart applies).
    running: Config,
    source: ConfigSource,
    pipeline: Pipeline,
    listeners: Listeners,
    hangups: Hangups,
}

impl Supervisor {
    async fn supervise(&mut self, shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>) -> End {
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        let stall_after = self.pipeline.served.stall_after;
        loop {
            tokio::select! {
                _ = shutdown.as_mut() => return End::Asked,
                r = &mut self.pipeline.engine_task => {
                    return End::Failed(match r {
                        Err(e) if e.is_panic() => "the engine panicked".into(),
                        _ => "the engine stopped".into(),
                    });
                }
                name = self.listeners.ended() => return End::Failed(format!("the {name} listener stopped")),
                (name, how) = self.pipeline.export_tasks.ended() => return End::Failed(format!("the {name} {}", how.as_str())),
                (name, how) = self.pipeline.background.ended() => return End::Failed(format!("the {name} {}", how.as_str())),
                _ = watchdog.tick() => {
                    if self.pipeline.served.heartbeat.health(Moment::wall_now(), stall_after * 3) == crate::service::health::Health::Stuck {
                        return End::Failed(format!("the engine is stuck (no step for {:?})", stall_after * 3));
                    }
                }
                _ = self.hangups.next() => {
                    // A reload binds and reads files; a SIGTERM meanwhile is not kept waiting.
                    tokio::select! {
                        _ = shutdown.as_mut() => return End::Asked,
                        _ = self.reload() => {}
                    }
                }
            }
        }
    }

    /// SIGHUP: reopen the verdict log (log rotation), read the TLS certificates again, read the
    /// configuration again and apply what can change live. An invalid file, or one whose
    /// listeners cannot be bound, changes nothing: it is logged and the running configuration kept.
    async fn reload(&mut self) {
        self.pipeline.reopen_verdict_log();
        // Renewed certificates are files changed in place, not settings: read them whatever the
        // configuration file says (a certificate that cannot be used also makes the file invalid
        // below, and the served one stays).
        self.listeners.reload_certificates();
        let Some(path) = self.source.path.as_deref() else {
            tracing::info!("SIGHUP: verdict log reopened (embedded default configuration)");
            return;
        };
        let new = match Config::load_with(Some(path), &self.source.sets) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration file is invalid; the running configuration is kept");
                return;
            }
        };
        let restart = reload::restart_only(&self.running, &new);
        let next = reload::effective(&self.running, &new);
        let kept = "SIGHUP: the new configuration cannot be applied; the running configuration is kept";
        for url in &self.pipeline.target_urls {
            if let Some(why) = next.export_loop(url) {
                tracing::error!(error = %format!("exporter: {why}"), "{kept}");
                return;
            }
        }
        let log = if next.exporters.verdict_log != self.running.exporters.verdict_log {
            match next
                .exporters
                .verdict_log
                .as_ref()
                .map(|v| VerdictLog::open(&v.path).map_err(|e| ServeError::VerdictLog(v.path.clone(), e)))
            {
                Some(Err(e)) => {
                    tracing::error!(error = %e, "{kept}");
                    return;
                }
                opened => Some(opened.map(|l| l.unwrap_or_else(|_| unreachable!("errors returned above")))),
            }
        } else {
            None
        };
        let plan = match self.listeners.prepare(&next).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "{kept}");
                return;
            }
        };
        // Nothing can fail from here on.
        let changed = plan.changed();
        check_open_file_limit(&next);
        self.listeners.commit(plan, &self.pipeline.served).await;
        if let Some(log) = log {
            self.pipeline.replace_verdict_log(log);
        }
        if !restart.is_empty() {
            tracing::warn!(
                settings = %restart.join(", "),
                "SIGHUP: these changed settings apply only at a restart; their running values are kept"
            );
        }
        tracing::info!(
            listeners_replaced = %changed.join(", "),
            "SIGHUP: the new configuration is applied; the engine and its calls in flight, the export queues and the unchanged listeners were kept"
        );
        self.running = next;
    }

    /// Drain and stop within `service.telemetry.shutdown_timeout`: the health check answers 503,
    /// the receivers stop (requests in flight finish), the engine decides what is in flight, the
    /// exports are flushed; the health check closes last.
    async fn drain(self, end: End) -> Result<(), ServeError> {
        let Supervisor { running, pipeline, mut listeners, .. } = self;
        let failed = match end {
            End::Asked => None,
            End::Failed(why) => {
                tracing::error!("{why}; the service stops");
                Some(why)
            }
        };
        tracing::info!("shutting down: deciding chains in flight and flushing exports");
        let limit = running.service.telemetry.shutdown_timeout.unwrap_or(Duration::from_secs(10));
        pipeline.drain(&mut listeners, failed.is_some(), limit).await;
        listeners.stop_health(Duration::from_secs(2)).await;
        if let Some(why) = failed {
            return Err(ServeError::PartEnded(why));
        }
        Ok(())
    }
}

/// The parts built once and kept across reloads: the export queues and their workers, the
/// metrics pipeline, the engine (its chains in flight) and its sinks, what the listeners serve
/// from, and the background samplers.
struct Pipeline {
    served: Served,
    engine_task: JoinHandle<()>,
    stop_engine: oneshot::Sender<()>,
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    /// The export queues' workers (and disk writers): they end when the drain closes their queues.
    export_tasks: Tasks,
    /// What each export queue still holds at exit (said in the exit log).
    queue_leftovers: Vec<otlp_traces::Leftover>,
    /// Samplers that run until the drain stops them.
    background: Tasks,
    /// Where the exporter sends (for the loop check of a reload).
    target_urls: Vec<String>,
    verdict_log: SinkSwap,
    /// Set to reopen the running verdict log before its next write.
    reopen: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Pipeline {
    async fn start(cfg: &Config) -> Result<Pipeline, ServeError> {
        // Table and cache limits, before anything fills a table.
        cfg.processors.mcp_health.state_limits.apply();
        cfg.processors.mcp_health.receipts.apply();
        let service_name =
            cfg.service.telemetry.service_name.clone().or_else(|| env("OTEL_SERVICE_NAME")).unwrap_or_else(|| "mcp-health".into());

        // Exporter settings: config first, then the standard OTEL_* variables.
        // Exporter settings: config first, then the standard OTEL_* variables; the same checks
        // `validate` runs (environment, endpoints, an exporter pointed at this service itself).
        let crate::cli::validate::Prepared { otlp, targets } = crate::cli::validate::prepare(cfg, &env)?;
        let target_urls: Vec<String> =
            [&targets.traces, &targets.metrics, &targets.logs].into_iter().flatten().map(|t| t.url.clone()).collect();
        for url in &target_urls {
            if let Some(why) = cfg.export_loop(url) {
                return Err(ServeError::ExportLoop(why));
            }
        }
        let prom_cfg = cfg.exporters.prometheus.clone();
        // Two queues, each with its own workers: pass-through (what clients sent), and mcp-health's
        // own output (health spans, incident records, own metrics). A backend that is slow for one
        // kind, or a stuck request of one, never holds the other up (issue 11: oversize health-span
        // requests used to stall pass-through too).
        let wants_own =
            otlp.as_ref().is_some_and(|o| (o.health_spans && targets.traces.is_some()) || (o.metrics && targets.metrics.is_some()));
        let wants_pass = otlp
            .as_ref()
            .is_some_and(|o| o.passthrough && (targets.traces.is_some() || targets.metrics.is_some() || targets.logs.is_some()));
        let (queue_tx, queue_rx) = match &otlp {
            Some(o) if wants_own => {
                let (tx, rx) = queue::bounded("otlp", o.sending_queue.capacity(), OnFull::DropCounted);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let (pass_tx, pass_rx) = match &otlp {
            Some(o) if wants_pass => {
                let (tx, rx) = queue::bounded("otlp/passthrough", o.sending_queue.capacity(), OnFull::Refuse);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let metrics = MetricsPipeline::build(MetricsSettings {
            resource: opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.clone())
                // Own metrics come back through a loop like health spans; marked the same way.
                .with_attribute(opentelemetry::KeyValue::new(crate::flow::loops::EMITTER, crate::flow::loops::instance_id()))
                .build(),
            prometheus: prom_cfg.is_some(),
            otlp: match (&otlp, &queue_tx) {
                (Some(o), Some(q)) if o.metrics && targets.metrics.is_some() => {
                    Some(OtlpMetricsTarget { exporter: QueueMetricExporterHandle::new(q.clone()), interval: o.metrics_interval })
                }
                _ => None,
            },
            cardinality_limit: prom_cfg.as_ref().map_or(2000, |p| p.cardinality_limit),
            level: cfg.service.telemetry.metrics.level,
        })?;
        let meters = metrics.meters.clone();

        let mut export_tasks = Tasks::default();
        let mut queue_leftovers = Vec::new();
        let mut passthrough_spool = None;
        let mut own_spool = None;
        // What each exporter's attempts tell, for `/status/health`.
        let mut exporter_health = Vec::new();
        if let Some(o) = &otlp {
            let settings = SenderSettings {
                targets: targets.clone(),
                workers: o.sending_queue.num_consumers,
                retry: o.retry_on_failure.clone(),
                max_request_bytes: o.max_request_bytes,
            };
            let meter = crate::emit::metrics::meter(&metrics.provider);
            let queues: Vec<_> = [queue_tx.as_ref(), pass_tx.as_ref()].into_iter().flatten().collect();
            crate::emit::metrics::observe_exporter_queues(&meter, &queues);
            // With a directory, mcp-health's own output waits on disk, and so does what it passes
            // on: written there before the receiver answers, so what was acknowledged survives a
            // crash (the collector's persistent queue). Without one both queues are in memory
            // (pass-through senders keep their data and retry when the queue refuses).
            let dir = cfg.sending_queue_directory();
            let disk = |dir: Option<std::path::PathBuf>| match dir {
                Some(dir) => otlp_traces::QueueStore::Disk { dir, max_bytes: o.sending_queue.storage_max_bytes },
                None => otlp_traces::QueueStore::Memory,
            };
            // Beside the own queue's directory: `sending_queue` and `sending_queue-passthrough`.
            let pass_store = disk(dir.as_ref().map(|d| {
                let mut name = d.file_name().unwrap_or_default().to_os_string();
                name.push("-passthrough");
                d.with_file_name(name)
            }));
            for (name, rx, store) in [("otlp", queue_rx, disk(dir.clone())), ("otlp/passthrough", pass_rx, pass_store)] {
                let Some(rx) = rx else { continue };
                let started = otlp_traces::spawn(settings.clone(), rx, meters.clone(), name, store)?;
                if name == "otlp/passthrough" {
                    passthrough_spool = started.spool.clone();
                } else {
                    own_spool = started.spool.clone();
                }
                started.leftover.observe(&meter);
                exporter_health.push((name, started.health.clone(), started.leftover.clone()));
                for (i, w) in started.workers.into_iter().enumerate() {
                    export_tasks.add(format!("{name} exporter task {i}"), w);
                }
                queue_leftovers.push(started.leftover);
            }
        }
        let status = crate::service::status::Status::new([queue_tx.as_ref(), pass_tx.as_ref()]);
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
        let (ingest_tx, ingest_rx) = queue::bounded("engine_ingest", proc_cfg.queue_size, OnFull::Refuse);
        status.watch_queue(&ingest_tx);
        // Tasks that live as long as the service, ended when it is (see `drain`).
        let mut background = Tasks::default();
        // Memory is bounded by default: without `processors.memory_limiter` a limiter still runs.
        let memory_cfg = cfg.processors.memory_limiter.as_ref();
        let memory_limit = crate::flow::memory::effective_limit(memory_cfg, crate::flow::memory::SystemMemory::read());
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
            let limiter = Arc::new(crate::flow::memory::MemoryLimiter::from_limit(l));
            let every = memory_cfg.map_or(Duration::from_secs(1), |m| m.check_interval);
            background.add("memory limiter's sampler", tokio::spawn(sample_memory(limiter.clone(), every)));
            crate::emit::metrics::observe_memory_limiter(&crate::emit::metrics::meter(&metrics.provider), &limiter);
            limiter
        });
        // With a directory of its own, what the receivers acknowledge is written to the evidence
        // journal before the answer, so a crash loses none of it (`state::journal`).
        let journal = match &cfg.storage {
            Some(crate::config::Storage::Embedded { directory, journal_max_bytes }) => {
                let dir = directory.join("journal");
                let j = crate::state::journal::Journal::open(&dir, *journal_max_bytes)
                    .map_err(|e| ServeError::Journal(dir.display().to_string(), e))?;
                Some(j)
            }
            _ => None,
        };
        let admission = Admission {
            ingest: ingest_tx,
            passthrough: pass_tx.clone().filter(|_| passthrough),
            meters: meters.flow.clone(),
            strip_tool_definitions: proc_cfg.strip_tool_definitions,
            memory: memory.clone(),
            refusal_log: crate::receive::admit::refusal_log(),
            journaled: journal.is_some(),
            passthrough_spool,
        };
        let mut sinks = Sinks::default();
        sinks.push(MetricsSink::new(meters.clone()));
        // Fed whenever a health check is configured at start, so a reload that switches the page
        // on shows what was decided before it.
        if cfg.extensions.health_check.is_some() {
            sinks.push(status.sink());
        }
        if let Some(s) = sender.as_ref().filter(|_| health) {
            let mut hs = HealthSpanSink::new(
                s.clone(),
                service_name.clone(),
                meters.clone(),
                otlp.as_ref().map_or(crate::config::DEFAULT_MAX_REQUEST_BYTES, |o| o.max_request_bytes),
            );
            hs.memory = memory.clone();
            hs.spool = own_spool.clone();
            sinks.push(hs);
        }
        let reopen = verdict_log.as_ref().map(|l| l.reopen.clone());
        // The verdict log's destination changes live (a reload may move it): the engine holds it
        // through a swappable sink.
        let (log_sink, log_swap) = SwappableSink::new(verdict_log.map(|l| Box::new(l) as Box<dyn crate::emit::sink::Sink>));
        sinks.push(log_sink);
        drop(sender);
        drop(pass_tx);

        let tick = (proc_cfg.decision_wait / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        let (stop_tx, stop_rx) = oneshot::channel();
        let mut engine_cfg = super::replay::engine_config(cfg);
        engine_cfg.pins = pins.clone();
        // Asked for durable (or shared) state and not getting it is an error at start, not a silent
        // downgrade.
        match &cfg.storage {
            Some(crate::config::Storage::Embedded { directory, .. }) => {
                let store = crate::state::StoreHandle::open_directory(directory)
                    .map_err(|e| ServeError::Store(directory.display().to_string(), e))?;
                tracing::info!(directory = %directory.display(), "state store opened");
                engine_cfg.store = Some(store);
            }
            Some(crate::config::Storage::Redis { endpoint, timeout, retry_after, tombstone_ttl, state_protocol }) => {
                let shown = crate::state::redis::redact(&endpoint.0);
                let settings = crate::state::RedisSettings {
                    endpoint: endpoint.0.clone(),
                    timeout: *timeout,
                    retry_after: *retry_after,
                    tombstone_ttl: *tombstone_ttl,
                    // Past the longest gap between two writes of one record here: a decided
                    // chain's delete, a session's idle expiry.
                    remember_for: engine_cfg.chains.late_span_window.max(engine_cfg.sessions.idle_expiry) + Duration::from_secs(60),
                };
                let store = crate::state::StoreHandle::open_redis(settings).map_err(|e| ServeError::Store(shown.clone(), e))?;
                if let Some(p) = state_protocol {
                    store.speak(*p);
                }
                let speaks = state_protocol.unwrap_or(crate::state::format::CURRENT);
                tracing::info!(endpoint = %shown, state_protocol = speaks, "shared state store (redis) opened");
                engine_cfg.store = Some(store);
                // The store's round trips off the engine's path: answers are taken when they
                // come (polled each step), the engine waiting only past the backstop.
                engine_cfg.store_answer_within = crate::engine::SHARED_STORE_ANSWER_WITHIN;
            }
            None => {}
        }
        let shared = engine_cfg.store.clone().filter(|s| s.is_shared()).map(|s| (s, engine_cfg.sessions.clone()));
        let engine = Engine::new(engine_cfg);
        let heartbeat = Heartbeat::new(Moment::wall_now());
        let store_kind = cfg.storage.as_ref().map(|s| match s {
            crate::config::Storage::Embedded { .. } => crate::service::components::StoreKind::Embedded,
            crate::config::Storage::Redis { .. } => crate::service::components::StoreKind::Redis,
        });
        let mut components = crate::service::components::Components::new(heartbeat.clone(), Moment::wall_now())
            .with_engine_queue(admission.ingest.gauge())
            .with_store(store_kind);
        for (name, h, queue) in exporter_health {
            components = components.with_exporter(name, h, queue);
        }
        let hb = heartbeat.clone();
        let gate = crate::gate::GateState {
            pins,
            board: engine.board(),
            unpinned: Default::default(),
            store_down: Some(Arc::new(move || hb.is_store_down())),
            shared,
        };
        // The engine steps at least every tick; silent for much longer than that, it is stuck.
        let stall_after = (tick * 40).max(Duration::from_secs(10));
        let engine_task = tokio::spawn(run_engine(ingest_rx, engine, sinks, tick, stop_rx, heartbeat.clone(), memory, journal));
        let served = Served {
            admission,
            prometheus: metrics.prometheus.clone().map(|r| (r, metrics.meters.exemplars.clone())),
            heartbeat,
            stall_after,
            started: std::time::Instant::now(),
            gate,
            status,
            components: Arc::new(components),
        };
        Ok(Pipeline {
            served,
            engine_task,
            stop_engine: stop_tx,
            provider: metrics.provider,
            export_tasks,
            queue_leftovers,
            background,
            target_urls,
            verdict_log: log_swap,
            reopen,
        })
    }

    fn reopen_verdict_log(&self) {
        if let Some(r) = &self.reopen {
            r.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn replace_verdict_log(&mut self, log: Option<VerdictLog>) {
        self.reopen = log.as_ref().map(|l| l.reopen.clone());
        self.verdict_log.replace(log.map(|l| Box::new(l) as Box<dyn crate::emit::sink::Sink>));
    }

    /// Stop the receivers, decide what is in flight and flush the exports, within `limit`.
    async fn drain(self, listeners: &mut Listeners, failed: bool, limit: Duration) {
        let Pipeline { served, mut engine_task, stop_engine, provider, export_tasks, queue_leftovers, background, .. } = self;
        served.heartbeat.set_draining();
        let finish = async {
            listeners.stop_serving().await;
            // The receivers' handles on the queues go with them: the export workers end once
            // the queues are empty and nobody can add to them.
            drop(served);
            let _ = stop_engine.send(());
            if !failed {
                let _ = (&mut engine_task).await;
            }
            // The metrics provider first: its last collection goes into the exporter queue, and its
            // exporter then lets go of the queue, so the workers drain it and end.
            let _ = tokio::time::timeout(
                Duration::from_secs(4),
                tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(3))),
            )
            .await;
            export_tasks.join().await;
        };
        if tokio::time::timeout(limit, finish).await.is_err() {
            tracing::warn!(?limit, "shutdown timeout reached; exiting with exports pending");
        }
        for q in &queue_leftovers {
            q.report_at_exit();
        }
        background.abort();
    }
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
async fn sample_memory(limiter: Arc<crate::flow::memory::MemoryLimiter>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(rss) = crate::flow::memory::process_rss() else { continue };
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
