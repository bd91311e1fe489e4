//! The pipeline: the parts of the service built once and kept across reloads — the export queues
//! and their workers, the metrics, the engine and its sinks, and what the listeners serve from.
//!
//! [`Pipeline::start`] builds it as a list of steps in the order the data needs them (exporters,
//! outputs, memory, journal, sinks, store, engine); every task a step starts goes into one named
//! set ([`PipelineTasks`]) that the supervisor watches and the drain ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::classify::pinning::Lockfile;
use crate::config::Config;
use crate::emit::export_health::ExportHealth;
use crate::emit::metrics::{MetricsPipeline, MetricsSettings, OtlpMetricsTarget, QueueMetricExporterHandle};
use crate::emit::otlp_target::Targets;
use crate::emit::otlp_traces::{self, SenderSettings};
use crate::emit::sink::{HealthSpanSink, MetricsSink, Sinks};
use crate::emit::verdict_log::VerdictLog;
use crate::engine::{Engine, EngineConfig};
use crate::evidence::time::Moment;
use crate::flow::memory::MemoryLimiter;
use crate::flow::outgoing::{DiskSpool, Outgoing};
use crate::flow::queue::{self, OnFull, Queue};
use crate::normalize::NormalizedBatch;
use crate::receive::admit::Admission;
use crate::service::error::ServeError;
use crate::service::listeners::{Listeners, Served};
use crate::service::preflight::{self, Prepared};
use crate::service::reload::{SinkSwap, SwappableSink};
use crate::service::status::Status;
use crate::service::tasks::{Ended, Tasks};
use crate::service::{run_engine, Heartbeat};
use crate::state::journal::Journal;

/// The parts built once and kept across reloads: the export queues and their workers, the
/// metrics pipeline, the engine (its chains in flight) and its sinks, what the listeners serve
/// from, and the background samplers.
pub(crate) struct Pipeline {
    pub(crate) served: Served,
    stop_engine: oneshot::Sender<()>,
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    pub(crate) tasks: PipelineTasks,
    /// What each export queue still holds at exit (said in the exit log).
    queue_leftovers: Vec<otlp_traces::Leftover>,
    /// Where the exporter sends (for the loop check of a reload).
    pub(crate) target_urls: Vec<String>,
    verdict_log: SinkSwap,
    /// Set to reopen the running verdict log before its next write.
    reopen: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Every task the pipeline starts, each in one named set by how the drain ends it. A task of any
/// set that ends before the drain is a failure the supervisor names ([`PipelineTasks::ended`]).
#[derive(Default)]
pub(crate) struct PipelineTasks {
    /// The engine: told to stop, then awaited (it decides what is in flight).
    engine: Tasks,
    /// The export queues' workers (and disk writers): they end when the drain closes their queues.
    exports: Tasks,
    /// Samplers that run until the drain stops them.
    background: Tasks,
}

impl PipelineTasks {
    /// The first task of any set to end: its name and how. Never resolves while all run.
    pub(crate) async fn ended(&mut self) -> (String, Ended) {
        tokio::select! {
            e = self.engine.ended() => e,
            e = self.exports.ended() => e,
            e = self.background.ended() => e,
        }
    }
}

impl Pipeline {
    /// Build the pipeline, step by step. Nothing is received yet: the listeners come after it.
    pub(crate) async fn start(cfg: &Config) -> Result<Pipeline, ServeError> {
        let mut tasks = PipelineTasks::default();
        let exporters = Exporters::start(cfg, &mut tasks.exports)?;
        let status = Status::new([exporters.own.as_ref(), exporters.passthrough.as_ref()]);
        let verdict_log = open_verdict_log(cfg)?;
        let pins = load_pins(cfg)?;
        let proc_cfg = &cfg.processors.mcp_health;
        let (ingest_tx, ingest_rx) = queue::bounded("engine_ingest", proc_cfg.queue_size, OnFull::Refuse);
        status.watch_queue(&ingest_tx);
        let memory = memory_limiter(cfg, &exporters.metrics, &mut tasks.background);
        let journal = open_journal(cfg)?;
        let admission = exporters.admission(cfg, ingest_tx, memory.clone(), journal.is_some());
        let (sinks, outputs) = exporters.sinks(cfg, &status, memory.clone(), verdict_log);
        let mut engine_cfg = crate::service::replay::engine_config(cfg);
        // One registry of tool definitions: the receivers fill it, the engine and the gate read it.
        engine_cfg.normalize = admission.normalize.clone();
        engine_cfg.pins = pins.clone();
        open_store(cfg, &mut engine_cfg)?;
        let engine = EngineParts { rx: ingest_rx, sinks, memory, journal, pins };
        let (served, stop_engine) = start_engine(cfg, engine_cfg, engine, admission, status, &outputs, &mut tasks.engine);
        Ok(Pipeline {
            served,
            stop_engine,
            provider: outputs.metrics.provider,
            tasks,
            queue_leftovers: outputs.leftovers,
            target_urls: outputs.target_urls,
            verdict_log: outputs.verdict_log,
            reopen: outputs.reopen,
        })
    }

    pub(crate) fn reopen_verdict_log(&self) {
        if let Some(r) = &self.reopen {
            r.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(crate) fn replace_verdict_log(&mut self, log: Option<VerdictLog>) {
        self.reopen = log.as_ref().map(|l| l.reopen.clone());
        self.verdict_log.replace(log.map(|l| Box::new(l) as Box<dyn crate::emit::sink::Sink>));
    }

    /// Stop the receivers, decide what is in flight and flush the exports, within `limit`.
    pub(crate) async fn drain(self, listeners: &mut Listeners, failed: bool, limit: Duration) {
        let Pipeline { served, stop_engine, provider, tasks, queue_leftovers, .. } = self;
        let PipelineTasks { engine, exports, background } = tasks;
        served.heartbeat.set_draining();
        let finish = async {
            listeners.stop_serving().await;
            // The receivers' handles on the queues go with them: the export workers end once
            // the queues are empty and nobody can add to them.
            drop(served);
            let _ = stop_engine.send(());
            if !failed {
                engine.join().await;
            }
            // The metrics provider first: its last collection goes into the exporter queue, and its
            // exporter then lets go of the queue, so the workers drain it and end.
            let _ = tokio::time::timeout(
                Duration::from_secs(4),
                tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(3))),
            )
            .await;
            exports.join().await;
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

/// The exporters: the two export queues, their workers, and the metrics pipeline that sends into
/// the own queue. The queues' senders are handed on (to the admission and the sinks) and never
/// kept: the workers end at the drain once every sender is gone.
struct Exporters {
    /// mcp-health's own output (health spans, incident records, own metrics).
    own: Option<Queue<Outgoing>>,
    /// What clients sent, passed on.
    passthrough: Option<Queue<Outgoing>>,
    own_spool: Option<Arc<dyn DiskSpool>>,
    passthrough_spool: Option<Arc<dyn DiskSpool>>,
    metrics: MetricsPipeline,
    /// What each exporter's attempts tell, for `/status/health`.
    health: Vec<(&'static str, Arc<ExportHealth>, otlp_traces::Leftover)>,
    leftovers: Vec<otlp_traces::Leftover>,
    target_urls: Vec<String>,
    service_name: String,
    /// A traces target is configured (health spans can go out).
    traces: bool,
    /// `exporters.otlp.passthrough`.
    pass_on: bool,
    /// `exporters.otlp.health_spans`.
    health_spans: bool,
    max_request_bytes: usize,
}

/// What the pipeline keeps of the exporters and sinks once the senders went to their users.
struct Outputs {
    metrics: MetricsPipeline,
    health: Vec<(&'static str, Arc<ExportHealth>, otlp_traces::Leftover)>,
    leftovers: Vec<otlp_traces::Leftover>,
    target_urls: Vec<String>,
    verdict_log: SinkSwap,
    reopen: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Exporters {
    /// Exporter settings (config first, then the standard OTEL_* variables; the same checks
    /// `validate` runs), the two queues, the metrics pipeline and the export workers.
    fn start(cfg: &Config, tasks: &mut Tasks) -> Result<Exporters, ServeError> {
        let service_name = cfg
            .service
            .telemetry
            .service_name
            .clone()
            .or_else(|| preflight::env("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "mcp-health".into());
        let Prepared { otlp, targets } = preflight::prepare(cfg, &preflight::env)?;
        let target_urls: Vec<String> =
            [&targets.traces, &targets.metrics, &targets.logs].into_iter().flatten().map(|t| t.url.clone()).collect();
        for url in &target_urls {
            if let Some(why) = cfg.export_loop(url) {
                return Err(ServeError::ExportLoop(why));
            }
        }
        // Two queues, each with its own workers: pass-through (what clients sent), and mcp-health's
        // own output (health spans, incident records, own metrics). A backend that is slow for one
        // kind, or a stuck request of one, never holds the other up (issue 11: oversize health-span
        // requests used to stall pass-through too).
        let wants_own =
            otlp.as_ref().is_some_and(|o| (o.health_spans && targets.traces.is_some()) || (o.metrics && targets.metrics.is_some()));
        let wants_pass = otlp
            .as_ref()
            .is_some_and(|o| o.passthrough && (targets.traces.is_some() || targets.metrics.is_some() || targets.logs.is_some()));
        let (own, own_rx) = match &otlp {
            Some(o) if wants_own => {
                let (tx, rx) = queue::bounded("otlp", o.sending_queue.capacity(), OnFull::DropCounted);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let (passthrough, pass_rx) = match &otlp {
            Some(o) if wants_pass => {
                let (tx, rx) = queue::bounded("otlp/passthrough", o.sending_queue.capacity(), OnFull::Refuse);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let metrics = build_metrics(cfg, &service_name, otlp.as_ref(), &targets, own.as_ref())?;
        let mut exporters = Exporters {
            own,
            passthrough,
            own_spool: None,
            passthrough_spool: None,
            metrics,
            health: Vec::new(),
            leftovers: Vec::new(),
            target_urls,
            service_name,
            traces: targets.traces.is_some(),
            pass_on: otlp.as_ref().is_some_and(|o| o.passthrough),
            health_spans: otlp.as_ref().is_some_and(|o| o.health_spans),
            max_request_bytes: otlp.as_ref().map_or(crate::config::DEFAULT_MAX_REQUEST_BYTES, |o| o.max_request_bytes),
        };
        if let Some(o) = &otlp {
            exporters.spawn_workers(cfg, o, targets, [own_rx, pass_rx], tasks)?;
        }
        Ok(exporters)
    }

    /// The export workers of each queue, into `tasks`.
    fn spawn_workers(
        &mut self,
        cfg: &Config,
        o: &crate::config::OtlpExporter,
        targets: Targets,
        [own_rx, pass_rx]: [Option<mpsc::Receiver<Outgoing>>; 2],
        tasks: &mut Tasks,
    ) -> Result<(), ServeError> {
        let settings = SenderSettings {
            targets,
            workers: o.sending_queue.num_consumers,
            retry: o.retry_on_failure.clone(),
            max_request_bytes: o.max_request_bytes,
        };
        let meter = crate::emit::metrics::meter(&self.metrics.provider);
        let queues: Vec<_> = [self.own.as_ref(), self.passthrough.as_ref()].into_iter().flatten().collect();
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
        for (name, rx, store) in [("otlp", own_rx, disk(dir.clone())), ("otlp/passthrough", pass_rx, pass_store)] {
            let Some(rx) = rx else { continue };
            let started = otlp_traces::spawn(settings.clone(), rx, self.metrics.meters.clone(), name, store)?;
            if name == "otlp/passthrough" {
                self.passthrough_spool = started.spool.clone();
            } else {
                self.own_spool = started.spool.clone();
            }
            started.leftover.observe(&meter);
            self.health.push((name, started.health.clone(), started.leftover.clone()));
            for (i, w) in started.workers.into_iter().enumerate() {
                tasks.add(format!("{name} exporter task {i}"), w);
            }
            self.leftovers.push(started.leftover);
        }
        Ok(())
    }

    /// What the receivers hand their data to: the engine's queue, and the pass-through queue
    /// when spans are passed on.
    fn admission(&self, cfg: &Config, ingest: Queue<NormalizedBatch>, memory: Option<Arc<MemoryLimiter>>, journaled: bool) -> Admission {
        Admission {
            ingest,
            passthrough: self.passthrough.clone().filter(|_| self.pass_on),
            meters: self.metrics.meters.flow.clone(),
            strip_tool_definitions: cfg.processors.mcp_health.strip_tool_definitions,
            normalize: cfg.processors.mcp_health.normalize_settings(),
            memory,
            refusal_log: crate::receive::admit::refusal_log(),
            journaled,
            passthrough_spool: self.passthrough_spool.clone(),
        }
    }

    /// The engine's sinks: the metrics; the status page's when a health check is configured at
    /// start; health spans when they go out; the verdict log, behind a swappable sink. Takes the
    /// queues' senders with it.
    fn sinks(self, cfg: &Config, status: &Status, memory: Option<Arc<MemoryLimiter>>, log: Option<VerdictLog>) -> (Sinks, Outputs) {
        let meters = self.metrics.meters.clone();
        let mut sinks = Sinks::default();
        sinks.push(MetricsSink::new(meters.clone()));
        // Fed whenever a health check is configured at start, so a reload that switches the page
        // on shows what was decided before it.
        if cfg.extensions.health_check.is_some() {
            sinks.push(status.sink());
        }
        if let Some(q) = self.own.filter(|_| self.traces && self.health_spans) {
            let mut hs = HealthSpanSink::new(q, self.service_name, meters, self.max_request_bytes);
            hs.memory = memory;
            hs.spool = self.own_spool;
            sinks.push(hs);
        }
        let reopen = log.as_ref().map(|l| l.reopen.clone());
        // The verdict log's destination changes live (a reload may move it): the engine holds it
        // through a swappable sink.
        let (log_sink, verdict_log) = SwappableSink::new(log.map(|l| Box::new(l) as Box<dyn crate::emit::sink::Sink>));
        sinks.push(log_sink);
        let outputs = Outputs {
            metrics: self.metrics,
            health: self.health,
            leftovers: self.leftovers,
            target_urls: self.target_urls,
            verdict_log,
            reopen,
        };
        (sinks, outputs)
    }
}

/// The metrics pipeline: Prometheus when its exporter is configured, OTLP through the own queue.
fn build_metrics(
    cfg: &Config,
    service_name: &str,
    otlp: Option<&crate::config::OtlpExporter>,
    targets: &Targets,
    own: Option<&Queue<Outgoing>>,
) -> Result<MetricsPipeline, ServeError> {
    let prom_cfg = cfg.exporters.prometheus.as_ref();
    MetricsPipeline::build(MetricsSettings {
        resource: opentelemetry_sdk::Resource::builder()
            .with_service_name(service_name.to_string())
            // Own metrics come back through a loop like health spans; marked the same way.
            .with_attribute(opentelemetry::KeyValue::new(crate::flow::loops::EMITTER, crate::flow::loops::instance_id()))
            .build(),
        prometheus: prom_cfg.is_some(),
        otlp: match (otlp, own) {
            (Some(o), Some(q)) if o.metrics && targets.metrics.is_some() => {
                Some(OtlpMetricsTarget { exporter: QueueMetricExporterHandle::new(q.clone()), interval: o.metrics_interval })
            }
            _ => None,
        },
        cardinality_limit: prom_cfg.map_or(2000, |p| p.cardinality_limit),
        level: cfg.service.telemetry.metrics.level,
    })
    .map_err(ServeError::from)
}

/// The verdict log, opened (also at a reload that moves it).
pub(crate) fn open_verdict_log(cfg: &Config) -> Result<Option<VerdictLog>, ServeError> {
    match &cfg.exporters.verdict_log {
        Some(v) => Ok(Some(VerdictLog::open(&v.path).map_err(|e| ServeError::VerdictLog(v.path.clone(), e))?)),
        None => Ok(None),
    }
}

/// The lockfile's pinned tool contracts.
fn load_pins(cfg: &Config) -> Result<Option<Arc<Lockfile>>, ServeError> {
    match &cfg.processors.mcp_health.lockfile {
        Some(p) => Ok(Some(Arc::new(crate::config::lockfile::load_lockfile(p).map_err(ServeError::Lockfile)?))),
        None => Ok(None),
    }
}

/// Memory is bounded by default: without `processors.memory_limiter` a limiter still runs, its
/// sampler in `background`.
fn memory_limiter(cfg: &Config, metrics: &MetricsPipeline, background: &mut Tasks) -> Option<Arc<MemoryLimiter>> {
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
    memory_limit.map(|l| {
        let limiter = Arc::new(MemoryLimiter::from_limit(l));
        let every = memory_cfg.map_or(Duration::from_secs(1), |m| m.check_interval);
        background.add("memory limiter's sampler", tokio::spawn(sample_memory(limiter.clone(), every)));
        crate::emit::metrics::observe_memory_limiter(&crate::emit::metrics::meter(&metrics.provider), &limiter);
        limiter
    })
}

/// With a directory of its own, what the receivers acknowledge is written to the evidence
/// journal before the answer, so a crash loses none of it (`state::journal`).
fn open_journal(cfg: &Config) -> Result<Option<Journal>, ServeError> {
    match &cfg.storage {
        Some(crate::config::Storage::Embedded { directory, journal_max_bytes }) => {
            let dir = directory.join("journal");
            let j = Journal::open(&dir, *journal_max_bytes).map_err(|e| ServeError::Journal(dir.display().to_string(), e))?;
            Ok(Some(j))
        }
        _ => Ok(None),
    }
}

/// The state store the configuration asks for, into the engine's configuration. Asked for
/// durable (or shared) state and not getting it is an error at start, not a silent downgrade.
fn open_store(cfg: &Config, engine_cfg: &mut EngineConfig) -> Result<(), ServeError> {
    match &cfg.storage {
        Some(crate::config::Storage::Embedded { directory, .. }) => {
            let store =
                crate::state::StoreHandle::open_directory(directory).map_err(|e| ServeError::Store(directory.display().to_string(), e))?;
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
                // A decided chain is written within its late-span window, then deleted.
                record_life: engine_cfg.chains.late_span_window + Duration::from_secs(60),
            };
            let store = crate::state::StoreHandle::open_redis(settings).map_err(|e| ServeError::Store(shown.clone(), e))?;
            if let Some(p) = state_protocol {
                store.speak(*p);
            }
            let speaks = state_protocol.unwrap_or(crate::state::format::PROTOCOL);
            tracing::info!(endpoint = %shown, state_protocol = speaks, "shared state store (redis) opened");
            engine_cfg.store = Some(store);
            // The store's round trips off the engine's path: answers are taken when they
            // come (polled each step), the engine waiting only past the backstop.
            engine_cfg.store_answer_within = crate::engine::SHARED_STORE_ANSWER_WITHIN;
        }
        None => {}
    }
    // What 0.1.0 stored is read as this configuration's receipt policy says.
    if let Some(store) = &engine_cfg.store {
        store.set_read_policy(crate::state::ReadPolicy { receipt_keys_trusted: cfg.processors.mcp_health.receipts.keys().is_some() });
    }
    Ok(())
}

/// What the engine's task is started with.
struct EngineParts {
    rx: mpsc::Receiver<NormalizedBatch>,
    sinks: Sinks,
    memory: Option<Arc<MemoryLimiter>>,
    journal: Option<Journal>,
    pins: Option<Arc<Lockfile>>,
}

/// The engine on its own task (in `tasks`), and what the listeners serve from: the admission,
/// the metrics, the heartbeat, the gate, the status page and the components' health.
fn start_engine(
    cfg: &Config,
    engine_cfg: EngineConfig,
    parts: EngineParts,
    admission: Admission,
    status: Status,
    outputs: &Outputs,
    tasks: &mut Tasks,
) -> (Served, oneshot::Sender<()>) {
    let EngineParts { rx, sinks, memory, journal, pins } = parts;
    let tick = (cfg.processors.mcp_health.decision_wait / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let (stop_tx, stop_rx) = oneshot::channel();
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
    for (name, h, queue) in &outputs.health {
        components = components.with_exporter(name, h.clone(), queue.clone());
    }
    let hb = heartbeat.clone();
    let gate = crate::gate::GateState {
        pins,
        board: engine.board(),
        definitions: engine.definitions(),
        unpinned: Default::default(),
        store_down: Some(Arc::new(move || hb.is_store_down())),
        shared,
    };
    // The engine steps at least every tick; silent for much longer than that, it is stuck.
    let stall_after = (tick * 40).max(Duration::from_secs(10));
    tasks.add("engine", tokio::spawn(run_engine(rx, engine, sinks, tick, stop_rx, heartbeat.clone(), memory, journal)));
    let metrics = &outputs.metrics;
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
    (served, stop_tx)
}

/// Sample the process's memory for the memory limiter; log each crossing of the soft limit.
async fn sample_memory(limiter: Arc<MemoryLimiter>, every: Duration) {
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

    /// The supervisor names the part that ended, whichever set it is in, as it always has: "the
    /// engine stopped" for the engine, "the otlp exporter task 1 panicked" for a worker.
    #[tokio::test]
    async fn the_first_task_of_any_set_to_end_is_named() {
        let mut tasks = PipelineTasks::default();
        tasks.background.add("memory limiter's sampler", tokio::spawn(std::future::pending()));
        tasks.exports.add("otlp exporter task 0", tokio::spawn(std::future::pending()));
        let (tx, rx) = oneshot::channel::<()>();
        tasks.engine.add(
            "engine",
            tokio::spawn(async move {
                let _ = rx.await;
            }),
        );
        tx.send(()).expect("the engine waits");
        let (name, how) = tasks.ended().await;
        assert_eq!(format!("the {name} {}", how.as_str()), "the engine stopped");
        tasks.exports.add("otlp exporter task 1", tokio::spawn(async { panic!("a bug in the worker") }));
        let (name, how) = tasks.ended().await;
        assert_eq!(format!("the {name} {}", how.as_str()), "the otlp exporter task 1 panicked");
        std::mem::take(&mut tasks.exports).abort();
        std::mem::take(&mut tasks.background).abort();
    }
}
