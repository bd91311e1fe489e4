//! Component health (`/status/health` on the health-check listener), in the spirit of the
//! collector's `healthcheckv2` extension: one status per component — each OTLP receiver, the
//! engine (`processor:mcp_health`), each exporter and its on-disk sending queue, the state store
//! — and an overall verdict, so a backend that has refused every export for minutes shows while
//! `/` (liveness) stays green.
//!
//! Components are named by their configuration name (`exporter:otlp`, `storage:redis`), never by
//! an endpoint: exporter URLs and Redis URLs may carry credentials, and errors are fixed
//! sentences with durations, never a backend's error text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::emit::export_health::ExportHealth;
use crate::emit::otlp_traces::Leftover;
use crate::evidence::time::Moment;
use crate::flow::queue::DepthGauge;
use crate::normalize::NormalizedBatch;
use crate::service::health::{Health, Heartbeat};

/// A component's status, named as the collector's `componentstatus` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) enum ComponentStatus {
    #[serde(rename = "StatusOK")]
    Ok,
    /// The service is shutting down.
    #[serde(rename = "StatusStopping")]
    Stopping,
    /// Failing, and may recover by itself (a backend down, a store unreachable, a stalled engine).
    #[serde(rename = "StatusRecoverableError")]
    RecoverableError,
    /// Ended, and will not come back without a restart (the engine task, a receiver's server).
    #[serde(rename = "StatusPermanentError")]
    PermanentError,
}

/// The state store in use, named as `storage.kind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StoreKind {
    Embedded,
    Redis,
}

impl StoreKind {
    fn component(self) -> &'static str {
        match self {
            StoreKind::Embedded => "storage:embedded",
            StoreKind::Redis => "storage:redis",
        }
    }
}

/// One component's health.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ComponentHealth {
    pub healthy: bool,
    pub status: ComponentStatus,
    /// When the component entered this status, where that is known (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339_opt")]
    pub status_time: Option<Moment>,
    /// Why it is not OK: a fixed sentence (never a backend's words, which may quote a URL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Exporters: the last attempt the backend accepted.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339_opt")]
    pub last_success: Option<Moment>,
    /// Exporters: the last attempt that failed.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339_opt")]
    pub last_failure: Option<Moment>,
    /// The engine: batches waiting in its queue; a sending queue on disk: bytes held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued: Option<u64>,
    /// A sending queue on disk: its bound in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
}

impl ComponentHealth {
    fn ok(since: Option<Moment>) -> ComponentHealth {
        ComponentHealth {
            healthy: true,
            status: ComponentStatus::Ok,
            status_time: since,
            error: None,
            last_success: None,
            last_failure: None,
            queued: None,
            capacity: None,
        }
    }

    fn failing(status: ComponentStatus, healthy: bool, since: Option<Moment>, error: String) -> ComponentHealth {
        ComponentHealth { healthy, status, error: Some(error), ..ComponentHealth::ok(since) }
    }
}

/// The whole report: `healthy` when every component is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    pub healthy: bool,
    /// The worst status among the components.
    pub status: ComponentStatus,
    #[serde(serialize_with = "rfc3339")]
    pub status_time: Moment,
    #[serde(serialize_with = "rfc3339")]
    pub start_time: Moment,
    pub components: BTreeMap<&'static str, ComponentHealth>,
}

impl Report {
    /// The names of the unhealthy components, for `/` when it follows them.
    pub(crate) fn unhealthy(&self) -> Vec<&'static str> {
        self.components.iter().filter(|(_, c)| !c.healthy).map(|(n, _)| *n).collect()
    }
}

fn rfc3339<S: serde::Serializer>(m: &Moment, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_nanos(m.as_nanos())))
}

fn rfc3339_opt<S: serde::Serializer>(m: &Option<Moment>, s: S) -> Result<S::Ok, S::Error> {
    match m {
        Some(m) => rfc3339(m, s),
        None => s.serialize_none(),
    }
}

/// When each component is judged unhealthy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Thresholds {
    /// The engine is stalled when it has not stepped for longer.
    pub stall_after: Duration,
    /// An exporter whose every attempt has failed for longer is unhealthy; a sending queue that
    /// refused a request for lack of room this recently is too
    /// (`extensions.health_check.exporter_failure_threshold`).
    pub exporter_failure: Duration,
}

/// Sets a receiver's flag down when its server task ends (however it ends).
pub(crate) struct Listening(Arc<AtomicBool>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// What the component health reads: built with the pipeline, shared by every generation of the
/// health-check listener.
pub(crate) struct Components {
    heartbeat: Arc<Heartbeat>,
    started: Moment,
    engine_queue: Option<DepthGauge<NormalizedBatch>>,
    store: Option<StoreKind>,
    /// By exporter name (`otlp`, `otlp/passthrough`).
    exporters: Vec<(&'static str, Arc<ExportHealth>)>,
    queues: Vec<Leftover>,
    /// The receivers serving now, by listener name, with when each server started; each flag is
    /// down once its server ended.
    receivers: Mutex<BTreeMap<&'static str, (Arc<AtomicBool>, Moment)>>,
}

impl Components {
    pub(crate) fn new(heartbeat: Arc<Heartbeat>, started: Moment) -> Components {
        Components {
            heartbeat,
            started,
            engine_queue: None,
            store: None,
            exporters: Vec::new(),
            queues: Vec::new(),
            receivers: Mutex::default(),
        }
    }

    pub(crate) fn with_engine_queue(mut self, q: DepthGauge<NormalizedBatch>) -> Self {
        self.engine_queue = Some(q);
        self
    }

    pub(crate) fn with_store(mut self, kind: Option<StoreKind>) -> Self {
        self.store = kind;
        self
    }

    pub(crate) fn with_exporter(mut self, name: &'static str, h: Arc<ExportHealth>, queue: Leftover) -> Self {
        self.exporters.push((name, h));
        self.queues.push(queue);
        self
    }

    /// A receiver's server starts: its flag is up until the returned guard is dropped (held by
    /// its task). A server replacing one of the same name takes its place.
    pub(crate) fn listening(&self, name: &'static str) -> Listening {
        let flag = Arc::new(AtomicBool::new(true));
        self.receivers.lock().unwrap_or_else(|p| p.into_inner()).insert(name, (flag.clone(), Moment::wall_now()));
        Listening(flag)
    }

    /// A receiver was removed from the configuration.
    pub(crate) fn forget(&self, name: &'static str) {
        self.receivers.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// The components' health at `now`.
    pub(crate) fn report(&self, now: Moment, t: Thresholds) -> Report {
        let mut components = BTreeMap::new();
        let engine = self.heartbeat.health(now, t.stall_after);
        let draining = engine == Health::Draining;
        for (name, (up, since)) in self.receivers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let c = if draining {
                ComponentHealth::failing(ComponentStatus::Stopping, false, None, "the service is shutting down".into())
            } else if up.load(Ordering::SeqCst) {
                ComponentHealth::ok(Some(*since))
            } else {
                ComponentHealth::failing(ComponentStatus::PermanentError, false, None, "the receiver's server ended".into())
            };
            components.insert(receiver_component(name), c);
        }
        components.insert("processor:mcp_health", self.engine(engine, now, t.stall_after));
        if let Some(kind) = self.store {
            let c = match self.heartbeat.store_down_since() {
                Some(since) => ComponentHealth::failing(
                    ComponentStatus::RecoverableError,
                    false,
                    Some(since),
                    format!(
                        "the state store's operations have failed for {}s: verdicts are capped at unverified (store_unavailable)",
                        now.saturating_duration_since(since).as_secs()
                    ),
                ),
                None => ComponentHealth::ok(None),
            };
            components.insert(kind.component(), c);
        }
        for (name, h) in &self.exporters {
            components.insert(exporter_component(name), exporter(h, now, t.exporter_failure));
        }
        for q in &self.queues {
            if let Some(c) = disk_queue(q, now, t.exporter_failure) {
                components.insert(queue_component(q.name()), c);
            }
        }
        let healthy = components.values().all(|c| c.healthy);
        let status = components.values().map(|c| c.status).max().unwrap_or(ComponentStatus::Ok);
        Report { healthy, status, status_time: now, start_time: self.started, components }
    }

    fn engine(&self, engine: Health, now: Moment, stall_after: Duration) -> ComponentHealth {
        let last = self.heartbeat.last_beat();
        let mut c = match engine {
            Health::Available | Health::Degraded => ComponentHealth::ok(Some(last)),
            Health::Stuck => ComponentHealth::failing(
                ComponentStatus::RecoverableError,
                false,
                Some(last),
                format!(
                    "the engine has not stepped for {}s (limit {}s)",
                    now.saturating_duration_since(last).as_secs(),
                    stall_after.as_secs()
                ),
            ),
            Health::Stopped => ComponentHealth::failing(ComponentStatus::PermanentError, false, None, "the engine task ended".into()),
            Health::Draining => ComponentHealth::failing(ComponentStatus::Stopping, false, None, "the service is shutting down".into()),
        };
        c.queued = self.engine_queue.as_ref().and_then(|q| q.depth()).map(|d| d as u64);
        c
    }
}

/// `receiver:otlp/grpc` for the listener `otlp_grpc`.
fn receiver_component(listener: &str) -> &'static str {
    match listener {
        "otlp_grpc" => "receiver:otlp/grpc",
        "otlp_http" => "receiver:otlp/http",
        _ => "receiver:other",
    }
}

fn exporter_component(name: &str) -> &'static str {
    match name {
        "otlp" => "exporter:otlp",
        "otlp/passthrough" => "exporter:otlp/passthrough",
        _ => "exporter:other",
    }
}

fn queue_component(name: &str) -> &'static str {
    match name {
        "otlp" => "exporter:otlp/sending_queue",
        "otlp/passthrough" => "exporter:otlp/passthrough/sending_queue",
        _ => "exporter:other/sending_queue",
    }
}

/// An exporter failing for less than `threshold` is a recoverable error that still counts as
/// healthy (the collector's `recovery_duration`): one refused request is not an outage.
fn exporter(h: &ExportHealth, now: Moment, threshold: Duration) -> ComponentHealth {
    let s = h.state();
    let mut c = match s.failing_since {
        Some(since) => {
            let for_ = now.saturating_duration_since(since);
            ComponentHealth::failing(
                ComponentStatus::RecoverableError,
                for_ <= threshold,
                Some(since),
                format!("every export attempt has failed for {}s (threshold {}s)", for_.as_secs(), threshold.as_secs()),
            )
        }
        None => ComponentHealth::ok(s.last_success),
    };
    c.last_success = s.last_success;
    c.last_failure = s.last_failure;
    c
}

/// A sending queue on disk is unhealthy while it is full, and for `threshold` after it last
/// refused a request for lack of room (what it refuses is dropped and counted).
fn disk_queue(q: &Leftover, now: Moment, threshold: Duration) -> Option<ComponentHealth> {
    let fill = q.disk_fill()?;
    let recent = fill.last_full.filter(|at| now.saturating_duration_since(*at) <= threshold);
    let mut c = if recent.is_some() || fill.bytes >= fill.limit {
        ComponentHealth::failing(
            ComponentStatus::RecoverableError,
            false,
            recent,
            "the sending queue on disk is full: requests are dropped (counted as enqueue_failed)".into(),
        )
    } else {
        ComponentHealth::ok(None)
    };
    c.queued = Some(fill.bytes);
    c.capacity = Some(fill.limit);
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Moment {
        Moment::from_nanos(1_700_000_000_000_000_000)
    }

    fn th() -> Thresholds {
        Thresholds { stall_after: Duration::from_secs(10), exporter_failure: Duration::from_secs(30) }
    }

    #[test]
    fn an_exporter_turns_unhealthy_past_the_threshold_and_back_on_success() {
        let hb = Heartbeat::new(t0());
        let h = Arc::new(ExportHealth::default());
        let mut c = Components::new(hb.clone(), t0());
        c.exporters.push(("otlp", h.clone()));
        let at = |s: u64| t0() + Duration::from_secs(s);
        let r = c.report(at(1), th());
        assert!(r.healthy);
        assert_eq!(r.components["exporter:otlp"].status, ComponentStatus::Ok, "nothing tried yet");
        h.failed(at(2));
        hb.beat(at(20));
        let r = c.report(at(20), th());
        let e = &r.components["exporter:otlp"];
        assert_eq!((e.status, e.healthy), (ComponentStatus::RecoverableError, true), "failing for 18s, threshold 30s");
        assert!(r.healthy);
        hb.beat(at(33));
        let r = c.report(at(33), th());
        let e = &r.components["exporter:otlp"];
        assert_eq!((e.status, e.healthy), (ComponentStatus::RecoverableError, false), "failing for 31s");
        assert!(!r.healthy);
        assert_eq!(r.status, ComponentStatus::RecoverableError);
        assert_eq!(r.unhealthy(), vec!["exporter:otlp"]);
        assert_eq!(e.status_time, Some(at(2)), "since the first failure");
        h.succeeded(at(34));
        let r = c.report(at(34), th());
        assert!(r.healthy && r.components["exporter:otlp"].status == ComponentStatus::Ok);
    }

    /// The engine stall, on a manual clock: no beat for longer than `stall_after` (as a blocked
    /// sink write leaves it) is a recoverable error naming how long; a beat clears it.
    #[test]
    fn a_silent_engine_is_stalled_and_a_dead_one_permanently_failed() {
        let hb = Heartbeat::new(t0());
        let c = Components::new(hb.clone(), t0());
        let at = |s: u64| t0() + Duration::from_secs(s);
        assert!(c.report(at(9), th()).healthy);
        let r = c.report(at(12), th());
        let e = &r.components["processor:mcp_health"];
        assert_eq!((e.status, e.healthy), (ComponentStatus::RecoverableError, false));
        assert!(e.error.as_deref().unwrap().contains("not stepped for 12s"), "{e:?}");
        hb.beat(at(12));
        assert!(c.report(at(13), th()).healthy);
        drop(hb.guard());
        let r = c.report(at(13), th());
        assert_eq!(r.components["processor:mcp_health"].status, ComponentStatus::PermanentError);
        assert_eq!(r.status, ComponentStatus::PermanentError);
    }

    #[test]
    fn a_store_down_a_receiver_ended_and_a_drain_show() {
        let hb = Heartbeat::new(t0());
        let c = Components::new(hb.clone(), t0()).with_store(Some(StoreKind::Redis));
        let grpc = c.listening("otlp_grpc");
        let _http = c.listening("otlp_http");
        let r = c.report(t0(), th());
        assert!(r.healthy, "{r:?}");
        assert_eq!(
            r.components.keys().copied().collect::<Vec<_>>(),
            ["processor:mcp_health", "receiver:otlp/grpc", "receiver:otlp/http", "storage:redis"]
        );
        hb.set_store_down_at(true, t0());
        hb.set_store_down_at(true, t0() + Duration::from_secs(3));
        let r = c.report(t0() + Duration::from_secs(5), th());
        let s = &r.components["storage:redis"];
        assert_eq!((s.status, s.healthy, s.status_time), (ComponentStatus::RecoverableError, false, Some(t0())));
        hb.set_store_down_at(false, t0());
        drop(grpc);
        let r = c.report(t0(), th());
        assert_eq!(r.unhealthy(), vec!["receiver:otlp/grpc"]);
        // A replacement server on the same name takes the place of the one that ended.
        let _grpc = c.listening("otlp_grpc");
        assert!(c.report(t0(), th()).healthy);
        hb.set_draining();
        let r = c.report(t0(), th());
        assert_eq!(r.components["receiver:otlp/http"].status, ComponentStatus::Stopping);
        assert!(!r.healthy);
    }

    #[test]
    fn the_json_has_the_collectors_shape_and_no_endpoint() {
        let hb = Heartbeat::new(t0());
        let h = Arc::new(ExportHealth::default());
        let mut c = Components::new(hb, t0()).with_store(Some(StoreKind::Redis));
        c.exporters.push(("otlp/passthrough", h.clone()));
        h.failed(t0());
        let v = serde_json::to_value(c.report(t0() + Duration::from_secs(31), th())).unwrap();
        assert_eq!(v["healthy"], false);
        assert_eq!(v["status"], "StatusRecoverableError");
        assert!(v["status_time"].as_str().unwrap().starts_with("2023-11-14T22:1"), "{v}");
        let e = &v["components"]["exporter:otlp/passthrough"];
        assert_eq!(e["status"], "StatusRecoverableError");
        assert_eq!(e["healthy"], false);
        assert!(e.get("last_success").is_none());
        assert_eq!(v["components"]["storage:redis"]["status"], "StatusOK");
    }
}
