//! What a SIGHUP reload may change in a running service, and the one sink it swaps.
//!
//! The engine and its chains in flight outlive every reload (a reload never decides a call
//! early), and so do the export queues, the metrics pipeline and the runtime. The settings those
//! were built from therefore apply from the next start: a reload keeps their running values and
//! names each changed one in the log ([`restart_only`]). Everything else — the listeners (see
//! [`super::listeners`]), the verdict log's destination and the shutdown timeout — changes live.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::emit::sink::Sink;
use crate::engine::{Decided, Gauges};
use crate::evidence::time::Moment;

/// Push `name` when `a != b`.
macro_rules! changed {
    ($out:ident, $old:expr, $new:expr, $prefix:literal: $($field:ident $(as $key:literal)?),+ $(,)?) => {{
        let before = $out.len();
        $(
            if $old.$field != $new.$field {
                $out.push(concat!($prefix, ".", changed!(@key $field $($key)?)).to_string());
            }
        )+
        // A field added later and not listed here still shows, by its section.
        if $out.len() == before && $old != $new {
            $out.push($prefix.to_string());
        }
    }};
    (@key $field:ident $key:literal) => { $key };
    (@key $field:ident) => { stringify!($field) };
}

/// The settings that differ between `old` and `new` and that only a restart applies, by their
/// configuration keys (`processors.mcp_health.decision_wait`, `exporters.otlp.headers`, …). Keys
/// only: never a value (headers and endpoints may carry credentials).
pub(crate) fn restart_only(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let (o, n) = (&old.processors.mcp_health, &new.processors.mcp_health);
    if o != n {
        changed!(out, o, n, "processors.mcp_health":
            decision_wait, max_wait, max_chains, max_bytes, max_spans_per_chain, late_span_window, max_decided,
            queue_size, max_sessions, session_idle_expiry, refresh_policy, progress, lockfile,
            strip_tool_definitions, partial_before_start, state_limits as "limits", receipts);
    }
    if old.processors.memory_limiter != new.processors.memory_limiter {
        out.push("processors.memory_limiter".into());
    }
    match (&old.exporters.otlp, &new.exporters.otlp) {
        (Some(o), Some(n)) if o != n => changed!(out, o, n, "exporters.otlp":
            endpoint, metrics_endpoint, headers, timeout, compression, protocol, tls, passthrough, health_spans,
            metrics, metrics_interval, sending_queue, retry_on_failure, max_request_bytes),
        (o, n) if o.is_some() != n.is_some() => out.push("exporters.otlp".into()),
        _ => {}
    }
    match (&old.exporters.prometheus, &new.exporters.prometheus) {
        (Some(o), Some(n)) if o.cardinality_limit != n.cardinality_limit => out.push("exporters.prometheus.cardinality_limit".into()),
        (o, n) if o.is_some() != n.is_some() => out.push("exporters.prometheus".into()),
        _ => {}
    }
    if old.storage != new.storage {
        out.push("storage".into());
    }
    if old.service.runtime != new.service.runtime {
        out.push("service.runtime.worker_threads".into());
    }
    if old.service.telemetry.logs != new.service.telemetry.logs {
        out.push("service.telemetry.logs".into());
    }
    if old.service.telemetry.service_name != new.service.telemetry.service_name {
        out.push("service.telemetry.service_name".into());
    }
    out
}

/// The configuration that runs after reloading `new` over `old`: `new`, with every setting of
/// [`restart_only`] at its running value. The next reload compares against this, so a change
/// still waiting for a restart is named again.
pub(crate) fn effective(old: &Config, new: &Config) -> Config {
    let mut e = new.clone();
    e.processors = old.processors.clone();
    e.exporters.otlp = old.exporters.otlp.clone();
    match (&old.exporters.prometheus, &mut e.exporters.prometheus) {
        (Some(o), Some(n)) => n.cardinality_limit = o.cardinality_limit,
        (o, n) => *n = o.clone(),
    }
    e.storage = old.storage.clone();
    e.service.runtime = old.service.runtime.clone();
    e.service.telemetry.logs = old.service.telemetry.logs.clone();
    e.service.telemetry.service_name = old.service.telemetry.service_name.clone();
    e
}

type Pending = Arc<Mutex<Option<Option<Box<dyn Sink>>>>>;

/// A sink the engine holds whose destination a reload can replace (the verdict log: another
/// file, stdout, or none). The replacement is taken at the engine's next step; the one it
/// replaces is flushed first, so no record is lost or written twice.
pub(crate) struct SwappableSink {
    current: Option<Box<dyn Sink>>,
    flag: Arc<AtomicBool>,
    pending: Pending,
}

/// Where a reload hands the replacement of a [`SwappableSink`].
#[derive(Clone)]
pub(crate) struct SinkSwap {
    flag: Arc<AtomicBool>,
    pending: Pending,
}

impl SwappableSink {
    pub(crate) fn new(current: Option<Box<dyn Sink>>) -> (SwappableSink, SinkSwap) {
        let (flag, pending): (Arc<AtomicBool>, Pending) = Default::default();
        (SwappableSink { current, flag: flag.clone(), pending: pending.clone() }, SinkSwap { flag, pending })
    }

    fn take_replacement(&mut self) {
        if !self.flag.swap(false, Ordering::Acquire) {
            return;
        }
        let next = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(next) = next {
            if let Some(old) = &mut self.current {
                old.flush();
            }
            self.current = next;
        }
    }
}

impl SinkSwap {
    /// Replace the sink (`None`: no sink) from the engine's next step on.
    pub(crate) fn replace(&self, next: Option<Box<dyn Sink>>) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(next);
        self.flag.store(true, Ordering::Release);
    }
}

impl Sink for SwappableSink {
    fn accept(&mut self, records: &[Decided], now: Moment) {
        self.take_replacement();
        if let Some(s) = &mut self.current {
            s.accept(records, now);
        }
    }
    fn report(&mut self, gauges: &Gauges) {
        self.take_replacement();
        if let Some(s) = &mut self.current {
            s.report(gauges);
        }
    }
    fn flush(&mut self) {
        self.take_replacement();
        if let Some(s) = &mut self.current {
            s.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        Config::load_with(None, &extra.split_whitespace().map(str::to_string).collect::<Vec<_>>()).expect("config")
    }

    #[test]
    fn engine_and_exporter_settings_are_named_and_kept() {
        let old = cfg("");
        let new = cfg(
            "processors.mcp_health.decision_wait=7s processors.mcp_health.limits.gate_board=5 extensions.health_check.endpoint=127.0.0.1:1",
        );
        let names = restart_only(&old, &new);
        assert!(names.contains(&"processors.mcp_health.decision_wait".to_string()), "{names:?}");
        assert!(names.contains(&"processors.mcp_health.limits".to_string()), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with("extensions")), "listeners change live: {names:?}");
        let e = effective(&old, &new);
        assert_eq!(e.processors, old.processors);
        assert_eq!(e.extensions, new.extensions);
        assert!(restart_only(&e, &new).len() == names.len(), "still pending, named again");
        assert!(restart_only(&old, &old).is_empty());
    }

    #[derive(Clone, Default)]
    struct Count(Arc<Mutex<(usize, usize)>>);
    impl Sink for Count {
        fn accept(&mut self, r: &[Decided], _: Moment) {
            self.0.lock().unwrap().0 += r.len().max(1);
        }
        fn flush(&mut self) {
            self.0.lock().unwrap().1 += 1;
        }
    }

    #[test]
    fn a_swapped_sink_is_flushed_before_the_next_takes_over() {
        let (a, b) = (Count::default(), Count::default());
        let (mut s, swap) = SwappableSink::new(Some(Box::new(a.clone())));
        s.accept(&[], Moment::wall_now());
        swap.replace(Some(Box::new(b.clone())));
        s.accept(&[], Moment::wall_now());
        assert_eq!(*a.0.lock().unwrap(), (1, 1), "the old sink took one step and was flushed");
        assert_eq!(b.0.lock().unwrap().0, 1, "the new one took the next");
        swap.replace(None);
        s.accept(&[], Moment::wall_now());
        assert_eq!(b.0.lock().unwrap().0, 1);
    }
}
