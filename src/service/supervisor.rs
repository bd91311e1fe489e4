//! The running service: a [`Supervisor`] over a few long-lived parts — the [`Pipeline`] (export
//! queues and workers, metrics, the engine and its sinks), the [`Listeners`] and the signals.
//! Binds every listener before the pipeline starts (so a port conflict fails at once with the
//! address named, having done nothing), then runs until SIGTERM or Ctrl-C, decides what is in
//! flight, flushes exports and exits within `service.telemetry.shutdown_timeout`. SIGHUP
//! reconciles the running parts with the configuration file without closing anything that did
//! not change (the engine and its calls in flight always survive); SIGTERM, at any moment,
//! drains.

use std::time::Duration;

use crate::config::Config;
use crate::evidence::time::Moment;
use crate::receive::listen;
use crate::service::error::ServeError;
use crate::service::listeners::Listeners;
use crate::service::pipeline::{self, Pipeline};
use crate::service::reload;
use crate::service::signals::{shutdown_signal, Hangups};

/// Where the running configuration came from, so SIGHUP reads the same thing again.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConfigSource {
    /// The file (`None`: the embedded default).
    pub(crate) path: Option<String>,
    /// The `--set` overrides.
    pub(crate) sets: Vec<String>,
}

/// Run the service on its own runtime until a drain signal (or a part of it fails). Log
/// settings and the worker threads are read here, once: a SIGHUP reload keeps them.
pub(crate) fn run(cfg: Config, source: ConfigSource) -> Result<(), ServeError> {
    init_logs(&cfg.service.telemetry.logs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads())
        .enable_all()
        .thread_name("mcp-health")
        .on_thread_park(crate::flow::memory::on_thread_idle)
        .build()
        .map_err(ServeError::Runtime)?;
    // The signal handlers are installed before anything else, so a SIGTERM at any moment (while
    // the state store opens, while the listeners bind, during a reload) drains and exits rather
    // than being lost or killing the process with chains in flight.
    let stop = {
        let _in_runtime = rt.enter();
        shutdown_signal()
    };
    let r = rt.block_on(serve(cfg, source, stop));
    // A task still stuck (an engine that never yields) must not hold the process past its
    // shutdown timeout: the runtime is left behind, not joined.
    rt.shutdown_background();
    r
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

/// Run the service until `shutdown` resolves (or a part of it fails), reloading the
/// configuration on SIGHUP without closing anything that did not change.
async fn serve(cfg: Config, source: ConfigSource, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ServeError> {
    tokio::pin!(shutdown);
    let hangups = Hangups::install();
    // Bind everything before starting anything: a port conflict fails at once with the address
    // named, and a start that fails so has done nothing — sent nothing from the sending queue on
    // disk, replayed no journal, decided nothing — that the next start would do again.
    // Certificates are read here, and again at every SIGHUP (and `tls.reload_interval`). Until
    // the pipeline has started the sockets accept nothing: connections wait in their backlog.
    check_open_file_limit(&cfg);
    let mut listeners = Listeners::default();
    let plan = listeners.prepare(&cfg).await.map_err(ServeError::from)?;
    // A SIGTERM while the pipeline starts (a state store that takes its time to answer) exits
    // at once: nothing was received yet, so nothing is left to decide.
    let pipeline = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        p = Pipeline::start(&cfg) => p?,
    };
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
                (name, how) = self.pipeline.tasks.ended() => return End::Failed(format!("the {name} {}", how.as_str())),
                name = self.listeners.ended() => return End::Failed(format!("the {name} listener stopped")),
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
            match pipeline::open_verdict_log(&next) {
                Ok(opened) => Some(opened),
                Err(e) => {
                    tracing::error!(error = %e, "{kept}");
                    return;
                }
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
