//! Every instrument mcp-health records, declared once: name, kind, unit, labels, description and
//! the telemetry level it belongs to.
//!
//! The meters in `emit::metrics` are built from these declarations (never from a literal of their
//! own), the Prometheus names come from them by the OpenTelemetry compatibility rules
//! (`emit::prometheus::names`), and the metrics reference, docs/metrics.md, is generated from them
//! (`emit::reference`): a test fails when the file and this table disagree, so the reference
//! cannot drift. Plain names, not links: this module sits under the exporter and knows nothing of
//! it.
//!
//! Units are OpenTelemetry (UCUM) units, so that the scrape endpoint and a collector translating
//! the OTLP output give one Prometheus name: `s` and `By` become `_seconds` and `_bytes`; counts
//! carry an annotation (`{call}`), which translation drops.

use serde::Deserialize;

/// The collector's metrics levels. They choose among the service's internal instruments (how its
/// receivers, exporters, queues and process do); the verdict and incident metrics, which are what
/// the service is for, are served at every level. The level of each instrument is
/// declared below (and in docs/metrics.md). `service.telemetry.metrics.level` in the
/// configuration.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MetricsLevel {
    /// No internal metrics.
    None,
    /// What says whether the service works: intake, export, queues, the process.
    Basic,
    /// Also the engine's bounds, losses and connections (the collector's default).
    #[default]
    Normal,
    /// Also the counters that only help a deep dig (requests beside items, open connections).
    Detailed,
}

impl MetricsLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsLevel::None => "none",
            MetricsLevel::Basic => "basic",
            MetricsLevel::Normal => "normal",
            MetricsLevel::Detailed => "detailed",
        }
    }
}

/// What an instrument aggregates into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic sum (`Counter`, `ObservableCounter`): `_total` in Prometheus.
    Counter,
    /// A last value (`Gauge`, `ObservableGauge`).
    Gauge,
    /// Explicit-bucket histogram: `_bucket`, `_sum`, `_count` in Prometheus.
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Which `service.telemetry.metrics.level` serves an instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// What the service is for (verdicts, incidents, catalog, verifiers): served at every level,
    /// `none` included; the level is about the service's own telemetry only.
    Output,
    /// The service's internal telemetry, served from this level up.
    Internal(MetricsLevel),
}

impl Tier {
    /// Whether `level` serves this tier.
    pub fn served_at(self, level: MetricsLevel) -> bool {
        match self {
            Tier::Output => true,
            Tier::Internal(min) => level >= min,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Output => "always",
            Tier::Internal(l) => l.as_str(),
        }
    }
}

/// One instrument's declaration.
#[derive(Clone, Copy, Debug)]
pub struct Instrument {
    /// OpenTelemetry name (what OTLP carries).
    pub name: &'static str,
    pub kind: Kind,
    /// OpenTelemetry unit: `s`, `By`, `1`, or an annotation such as `{call}`.
    pub unit: &'static str,
    /// Attribute keys, as OTLP carries them (Prometheus labels replace `.` by `_`).
    pub labels: &'static [&'static str],
    pub description: &'static str,
    pub tier: Tier,
}

use Kind::{Counter, Gauge, Histogram};
use MetricsLevel::{Basic, Detailed, Normal};
use Tier::{Internal, Output};

const CALL: &[&str] = &["mcp.method.name", "gen_ai.tool.name", "server.address"];

macro_rules! instruments {
    ($($id:ident = $name:literal, $kind:expr, $unit:literal, [$($l:expr),* $(,)?], $tier:expr, $desc:expr;)*) => {
        $(pub(crate) const $id: Instrument = Instrument { name: $name, kind: $kind, unit: $unit, labels: &[$($l),*], description: $desc, tier: $tier };)*
        /// Every instrument, in the order of the reference.
        pub const ALL: &[Instrument] = &[$($id),*];
    };
}

instruments! {
    // ---- Verdicts: what the service is for --------------------------------------------------
    VERDICTS = "mcp_health.verdicts", Counter, "{verdict}", [CALL[0], CALL[1], CALL[2], "state", "first_failed_layer"], Output,
        "Decided call verdicts (revisions included) by health state, first failed layer, method, tool and server";
    CALLS = "mcp_health.calls", Counter, "{call}", [CALL[0], CALL[1], CALL[2]], Output,
        "Decided attempts: each logical tools/call (its rounds are one) and each failed session setup (initialize, server/discover); the denominator of both success rates";
    CALLS_PROTOCOL_SUCCESS = "mcp_health.calls.protocol_success", Counter, "{call}", [CALL[0], CALL[1], CALL[2]], Output,
        "Calls whose JSON-RPC exchange completed (transport, protocol and authorization passed)";
    CALLS_VERIFIED_SUCCESS = "mcp_health.calls.verified_success", Counter, "{call}", [CALL[0], CALL[1], CALL[2]], Output,
        "Calls whose outcome a verifier confirmed";
    CALLS_UNCONFIRMED = "mcp_health.calls.unconfirmed", Counter, "{call}", [CALL[0], CALL[1], CALL[2]], Output,
        "Attempts decided with no span showing them answered or failed (the mcp SDK's client span alone, a setup nobody answered): neither a protocol success nor a failure, shown beside the rates (a revision that later shows the answer counts in protocol_success, not here)";
    CALLS_SUCCESS_RETRACTED = "mcp_health.calls.success_retracted", Counter, "{call}", [CALL[0], CALL[1], CALL[2], "kind"], Output,
        "Successes counted earlier that a revised verdict withdrew, by kind (protocol, verified)";
    CALLS_WORKING = "mcp_health.calls.working", Gauge, "{call}", ["gen_ai.tool.name", "server.address"], Output,
        "In-flight calls with valid progress whose clocks hold, by tool and server";
    CALL_DURATION = "mcp_health.call.duration", Histogram, "s", ["state"], Output,
        "Duration of a tools/call (its spans' start to end), by the state of its first verdict";
    INCIDENTS_OPEN = "mcp_health.incidents.open", Gauge, "{incident}", ["first_failed_layer", "state", "server.address", "incident_state"], Output,
        "Open incidents by first failed layer, health state, server and incident state (open, waiting); a resolved group stays at 0";
    INCIDENTS_TRANSITIONS = "mcp_health.incidents.transitions", Counter, "{transition}", ["transition", "first_failed_layer"], Output,
        "Incident lifecycle transitions (opened, updated, resolved) by first failed layer";
    CATALOG_VERDICTS = "mcp_health.catalog.verdicts", Counter, "{verdict}", ["server.address", "convergence"], Output,
        "Catalog convergence verdict changes, by server and convergence";
    CATALOG_DRIFT = "mcp_health.catalog.drift", Counter, "{definition}", ["server.address", "gen_ai.tool.name"], Output,
        "Tool definitions that differ from their pin, by server and tool";
    CATALOG_CONVERGENCE = "mcp_health.catalog.convergence", Gauge, "{session}", ["server.address", "convergence"], Output,
        "Sessions per current catalog convergence verdict, by server";
    VERIFIER_RUNS = "mcp_health.verifier.runs", Counter, "{run}", ["verifier", "result"], Output,
        "Verifier spans received, by verifier (rule name) and result (confirmed, missing, failed, stale, verifier_error)";
    VERIFIER_ERRORS = "mcp_health.verifier.errors", Counter, "{error}", ["verifier", "error"], Output,
        "Verifiers that could not run (no finding; the call stays unverified), by verifier and error";
    VERIFIER_DURATION = "mcp_health.verifier.duration", Histogram, "s", ["verifier"], Output,
        "How long a verifier ran (its span's duration), by verifier";
    RECEIPTS_CAPPED = "mcp_health.receipts.capped", Counter, "{receipt}", [], Internal(Normal),
        "Receipts that said they checked later than they arrived (beyond 2 s of clock difference): dated at their arrival, so none outranks the receipts after it";
    STATE_UNDECODABLE = "mcp_health.state.undecodable", Counter, "{record}", ["table", "reason"], Internal(Normal),
        "Stored state records the load could not read, by table and reason (damaged: skipped, the rest loaded; newer_version: written by a newer build, left as it is)";
    STATE_JOURNAL_REPLAYED = "mcp_health.state.journal_replayed", Counter, "{batch}", ["result"], Internal(Normal),
        "Batches of acknowledged evidence read back from the evidence journal after a restart that did not drain (a crash), by result: replayed (its calls decided, partial where evidence is missing), damaged (could not be read: lost, with the rest of its segment)";
    JOINS = "mcp_health.joins", Counter, "{join}", ["kind", "result"], Output,
        "Halves of calls split over two traces, by kind (server_half, refused_request) and result: joined, late (a client half joined to a server half decided before it came), ambiguous (no join: more than one candidate fits; the client call's verdict is partial, reason ambiguous_server_half)";

    // ---- Basic: does the service take in, pass on, keep up ----------------------------------
    BUILD_INFO = "mcp_health.build.info", Gauge, "{build}", ["version", "rustc"], Internal(Basic),
        "Always 1; the version of mcp-health and the rustc that built it, as labels";
    PROCESS_CPU_TIME = "mcp_health.process.cpu.time", Counter, "s", ["cpu.mode"], Internal(Basic),
        "CPU seconds the process used, by cpu.mode (user, system)";
    PROCESS_UPTIME = "mcp_health.process.uptime", Counter, "s", [], Internal(Basic),
        "Seconds since the process started (since its metrics were set up)";
    PROCESS_MEMORY_RSS = "mcp_health.process.memory.rss", Gauge, "By", [], Internal(Basic),
        "Resident set of the process (what processors.memory_limiter compares with its limits)";
    TLS_CERTIFICATE_EXPIRY = "mcp_health.tls.certificate_expiry_timestamp", Gauge, "s", ["listener"], Internal(Basic),
        "When the certificate a TLS listener serves now expires (its not-after), in seconds since the Unix epoch, by listener (otlp_grpc, otlp_http, gate); subtract time() for the time left";
    TLS_RELOADS = "mcp_health.tls.reloads", Counter, "{reload}", ["listener", "result"], Internal(Basic),
        "Reads of a TLS listener's certificate and key after its start (SIGHUP, tls.reload_interval), by listener and result: ok (served from the next handshake on), failed (the served certificate was kept)";
    SPANS_RECEIVED = "mcp_health.spans.received", Counter, "{span}", ["transport"], Internal(Basic),
        "Spans received, by transport";
    SPANS_REFUSED = "mcp_health.spans.refused", Counter, "{span}", ["transport", "reason"], Internal(Basic),
        "Spans of refused requests (answered with an error after their spans were read), by transport and reason: spans on both transports; a request refused before it was read counts only in mcp_health.requests.refused";
    REQUESTS_REFUSED = "mcp_health.requests.refused", Counter, "{request}", ["signal", "transport", "reason"], Internal(Basic),
        "Export requests refused whole (every one, read or not), by signal, transport and reason: what senders saw refused, the same unit on both transports";
    RECEIVER_ACCEPTED_SPANS = "mcp_health.receiver.accepted_spans", Counter, "{span}", ["receiver", "transport"], Internal(Basic),
        "Spans handed to the correlator (and to pass-through), by receiver and transport";
    RECEIVER_ACCEPTED_METRIC_POINTS = "mcp_health.receiver.accepted_metric_points", Counter, "{data_point}", ["receiver", "transport"], Internal(Basic),
        "Metric points taken for pass-through (or dropped when it is off), by receiver and transport";
    RECEIVER_ACCEPTED_LOG_RECORDS = "mcp_health.receiver.accepted_log_records", Counter, "{record}", ["receiver", "transport"], Internal(Basic),
        "Log records taken for pass-through (or dropped when it is off), by receiver and transport";
    RECEIVER_REFUSED_SPANS = "mcp_health.receiver.refused_spans", Counter, "{span}", ["receiver", "transport", "reason"], Internal(Basic),
        "Spans of decoded requests not taken (refused whole, or invalid inside an accepted request), by receiver, transport and reason";
    RECEIVER_REFUSED_METRIC_POINTS = "mcp_health.receiver.refused_metric_points", Counter, "{data_point}", ["receiver", "transport", "reason"], Internal(Basic),
        "Metric points of decoded requests refused, by receiver, transport and reason";
    RECEIVER_REFUSED_LOG_RECORDS = "mcp_health.receiver.refused_log_records", Counter, "{record}", ["receiver", "transport", "reason"], Internal(Basic),
        "Log records of decoded requests refused, by receiver, transport and reason";
    EXPORTER_SENT_SPANS = "mcp_health.exporter.sent_spans", Counter, "{span}", ["exporter", "signal", "transport"], Internal(Basic),
        "Spans delivered upstream, by exporter, signal and transport";
    EXPORTER_SENT_METRIC_POINTS = "mcp_health.exporter.sent_metric_points", Counter, "{data_point}", ["exporter", "signal", "transport"], Internal(Basic),
        "Metric points delivered upstream, by exporter, signal and transport";
    EXPORTER_SENT_LOG_RECORDS = "mcp_health.exporter.sent_log_records", Counter, "{record}", ["exporter", "signal", "transport"], Internal(Basic),
        "Log records delivered upstream, by exporter, signal and transport";
    EXPORTER_SEND_FAILED_SPANS = "mcp_health.exporter.send_failed_spans", Counter, "{span}", ["exporter", "signal", "transport"], Internal(Basic),
        "Spans given up on (a permanent answer, retries exhausted, or rejected in a partial success)";
    EXPORTER_SEND_FAILED_METRIC_POINTS = "mcp_health.exporter.send_failed_metric_points", Counter, "{data_point}", ["exporter", "signal", "transport"], Internal(Basic),
        "Metric points given up on (a permanent answer, retries exhausted, or rejected in a partial success)";
    EXPORTER_SEND_FAILED_LOG_RECORDS = "mcp_health.exporter.send_failed_log_records", Counter, "{record}", ["exporter", "signal", "transport"], Internal(Basic),
        "Log records given up on (a permanent answer, retries exhausted, or rejected in a partial success)";
    EXPORTER_ENQUEUE_FAILED_SPANS = "mcp_health.exporter.enqueue_failed_spans", Counter, "{span}", ["exporter", "signal"], Internal(Basic),
        "Spans that found the exporter queue full (refused to their sender, or dropped when mcp-health made them)";
    EXPORTER_ENQUEUE_FAILED_METRIC_POINTS = "mcp_health.exporter.enqueue_failed_metric_points", Counter, "{data_point}", ["exporter", "signal"], Internal(Basic),
        "Metric points that found the exporter queue full (refused to their sender, or dropped when mcp-health made them)";
    EXPORTER_ENQUEUE_FAILED_LOG_RECORDS = "mcp_health.exporter.enqueue_failed_log_records", Counter, "{record}", ["exporter", "signal"], Internal(Basic),
        "Log records that found the exporter queue full (refused to their sender, or dropped when mcp-health made them)";
    EXPORTER_DROPPED = "mcp_health.exporter.dropped", Counter, "{item}", ["signal", "reason"], Internal(Basic),
        "Export requests or health spans dropped, by signal and reason";
    EXPORTER_QUEUE_SIZE = "mcp_health.exporter.queue_size", Gauge, "{request}", ["exporter"], Internal(Basic),
        "Export requests waiting in (or reserved in) an exporter queue, by exporter (otlp: own output; otlp/passthrough)";
    EXPORTER_QUEUE_CAPACITY = "mcp_health.exporter.queue_capacity", Gauge, "{request}", ["exporter"], Internal(Basic),
        "Export requests an exporter queue holds at most (exporters.otlp.sending_queue.queue_size), by exporter";
    EXPORTER_QUEUE_STORED_REQUESTS = "mcp_health.exporter.queue_stored_requests", Gauge, "{request}", ["exporter"], Internal(Basic),
        "Export requests in the on-disk sending queue (waiting or being sent), by exporter; served only when the queue is on disk";
    EXPORTER_QUEUE_STORED_ITEMS = "mcp_health.exporter.queue_stored_items", Gauge, "{item}", ["exporter", "kind"], Internal(Basic),
        "Items in the on-disk sending queue, by exporter and kind (spans, log_records, metric_points)";
    EXPORTER_QUEUE_STORED_BYTES = "mcp_health.exporter.queue_stored_bytes", Gauge, "By", ["exporter"], Internal(Basic),
        "Bytes of the on-disk sending queue, by exporter";
    EXPORTER_QUEUE_STORED_CAPACITY_BYTES = "mcp_health.exporter.queue_stored_capacity_bytes", Gauge, "By", ["exporter"], Internal(Basic),
        "Bytes the on-disk sending queue holds at most (exporters.otlp.sending_queue.storage_max_bytes), by exporter";
    EXPORTER_QUEUE_DAMAGED_FILES = "mcp_health.exporter.queue_damaged_files", Counter, "{file}", ["exporter"], Internal(Basic),
        "On-disk sending-queue files that could not be read back (truncated, damaged): skipped and removed, by exporter";

    // ---- Normal: the engine's bounds and losses, connections, memory ------------------------
    SPANS_REJECTED = "mcp_health.spans.rejected", Counter, "{span}", ["transport"], Internal(Normal),
        "Spans rejected inside accepted requests (partial success), by transport";
    SPANS_LOOPED = "mcp_health.spans.looped", Counter, "{span}", ["transport"], Internal(Normal),
        "Spans this process had sent itself (health spans or pass-through) received again through an export loop; dropped, by transport";
    SIGNALS_RECEIVED = "mcp_health.signals.received", Counter, "{item}", ["signal", "transport"], Internal(Normal),
        "Metric data points and log records received for pass-through, by signal (metrics, logs) and transport";
    SIGNALS_REFUSED = "mcp_health.signals.refused", Counter, "{item}", ["signal", "transport", "reason"], Internal(Normal),
        "Metric data points and log records refused (whole requests answered with an error; an unreadable one counts 1), by signal, transport and reason";
    SIGNALS_DROPPED = "mcp_health.signals.dropped", Counter, "{item}", ["signal", "reason"], Internal(Normal),
        "Metric data points and log records accepted and not passed on (pass-through is off, or they looped), by signal and reason";
    ATTRIBUTES_INVALID = "mcp_health.attributes.invalid", Counter, "{attribute}", [], Internal(Normal),
        "Known attributes whose value had an unusable type";
    SPANS_LATE = "mcp_health.spans.late", Counter, "{span}", [], Internal(Normal),
        "Evidence spans that arrived after their chain was decided (each revises a verdict)";
    SPANS_LATE_DROPPED = "mcp_health.spans.late_dropped", Counter, "{span}", [], Internal(Normal),
        "Evidence spans for a chain already forgotten (past late_span_window or max_decided): no revision is possible";
    SPANS_DUPLICATE = "mcp_health.spans.duplicate", Counter, "{span}", [], Internal(Normal),
        "Evidence spans equal to one their chain holds already (an exporter's retry, the journal replayed after a restart): taken once";
    SPANS_TRUNCATED = "mcp_health.spans.truncated", Counter, "{span}", [], Internal(Normal),
        "Evidence spans dropped because their chain reached max_spans_per_chain";
    CHAINS_IN_FLIGHT = "mcp_health.chains.in_flight", Gauge, "{chain}", [], Internal(Normal),
        "Chains waiting for a decision";
    CHAINS_EVICTED = "mcp_health.chains.evicted", Counter, "{chain}", [], Internal(Normal),
        "Chains decided early because the correlator reached a bound";
    CHAINS_CALLLESS = "mcp_health.chains.callless", Counter, "{chain}", [], Internal(Normal),
        "Chains that gave no verdict because they hold no MCP request (a verifier or an HTTP span alone)";
    EVIDENCE_BYTES = "mcp_health.evidence.bytes", Gauge, "By", [], Internal(Normal),
        "Bytes of evidence held by the correlator";
    VERDICT_DELAY = "mcp_health.verdict.delay", Histogram, "s", [], Internal(Normal),
        "Time from a call's end to its first verdict (the wait for late evidence, and the engine's own delay)";
    VERIFIERS_PARKED = "mcp_health.verifiers.parked", Counter, "{span}", [], Internal(Normal),
        "Verifier spans that named an operation key before its call arrived, parked until it does";
    VERIFIERS_PARKED_DROPPED = "mcp_health.verifiers.parked_dropped", Counter, "{span}", [], Internal(Normal),
        "Parked verifier spans dropped (their call never came within late_span_window, or a key held too many)";
    HTTP_SPANS_PARKED = "mcp_health.http_spans.parked", Counter, "{span}", [], Internal(Normal),
        "HTTP spans on an MCP endpoint that arrived before any MCP span of their trace, parked until one does";
    HTTP_SPANS_PARKED_DROPPED = "mcp_health.http_spans.parked_dropped", Counter, "{span}", [], Internal(Normal),
        "Parked HTTP spans let go: no MCP span of their trace came within decision_wait + server_half_wait, or a trace held too many";
    STATE_STORE_ERRORS = "mcp_health.state.store_errors", Counter, "{error}", [], Internal(Normal),
        "Loads, reads and writes of the state store (storage) that failed; the engine went on in memory";
    STATE_STORE_CONFLICTS = "mcp_health.state.store_conflicts", Counter, "{record}", [], Internal(Normal),
        "Record writes a shared state store refused because another instance changed the record first (read, merged and written again)";
    STATE_STORE_QUEUE_WAITS = "mcp_health.state.store_queue_waits", Counter, "{call}", [], Internal(Normal),
        "Store calls the engine submitted while the store thread's bounded queue was full: it waited for the store (a store slower than the engine)";
    STATE_STORE_ROUND_TRIPS = "mcp_health.state.store_round_trips", Counter, "{request}", [], Internal(Normal),
        "Requests sent to a shared state store (Redis); a pipeline of many commands is one";
    STATE_STORE_BYTES = "mcp_health.state.store_bytes", Counter, "By", ["direction"], Internal(Normal),
        "Payload bytes (keys, versions and records) sent to and received from a shared state store, by direction (sent, received)";
    STATE_STORE_VERSIONS = "mcp_health.state.store_versions", Gauge, "{record}", [], Internal(Normal),
        "Record versions this instance remembers for compare-and-set on a shared state store (bounded: see mcp_health.state.evicted)";
    STATE_STORE_DELETES_LEFT_TO_EXPIRE = "mcp_health.state.store_deletes_left_to_expire", Counter, "{record}", [], Internal(Normal),
        "Deletes of decided chains and operation keys this instance wrote to a shared state store with a lifetime, not sent: the lifetime ends them";
    STATE_LEASE_HOLDER = "mcp_health.state.lease_holder", Gauge, "{instance}", [], Internal(Normal),
        "1 when this instance reports the global gauges (open incidents, convergence) of all instances on a shared store, or runs alone; 0 otherwise";
    STATE_EVICTED = "mcp_health.state.evicted", Counter, "{entry}", ["table"], Internal(Normal),
        "Entries a bounded table or cache forgot because it was full (the state store's record versions: untouched for long), by table";
    INCIDENTS_UNSHARED = "mcp_health.incidents.unshared", Counter, "{verdict}", [], Internal(Normal),
        "Verdicts folded into this instance's incidents only, not the shared store's (store unreachable past the bound or at shutdown): their transitions may also come from another instance";
    VERDICT_LOG_WRITE_ERRORS = "mcp_health.verdict_log.write_errors", Counter, "{record}", [], Internal(Normal),
        "Verdict-log records lost because a write failed (a full disk); no partial line is left";
    CONNECTIONS_REFUSED = "mcp_health.connections.refused", Counter, "{connection}", ["listener", "reason"], Internal(Normal),
        "Connections a listener closed at once because it held max_connections, or whose TLS handshake failed, by listener and reason";
    CONNECTIONS_TIMED_OUT = "mcp_health.connections.timed_out", Counter, "{connection}", ["listener", "reason"], Internal(Normal),
        "Connections a listener closed for read_header_timeout or idle_timeout, by listener and reason";
    MEMORY_RESERVED = "mcp_health.memory.reserved", Gauge, "By", [], Internal(Normal),
        "Bytes reserved by requests in flight and queued (processors.memory_limiter)";
    MEMORY_EVIDENCE = "mcp_health.memory.evidence", Gauge, "By", [], Internal(Normal),
        "Evidence bytes the engine holds, as counted by processors.memory_limiter";

    // ---- Detailed: what only a deep dig needs ------------------------------------------------
    EXPORTER_SENT = "mcp_health.exporter.sent", Counter, "{request}", ["signal"], Internal(Detailed),
        "Export requests delivered upstream, by signal (the items they held are in the sent_* counters)";
    EXPORTER_SPLIT_REQUESTS = "mcp_health.exporter.split_requests", Counter, "{request}", ["signal"], Internal(Detailed),
        "Export requests split in two because their encoding was larger than exporters.otlp.max_request_bytes, by signal";
    CONNECTIONS_OPEN = "mcp_health.connections.open", Gauge, "{connection}", ["listener"], Internal(Detailed),
        "Connections open now, by listener";
}

/// The declaration of the instrument named `name` (an OpenTelemetry name).
pub(crate) fn find(name: &str) -> Option<&'static Instrument> {
    ALL.iter().find(|i| i.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_units_are_opentelemetry_units() {
        let mut seen = std::collections::BTreeSet::new();
        for i in ALL {
            assert!(seen.insert(i.name), "{} declared twice", i.name);
            assert!(i.name.starts_with("mcp_health."), "{}", i.name);
            let annotation = i.unit.starts_with('{') && i.unit.ends_with('}');
            assert!(annotation || ["s", "By", "1"].contains(&i.unit), "{}: unit {:?}", i.name, i.unit);
            assert!(!i.description.is_empty(), "{}", i.name);
        }
    }
}
