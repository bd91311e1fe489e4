//! Configuration: one YAML file in the OpenTelemetry Collector's style, `${env:VAR}` substitution,
//! standard `OTEL_*` variables as fallbacks, and an embedded default that needs nothing.
//!
//! Substitution happens per scalar value after the YAML is parsed (see `subst`): a value is
//! always one scalar, never YAML syntax, and comments are never looked at.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), reported with the
//! key's line and column; so are bad values found after parsing (`check`).

pub mod lockfile;
pub(crate) mod subst;
/// Client TLS of the exporters: declared beside the exporters that use it.
pub(crate) use crate::emit::tls_client;
/// Server TLS of the listeners: declared beside the receivers.
pub(crate) use crate::receive::tls;

use std::time::Duration;

use serde::Deserialize;

use crate::correlate::ChainLimits;
use crate::defaults;
/// `exporters`: declared beside the exporters.
pub use crate::emit::config::{
    Exporters, OtlpExporter, PrometheusExporter, RetryOnFailure, SendingQueue, VerdictLog, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_STORAGE_MAX_BYTES,
};
/// `processors.memory_limiter`: declared beside the limiter it configures.
pub use crate::flow::memory::MemoryLimiterConfig;
/// `extensions.gate`: declared beside the gate.
pub use crate::gate::config::GateConfig;
use crate::receive::config::{check_endpoint, check_listener, empty_is_default, listener_config};
/// `receivers`: declared beside the receivers, with the keys every listener shares.
pub use crate::receive::config::{listen_address_ok, GrpcReceiver, HttpReceiver, OtlpReceiver, Protocols, ReceiverAuth, Receivers};
pub use crate::receive::tls::TlsServerSettings;
/// `storage`: declared beside the stores.
pub use crate::state::config::{Secret, Storage, JOURNAL_MAX_BYTES};
/// `service.telemetry.metrics.level`: declared with the instruments it chooses among.
pub use crate::telemetry::instruments::MetricsLevel;

/// The embedded default: loopback only, no upstream, verdicts as JSON lines, Prometheus on.
pub const DEFAULT_CONFIG: &str = include_str!("../../otel-config/default.yaml");

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: environment variable {var} is not set (line {line}); use ${{env:{var}:-default}} for a fallback")]
    MissingEnv { path: String, var: String, line: usize },
    /// The YAML does not parse or does not fit (unknown key, wrong type, variable not set); the
    /// message names the line, column and key.
    #[error("{path}: {message}")]
    Yaml { path: String, message: String },
    /// A value that parsed but is not allowed. `at` is `line L, column C: ` of the key (or of its
    /// nearest ancestor written in the file, when the value is a default), empty if unknown.
    #[error("{path}: {at}{key}: {message}")]
    Invalid { path: String, at: String, key: String, message: String },
    /// A `--set key=value` that cannot be applied.
    #[error("--set {arg}: {message}")]
    Set { arg: String, message: String },
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub receivers: Receivers,
    #[serde(default)]
    pub processors: Processors,
    #[serde(default)]
    pub exporters: Exporters,
    #[serde(default)]
    pub extensions: Extensions,
    #[serde(default)]
    pub service: Service,
    /// Where the cross-trace state outlives the process (`storage.directory`); absent, it is kept
    /// in memory only.
    #[serde(default)]
    pub storage: Option<Storage>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Processors {
    #[serde(default)]
    pub mcp_health: CorrelateConfig,
    /// The collector's `memory_limiter`: refuse (retryably) above `limit_mib - spike_limit_mib`.
    #[serde(default, deserialize_with = "empty_is_default")]
    pub memory_limiter: Option<MemoryLimiterConfig>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CorrelateConfig {
    #[serde(default = "defaults::secs::<2>", with = "humantime_serde")]
    pub decision_wait: Duration,
    #[serde(default = "defaults::secs::<30>", with = "humantime_serde")]
    pub max_wait: Duration,
    /// How much longer than `decision_wait` a server half in a trace of its own (or a refused
    /// HTTP request alone in its trace) waits for its client half and that half's rivals before
    /// it is joined or decided alone. The default covers the OpenTelemetry SDKs' default batch
    /// export delay (5 s): a split call's verdict comes `decision_wait` + this after its last span.
    #[serde(default = "defaults::secs::<5>", with = "humantime_serde")]
    pub server_half_wait: Duration,
    /// Chains in flight. Unset (the default): sized from memory, `max_bytes / 1024` (a chain holds
    /// about 1.2 KB of evidence), so the byte bound decides: 256 MiB hold ~220 k chains, ~110 k
    /// calls/s at `decision_wait: 2s` — more than one core accepts. A count alone (100 k, the old
    /// default) made the embedded default evict most chains at ~150 k spans/s.
    #[serde(default)]
    pub max_chains: Option<usize>,
    /// Bytes of evidence the chains in flight may hold: 256 MiB.
    #[serde(default = "defaults::count::<268_435_456>")]
    pub max_bytes: usize,
    #[serde(default = "defaults::count::<1_000>")]
    pub max_spans_per_chain: usize,
    #[serde(default = "defaults::secs::<300>", with = "humantime_serde")]
    pub late_span_window: Duration,
    #[serde(default = "defaults::count::<100_000>")]
    pub max_decided: usize,
    /// Batches waiting for the correlator; past it receivers answer "retry later".
    #[serde(default = "defaults::count::<256>")]
    pub queue_size: usize,
    /// Sessions whose catalog state is kept.
    #[serde(default = "defaults::count::<100_000>")]
    pub max_sessions: usize,
    /// A session with no span for this long is forgotten.
    #[serde(default = "defaults::secs::<3600>", with = "humantime_serde")]
    pub session_idle_expiry: Duration,
    /// What counts as bounded refresh evidence for servers that do not advertise `listChanged`:
    /// `{mode: none}`, `{mode: on_reconnect}`, `{mode: max_age, max_age: 10m}`.
    #[serde(default)]
    pub refresh_policy: crate::classify::catalog::RefreshPolicy,
    /// Clocks of long calls: `{default: {inactivity: 30s, deadline: 10m}, tools: {name: {...}}}`.
    #[serde(default)]
    pub progress: crate::classify::progress::ProgressPolicy,
    /// A lockfile (`mcp-health lock`): calls whose tool definition differs from its pin are
    /// `contract_drift`, and drifted discoveries are reported.
    #[serde(default)]
    pub lockfile: Option<String>,
    /// Digest raw tool definitions (`mcp_health.catalog.tools`) and strip them before passing spans on.
    #[serde(default = "defaults::yes")]
    pub strip_tool_definitions: bool,
    /// Mark partial (never `healthy`) a chain whose earliest call started before this service took
    /// its first span, less `decision_wait`: its first spans may have gone to an instance that is
    /// gone or to this one before a restart. On behind a load balancer or wherever restarts
    /// happen under traffic; off by default because recorded spans posted with their original
    /// timestamps would all be "before the start". Decisions at shutdown and evictions are partial
    /// always.
    #[serde(default)]
    pub partial_before_start: bool,
    /// Limits of the service's tables and caches (`limits:`); what hits one is counted in
    /// `mcp_health.state.evicted{table}`.
    #[serde(default, rename = "limits")]
    pub state_limits: StateLimits,
    /// Receipt provenance (`receipts: {trusted_keys: ["ed25519:<hex>", …]}`): with keys, only a
    /// receipt signed by one of them is outcome evidence (see `evidence::receipt`).
    #[serde(default)]
    pub receipts: ReceiptPolicy,
}

/// `processors.mcp_health.receipts`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReceiptPolicy {
    /// Public keys (`mcp-health keygen` prints one) whose signed receipts are trusted. Empty: every
    /// receipt is taken as it comes (`unsigned`), as a pipeline that trusts every sender.
    #[serde(default)]
    pub trusted_keys: Vec<String>,
}

impl ReceiptPolicy {
    /// The keys trusted (`None`: none, every receipt is taken as it comes). `check` refused a
    /// key that does not parse.
    pub fn keys(&self) -> Option<std::sync::Arc<crate::evidence::receipt::TrustedKeys>> {
        let keys = crate::evidence::receipt::TrustedKeys::parse(&self.trusted_keys).unwrap_or_default();
        (!keys.is_empty()).then(|| std::sync::Arc::new(keys))
    }
}

/// `processors.mcp_health.limits`: the most entries each table or cache keeps. When one is full,
/// its oldest entry goes (see `crate::bounded`) and is counted under the table's name, which is
/// also the key here. Every limit must be at least 1.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StateLimits {
    /// The gate's board: the latest catalog verdict per session.
    #[serde(default = "defaults::count::<100_000>")]
    pub gate_board: usize,
    /// Contract digests by raw-definition hash (one cache per receiving thread).
    #[serde(default = "defaults::count::<16_384>")]
    pub digest_cache: usize,
    /// Projections of the tool definitions seen, by digest (what drift reports diff against).
    #[serde(default = "defaults::count::<8_192>")]
    pub tool_definitions: usize,
    /// Interned tool, server, version and method names (per receiving thread).
    #[serde(default = "defaults::count::<4_096>")]
    pub interner: usize,
    /// Hashed session ids (per receiving thread).
    #[serde(default = "defaults::count::<4_096>")]
    pub redaction_cache: usize,
    /// Sessions the evidence tap keeps (protocol version, `tools/list` traversal). The tap takes
    /// no configuration file: it uses this default.
    #[serde(default = "defaults::count::<16_384>")]
    pub tap_sessions: usize,
    /// Operation keys of calls, so a verifier in another trace finds its call.
    #[serde(default = "defaults::count::<100_000>")]
    pub operation_keys: usize,
    /// Operation keys under which verifiers wait for a call that has not arrived yet.
    #[serde(default = "defaults::count::<10_000>")]
    pub parked_verifiers: usize,
    /// (server, tool, digest) drift already reported (each is reported once).
    #[serde(default = "defaults::count::<100_000>")]
    pub drift_reported: usize,
    /// In-flight calls already reported `working` (reported once; the final verdict follows).
    #[serde(default = "defaults::count::<100_000>")]
    pub working_reported: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        serde_yaml_ng::from_str("{}").unwrap_or_else(|_| unreachable!("defaults deserialize"))
    }
}

impl StateLimits {
    /// Every limit with its key, for validation and documentation.
    pub fn entries(&self) -> [(&'static str, usize); 10] {
        [
            ("gate_board", self.gate_board),
            ("digest_cache", self.digest_cache),
            ("tool_definitions", self.tool_definitions),
            ("interner", self.interner),
            ("redaction_cache", self.redaction_cache),
            ("tap_sessions", self.tap_sessions),
            ("operation_keys", self.operation_keys),
            ("parked_verifiers", self.parked_verifiers),
            ("drift_reported", self.drift_reported),
            ("working_reported", self.working_reported),
        ]
    }
}

impl Default for CorrelateConfig {
    fn default() -> Self {
        serde_yaml_ng::from_str("{}").unwrap_or_else(|_| unreachable!("defaults deserialize"))
    }
}

impl CorrelateConfig {
    /// What the normalizer is configured with: the receipt keys trusted and the receiving
    /// threads' cache sizes (`limits`), handed to the component that normalizes.
    pub fn normalize_settings(&self) -> crate::normalize::Settings {
        crate::normalize::Settings {
            trusted: self.receipts.keys(),
            definitions: std::sync::Arc::new(crate::normalize::definitions::Definitions::with_capacity(self.state_limits.tool_definitions)),
            digest_cache: self.state_limits.digest_cache,
            interner: self.state_limits.interner,
            redaction_cache: self.state_limits.redaction_cache,
        }
    }

    pub fn session_limits(&self) -> crate::correlate::SessionLimits {
        crate::correlate::SessionLimits {
            max_sessions: self.max_sessions,
            max_events_per_session: 512,
            idle_expiry: self.session_idle_expiry,
            refresh_policy: self.refresh_policy,
        }
    }

    pub fn limits(&self) -> ChainLimits {
        ChainLimits {
            decision_wait: self.decision_wait,
            max_wait: self.max_wait,
            max_chains: self.max_chains.unwrap_or(self.max_bytes / 1024).max(1),
            max_bytes: self.max_bytes,
            max_spans_per_chain: self.max_spans_per_chain,
            late_span_window: self.late_span_window,
            max_decided: self.max_decided,
            max_operation_keys: self.state_limits.operation_keys,
            max_parked_verifiers: self.state_limits.parked_verifiers,
            server_half_wait: self.server_half_wait,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Extensions {
    #[serde(default, deserialize_with = "empty_is_default")]
    pub health_check: Option<HealthCheck>,
    /// The gate gRPC API (`proto/mcp_health/v1/gate.proto`); off when absent.
    #[serde(default, deserialize_with = "empty_is_default")]
    pub gate: Option<GateConfig>,
    /// The collector's `file_storage` extension, for `exporters.otlp.sending_queue.storage:
    /// file_storage`: the queue is kept in `<directory>/sending_queue`.
    #[serde(default)]
    pub file_storage: Option<FileStorage>,
}

/// `extensions.file_storage`: a directory the service may write.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileStorage {
    pub directory: std::path::PathBuf,
}

listener_config! {
    // Plaintext only (no `tls`): probed by the container's healthcheck and load balancers.
    pub struct HealthCheck {
        #[serde(default = "default_health_endpoint")]
        pub endpoint: String,
        /// Serve the status page (`/status`, `/status.json`) beside the health check.
        #[serde(default = "defaults::yes")]
        pub status_page: bool,
        /// `/status/health`: an exporter whose every attempt has failed for longer is unhealthy
        /// (and an on-disk sending queue that refused a request this recently).
        #[serde(default = "defaults::secs::<30>", with = "humantime_serde")]
        pub exporter_failure_threshold: Duration,
        /// `/` answers 503 when a component is unhealthy (as `/status/health` judges it). Off: a
        /// liveness probe on `/` must not restart the process for a backend that is down.
        #[serde(default)]
        pub fail_on_component_error: bool,
        /// How the status page is drawn.
        #[serde(default, deserialize_with = "empty_is_default")]
        pub status: Option<StatusPage>,
    }
}

/// `extensions.health_check.status`: the status page's links out.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StatusPage {
    /// A trace backend's URL for one trace, with `{trace_id}` where the 32 hex digits go
    /// (`https://jaeger.example/trace/{trace_id}`): every trace id on the page links there.
    pub trace_url: Option<String>,
}

impl StatusPage {
    /// Why a `trace_url` is unusable, if it is: an http(s) URL with a host and a `{trace_id}`
    /// placeholder, nothing a browser would read as markup or a second URL.
    pub fn trace_url_problem(url: &str) -> Option<&'static str> {
        let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
        let Some(rest) = rest else { return Some("must be an http:// or https:// URL") };
        if rest.is_empty() || rest.starts_with(['/', '{']) {
            return Some("must name a host, e.g. https://jaeger.example/trace/{trace_id}");
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '<' | '>' | '\\' | '`')) {
            return Some("must not contain spaces, quotes, angle brackets or backslashes");
        }
        if !url.contains("{trace_id}") {
            return Some("must contain the placeholder {trace_id}, e.g. https://jaeger.example/trace/{trace_id}");
        }
        None
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Service {
    #[serde(default)]
    pub telemetry: Telemetry,
    #[serde(default)]
    pub runtime: Runtime,
}

/// `service.runtime`: the threads the service runs on. Read at start only (a SIGHUP reload
/// keeps the threads it has, as it keeps the log settings).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Threads that receive, walk, correlate, classify and export; unset, see
    /// [`Config::worker_threads`].
    pub worker_threads: Option<usize>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    #[serde(default)]
    pub logs: Logs,
    /// `service.telemetry.metrics`: how much of mcp-health's own telemetry it serves.
    #[serde(default)]
    pub metrics: TelemetryMetrics,
    /// `service.name` of what mcp-health emits; falls back to `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
    /// Seconds to finish deciding and flushing on SIGTERM.
    #[serde(default, with = "humantime_serde")]
    pub shutdown_timeout: Option<Duration>,
}

/// `service.telemetry.metrics`, as the collector's.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TelemetryMetrics {
    #[serde(default)]
    pub level: MetricsLevel,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Logs {
    #[serde(default = "default_level")]
    pub level: String,
    /// `console` (human-readable lines) or `json` (one JSON object per line, for a log
    /// pipeline), as the collector's `service.telemetry.logs.encoding`.
    #[serde(default = "default_log_encoding")]
    pub encoding: String,
}

impl Default for Logs {
    fn default() -> Self {
        Logs { level: default_level(), encoding: default_log_encoding() }
    }
}

fn default_log_encoding() -> String {
    "console".into()
}

fn default_health_endpoint() -> String {
    "127.0.0.1:13133".into()
}
fn default_level() -> String {
    "info".into()
}

/// Expand `${env:VAR}`, `${VAR}` and `${env:VAR:-default}` (the collector's forms) in one string;
/// `$$` is a literal `$`; `line` in the error counts within `text`. [`Config::parse`] expands each
/// scalar value as it deserializes it, never the text ([`subst::Subst`]); this is the same
/// expansion on one string, for the forms' tests.
#[cfg(test)]
pub fn substitute_env(path: &str, text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    subst::expand(text, lookup).map_err(|m| match m.why {
        subst::Unresolved::EnvNotSet => ConfigError::MissingEnv { path: path.into(), var: m.var, line: m.line },
        _ => ConfigError::Yaml { path: path.into(), message: format!("line {}: {m}", m.line) },
    })
}

impl Config {
    /// Parse a configuration text, substituting variables in each scalar value, and check its values.
    pub fn parse(path: &str, text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let de = subst::Subst::new(serde_yaml_ng::Deserializer::from_str(text), lookup);
        let cfg = Config::deserialize(de).map_err(|e: serde_yaml_ng::Error| ConfigError::Yaml {
            path: path.into(),
            message: match e.location() {
                Some(l) => format!("line {}, column {}: {}", l.line(), l.column(), strip_location(&e.to_string())),
                None => e.to_string(),
            },
        })?;
        cfg.check(path).map_err(|e| match e {
            ConfigError::Invalid { path, key, message, .. } => {
                let at = subst::locate(text, &key).map(|(l, c)| format!("line {l}, column {c}: ")).unwrap_or_default();
                ConfigError::Invalid { path, at, key, message }
            }
            e => e,
        })?;
        Ok(cfg)
    }

    /// Read a file (or the embedded default) with `--set key=value` overrides, as the collector's
    /// `--set`: the key is a dotted path into the YAML (`receivers.otlp.protocols.grpc.endpoint`),
    /// maps are made where missing, the value is read as a YAML scalar (`true`, `4`, `2s`, text)
    /// and `${env:VAR}` in it is substituted like any value in the file. Later sets win. Errors
    /// found after a set name the key (line numbers then refer to the merged document).
    pub fn load_with(path: Option<&str>, sets: &[String]) -> Result<Config, ConfigError> {
        if sets.is_empty() {
            return Config::load(path);
        }
        let (name, text) = match path {
            None => ("<embedded default>".to_string(), DEFAULT_CONFIG.to_string()),
            Some(p) => (p.to_string(), std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.into(), source })?),
        };
        let merged = apply_sets(&text, sets)?;
        Config::parse(&format!("{name} with --set"), &merged, &|k: &str| std::env::var(k).ok())
    }

    /// Read a file, or the embedded default when `path` is `None`.
    pub fn load(path: Option<&str>) -> Result<Config, ConfigError> {
        let env = |k: &str| std::env::var(k).ok();
        match path {
            None => Config::parse("<embedded default>", DEFAULT_CONFIG, &env),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.into(), source })?;
                Config::parse(p, &text, &env)
            }
        }
    }

    /// The engine's configuration in this file (`processors.mcp_health`): what serve and replay
    /// build their engine from.
    pub fn engine_config(&self) -> crate::engine::EngineConfig {
        let p = &self.processors.mcp_health;
        let mut e = crate::engine::EngineConfig::new(p.limits(), p.session_limits());
        e.progress = p.progress.clone();
        e.max_drift_reported = p.state_limits.drift_reported;
        e.max_working_reported = p.state_limits.working_reported;
        e.max_gate_board = p.state_limits.gate_board;
        e.partial_before_start = p.partial_before_start;
        e.normalize = p.normalize_settings();
        e
    }

    /// Ask each component whether its values are allowed; the first that is not is named by its
    /// key (`Config::parse` adds the key's line and column).
    fn check(&self, path: &str) -> Result<(), ConfigError> {
        self.check_keys().map_err(|(key, message)| ConfigError::Invalid { path: path.into(), at: String::new(), key, message })
    }

    /// [`Config::check`] as `Err((key, why))`, the form every component's `check` answers in.
    fn check_keys(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((key.to_string(), why.to_string()));
        self.exporters.check("exporters", self.extensions.file_storage.is_some())?;
        if let Some(o) = &self.exporters.otlp {
            for (key, ep) in [("exporters.otlp.endpoint", &o.endpoint), ("exporters.otlp.metrics_endpoint", &o.metrics_endpoint)] {
                if let Some(msg) = ep.as_deref().and_then(|e| self.export_loop(e)) {
                    return bad(key, &msg);
                }
            }
        }
        if let Some(m) = &self.processors.memory_limiter {
            if let Err((key, message)) = m.check() {
                return bad(&format!("processors.memory_limiter.{key}"), message);
            }
        }
        if self.service.runtime.worker_threads.is_some_and(|n| !(1..=1024).contains(&n)) {
            return bad("service.runtime.worker_threads", "must be from 1 to 1024");
        }
        self.processors.mcp_health.check("processors.mcp_health")?;
        if let Some(storage) = &self.storage {
            storage.check("storage")?;
        }
        self.receivers.check("receivers")?;
        let level = self.service.telemetry.logs.level.to_ascii_lowercase();
        if !["error", "warn", "info", "debug", "trace", "off"].contains(&level.as_str()) {
            return bad("service.telemetry.logs.level", "must be one of error, warn, info, debug, trace, off");
        }
        // A misspelled encoding must not silently give console lines to a JSON log pipeline.
        if !["console", "json"].contains(&self.service.telemetry.logs.encoding.as_str()) {
            return bad("service.telemetry.logs.encoding", "must be console or json");
        }
        if let Some(h) = &self.extensions.health_check {
            h.check("extensions.health_check")?;
        }
        if let Some(g) = &self.extensions.gate {
            g.check("extensions.gate")?;
        }
        Ok(())
    }
}

impl CorrelateConfig {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`processors.mcp_health`).
    fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((format!("{key_prefix}{key}"), why.to_string()));
        if self.decision_wait.is_zero() {
            return bad(".decision_wait", "must be greater than zero");
        }
        if self.max_wait < self.decision_wait {
            return bad(".max_wait", "must not be shorter than decision_wait");
        }
        if self.max_chains == Some(0) || self.queue_size == 0 || self.max_spans_per_chain == 0 {
            return bad("", "max_chains, queue_size and max_spans_per_chain must be at least 1");
        }
        if let Err(e) = crate::evidence::receipt::TrustedKeys::parse(&self.receipts.trusted_keys) {
            return bad(".receipts.trusted_keys", &e.to_string());
        }
        for (key, limit) in self.state_limits.entries() {
            if limit == 0 {
                return bad(&format!(".limits.{key}"), "must be at least 1");
            }
        }
        Ok(())
    }
}

impl HealthCheck {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`extensions.health_check`).
    fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        check_listener(key_prefix, self.connections(), None)?;
        check_endpoint(&format!("{key_prefix}.endpoint"), &self.endpoint, 13133)?;
        if self.exporter_failure_threshold.is_zero() {
            return Err((format!("{key_prefix}.exporter_failure_threshold"), "must be greater than zero (e.g. 30s)".into()));
        }
        if let Some(why) = self.status.as_ref().and_then(|s| s.trace_url.as_deref()).and_then(StatusPage::trace_url_problem) {
            return Err((format!("{key_prefix}.status.trace_url"), why.into()));
        }
        Ok(())
    }
}

impl Config {
    /// The runtime's threads (`service.runtime.worker_threads`). Unset: one, with a `storage`
    /// too.
    ///
    /// One, because the engine is one thread whatever this says, and a request walked on one
    /// core and judged on another cost 1.3–1.47x the CPU per span (every span's evidence made on
    /// one core, then read and freed on the other; the throughput bench, same run), while one
    /// instance took the same rate either way (the engine's thread was its limit). With a store
    /// as well: where the engine's store operations block its thread (an answer awaited, a
    /// store timeout, an embedded store's write), the runtime's other tasks are handed to
    /// another thread meanwhile, so the receivers still answer (busy, retryably). Two threads
    /// by default with a store cost one instance on Redis the same 1.47x. More help where
    /// receiving itself is the load: many TLS handshakes, compressed requests.
    pub fn worker_threads(&self) -> usize {
        self.service.runtime.worker_threads.unwrap_or(1)
    }

    /// Where the OTLP exporter's queue of mcp-health's own output is kept on disk, if it is:
    /// `sending_queue.storage` (a directory, or `file_storage` for the extension's
    /// `<directory>/sending_queue`), else `<storage.directory>/sending_queue` with the embedded
    /// store. Never with the queue switched off, nor for the Redis store (no local directory).
    pub fn sending_queue_directory(&self) -> Option<std::path::PathBuf> {
        let q = &self.exporters.otlp.as_ref()?.sending_queue;
        if !q.enabled {
            return None;
        }
        match q.storage.as_deref() {
            Some("file_storage") => self.extensions.file_storage.as_ref().map(|f| f.directory.join("sending_queue")),
            Some(dir) => Some(dir.into()),
            None => match &self.storage {
                Some(Storage::Embedded { directory, .. }) => Some(directory.join("sending_queue")),
                _ => None,
            },
        }
    }

    /// Why an exporter sending to `endpoint` would send into one of this service's own receivers
    /// (an export loop), if it would: the same port, and the same host or two names of this
    /// machine (`localhost`, `127.0.0.1`, `::1`, or a receiver on `0.0.0.0` / `::`, which listens on
    /// every address). A host that only resolves to this machine through DNS is not caught here;
    /// the marker on what mcp-health sends catches that loop when it happens (`flow::loops`).
    pub fn export_loop(&self, endpoint: &str) -> Option<String> {
        let (eh, eport) = host_port(endpoint)?;
        let p = &self.receivers.otlp.protocols;
        let receivers = [
            ("receivers.otlp.protocols.grpc.endpoint", p.grpc.as_ref().map(|g| g.endpoint.as_str())),
            ("receivers.otlp.protocols.http.endpoint", p.http.as_ref().map(|h| h.endpoint.as_str())),
        ];
        receivers.into_iter().find_map(|(key, r)| {
            let (rh, rport) = host_port(r?)?;
            let local = |h: &str| h == "localhost" || h.ends_with(".localhost") || h == "::1" || h.starts_with("127.");
            let any = |h: &str| h == "0.0.0.0" || h == "::";
            let same = rport == eport && (rh == eh || ((local(&rh) || any(&rh)) && (local(&eh) || any(&eh))));
            same.then(|| {
                format!(
                    "{endpoint} is this service's own receiver ({key}: {}): everything exported would come back in and be sent again; point the exporter at the upstream collector",
                    r.unwrap_or_default()
                )
            })
        })
    }
}

/// Host (lowercase, IPv6 without brackets) and port of `host:port` or a URL
/// (`http[s]://[user@]host:port/path`); `None` without an explicit port.
fn host_port(s: &str) -> Option<(String, u16)> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, p) = v6.split_once(']')?;
            (h, p.strip_prefix(':')?)
        }
        None => authority.rsplit_once(':')?,
    };
    Some((host.to_ascii_lowercase(), port.parse().ok()?))
}

fn strip_location(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// Apply `--set key=value` overrides to a YAML document (see [`Config::load_with`]).
pub fn apply_sets(text: &str, sets: &[String]) -> Result<String, ConfigError> {
    use serde_yaml_ng::{Mapping, Value};
    let bad = |arg: &str, message: &str| ConfigError::Set { arg: arg.to_string(), message: message.to_string() };
    let mut doc: Value =
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml { path: "<config>".into(), message: e.to_string() })?;
    if doc.is_null() {
        doc = Value::Mapping(Mapping::new());
    }
    for arg in sets {
        let Some((key, raw)) = arg.split_once('=') else { return Err(bad(arg, "give key=value")) };
        let parts: Vec<&str> = key.trim().split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(bad(arg, "the key is a dotted path such as receivers.otlp.protocols.grpc.endpoint"));
        }
        // A scalar, as YAML reads it; anything that is not one (a flow map, a list) stays text.
        let value = match serde_yaml_ng::from_str::<Value>(raw) {
            Ok(v @ (Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Null)) => v,
            _ => Value::String(raw.to_string()),
        };
        let mut node = &mut doc;
        for (i, part) in parts.iter().enumerate() {
            let Value::Mapping(map) = node else {
                return Err(bad(arg, &format!("{} is not a map", parts[..i].join("."))));
            };
            let k = Value::String(part.to_string());
            if i + 1 == parts.len() {
                map.insert(k, value.clone());
                break;
            }
            let child = map.entry(k).or_insert_with(|| Value::Mapping(Mapping::new()));
            // `grpc:` with nothing under it reads as null: it becomes a map.
            if child.is_null() {
                *child = Value::Mapping(Mapping::new());
            }
            node = child;
        }
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| bad("", &e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receive::listen::ConnectionLimits;

    /// Issue 11: the embedded default sizes its chain table from memory, not a count: the byte
    /// bound decides (a count of 100 k evicted most chains at ~150 k spans/s).
    #[test]
    fn the_chain_table_is_sized_from_memory_unless_a_count_is_given() {
        let d = Config::load(None).unwrap().processors.mcp_health;
        assert_eq!(d.max_chains, None);
        assert_eq!(d.limits().max_chains, d.max_bytes / 1024);
        assert_eq!(d.limits().max_chains, 262_144);
        let c = Config::parse("c", "processors:\n  mcp_health:\n    max_chains: 5\n", &|_| None).unwrap();
        assert_eq!(c.processors.mcp_health.limits().max_chains, 5);
    }

    /// One runtime thread unless told otherwise (the walk beside the engine), with a store too
    /// (its blocking operations hand the receivers to another thread meanwhile), and a number
    /// out of range refused by name.
    #[test]
    fn one_runtime_thread_by_default_with_a_store_too() {
        assert_eq!(Config::load(None).unwrap().worker_threads(), 1);
        let with_store = Config::parse("c", "storage:\n  directory: /var/lib/mcp-health\n", &|_| None).unwrap();
        assert_eq!(with_store.worker_threads(), 1);
        let told = Config::parse("c", "storage:\n  directory: /x\nservice:\n  runtime:\n    worker_threads: 4\n", &|_| None).unwrap();
        assert_eq!(told.worker_threads(), 4);
        let e = Config::parse("c", "service:\n  runtime:\n    worker_threads: 0\n", &|_| None).unwrap_err();
        assert!(e.to_string().contains("service.runtime.worker_threads"), "{e}");
    }

    /// Fan-out is the default layout: an `otlp` exporter passes received spans on only when
    /// `passthrough: true` is written, in a file or with `--set`; the embedded default given an
    /// endpoint sends only what mcp-health adds (the collector already sends every span to the
    /// backend).
    #[test]
    fn passthrough_is_off_unless_asked_for() {
        let c = Config::parse("c", "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:24317\n", &|_| None).unwrap();
        assert!(!c.exporters.otlp.as_ref().unwrap().passthrough);
        let c =
            Config::parse("c", "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:24317\n    passthrough: true\n", &|_| None).unwrap();
        assert!(c.exporters.otlp.as_ref().unwrap().passthrough);
        let ep = ["exporters.otlp.endpoint=http://127.0.0.1:24317".to_string()];
        let d = Config::parse("default", &apply_sets(DEFAULT_CONFIG, &ep).unwrap(), &|_| None).unwrap();
        assert!(!d.exporters.otlp.as_ref().unwrap().passthrough, "the embedded default with an endpoint is fan-out");
        let inline = [ep[0].clone(), "exporters.otlp.passthrough=true".to_string()];
        let d = Config::parse("default", &apply_sets(DEFAULT_CONFIG, &inline).unwrap(), &|_| None).unwrap();
        assert!(d.exporters.otlp.as_ref().unwrap().passthrough);
    }

    fn env(k: &str) -> Option<String> {
        match k {
            "UPSTREAM" => Some("http://127.0.0.1:9999".into()),
            _ => None,
        }
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::parse("default", DEFAULT_CONFIG, &env).unwrap();
        assert!(c.receivers.otlp.protocols.grpc.is_some());
        assert!(c.exporters.otlp.is_none(), "default needs no upstream");
        assert!(c.exporters.prometheus.is_some());
        assert!(c.exporters.verdict_log.is_some());
    }

    #[test]
    fn env_substitution_forms() {
        let t = "a: ${env:UPSTREAM}\nb: ${UPSTREAM}\nc: ${env:NOPE:-fallback}\nd: $$literal\n";
        let s = substitute_env("x", t, &env).unwrap();
        assert_eq!(s, "a: http://127.0.0.1:9999\nb: http://127.0.0.1:9999\nc: fallback\nd: $literal\n");
        let e = substitute_env("x", "a: 1\nb: ${env:NOPE}\n", &env).unwrap_err();
        assert!(e.to_string().contains("NOPE") && e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let t = "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpont: 127.0.0.1:4317\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("endpont") && e.contains("line 5"), "{e}");
    }

    #[test]
    fn storage_directory_parses_and_unknown_keys_are_rejected() {
        let c = Config::parse("c.yaml", "storage:\n  directory: /var/lib/mcp-health\n", &env).unwrap();
        assert_eq!(c.storage, Some(Storage::Embedded { directory: "/var/lib/mcp-health".into(), journal_max_bytes: JOURNAL_MAX_BYTES }));
        let c = Config::parse("c.yaml", "storage:\n  kind: embedded\n  directory: /d\n", &env).unwrap();
        assert_eq!(c.storage, Some(Storage::Embedded { directory: "/d".into(), journal_max_bytes: JOURNAL_MAX_BYTES }));
        assert_eq!(Config::parse("c.yaml", "{}", &env).unwrap().storage, None, "absent = in memory");
        let e = Config::parse("c.yaml", "storage:\n  dir: /x\n", &env).unwrap_err().to_string();
        assert!(e.contains("dir"), "{e}");
        let e = Config::parse("c.yaml", "storage:\n  directory: ''\n", &env).unwrap_err().to_string();
        assert!(e.contains("storage.directory"), "{e}");
        // The documented example, uncommented, is accepted.
        let doc =
            include_str!("../../otel-config/mcp-health.yaml").replace("# storage:", "storage:").replace("#   directory:", "  directory:");
        assert!(Config::parse("doc", &doc, &env).unwrap().storage.is_some());
    }

    #[test]
    fn storage_redis_parses_is_checked_and_never_shows_its_password() {
        let t = "storage:\n  kind: redis\n  endpoint: redis://:planted-pw-81@127.0.0.1:6390/0\n  timeout: 250ms\n";
        let c = Config::parse("c.yaml", t, &env).unwrap();
        let Some(Storage::Redis { endpoint, timeout, retry_after, tombstone_ttl, .. }) = &c.storage else { panic!("{:?}", c.storage) };
        assert_eq!(
            (endpoint.0.as_str(), *timeout, *retry_after, *tombstone_ttl),
            ("redis://:planted-pw-81@127.0.0.1:6390/0", Duration::from_millis(250), Duration::from_secs(1), Duration::from_secs(3600))
        );
        // The whole configuration, printed as a failed test or a debug log would print it.
        let shown = format!("{c:?} {c:#?}");
        assert!(!shown.contains("planted-pw-81") && shown.contains("redis://:***@127.0.0.1:6390/0"), "{shown}");
        let bad_cases = [
            ("storage:\n  kind: redis\n", "endpoint"),
            ("storage:\n  kind: redis\n  endpoint: redis://h:1\n  directory: /x\n", "directory"),
            ("storage:\n  directory: /x\n  endpoint: redis://h:1\n", "kind: redis"),
            ("storage:\n  kind: etcd\n  endpoint: x\n", "unknown storage kind"),
            ("storage:\n  kind: redis\n  endpoint: redis://h:1\n  passwd: x\n", "passwd"),
            ("storage:\n  kind: redis\n  endpoint: http://:planted-pw-81@h:1\n", "storage.endpoint"),
            ("storage:\n  kind: redis\n  endpoint: redis://h:1\n  timeout: 0s\n", "greater than zero"),
            ("storage: {}\n", "directory"),
            ("storage:\n  kind: redis\n  endpoint: redis://h:1\n  state_protocol: 3\n", "newer than this build speaks"),
            ("storage:\n  directory: /x\n  state_protocol: 0\n", "kind: redis"),
        ];
        for (text, want) in bad_cases {
            let e = Config::parse("c.yaml", text, &env).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains("planted-pw-81"), "{text}: {e}");
        }
        let old = Config::parse("c.yaml", "storage:\n  kind: redis\n  endpoint: redis://h:1\n  state_protocol: 0\n", &env).unwrap();
        assert!(matches!(old.storage, Some(Storage::Redis { state_protocol: Some(0), .. })), "{:?}", old.storage);
        assert!(matches!(c.storage, Some(Storage::Redis { state_protocol: None, .. })), "unset: this build's");
        // The documented example, uncommented, is accepted.
        let doc = include_str!("../../otel-config/mcp-health.yaml")
            .replace("# storage:", "storage:")
            .replace("#   kind: redis", "  kind: redis")
            .replace("#   endpoint: ${env:MCP_HEALTH_REDIS", "  endpoint: ${env:MCP_HEALTH_REDIS");
        assert!(matches!(Config::parse("doc", &doc, &env).unwrap().storage, Some(Storage::Redis { .. })), "{doc}");
    }

    #[test]
    fn gate_extension_parses_and_is_checked() {
        let t = "extensions:\n  gate:\n    unpinned: deny\n";
        let c = Config::parse("c.yaml", t, &env).unwrap();
        let g = c.extensions.gate.unwrap();
        assert_eq!((g.endpoint.as_str(), g.unpinned, g.tls), ("127.0.0.1:4320", crate::gate::UnpinnedPolicy::Deny, None));
        assert_eq!(Config::parse("c.yaml", "{}", &env).unwrap().extensions.gate, None, "absent = gate off");
        let e = Config::parse("c.yaml", "extensions:\n  gate:\n    unpinned: maybe\n", &env).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        let e = Config::parse("c.yaml", "extensions:\n  gate:\n    endpoint: localhost\n", &env).unwrap_err().to_string();
        assert!(e.contains("extensions.gate.endpoint"), "{e}");
    }

    /// Issue 10: every listener has the same timeout and limit keys (defaults 10s / 60s / 4096),
    /// checked; `tls` reads its files when the configuration is checked and names the key.
    #[test]
    fn listeners_take_timeouts_limits_and_tls() {
        let t = "receivers:\n  otlp:\n    protocols:\n      grpc:\n        read_header_timeout: 2s\n        max_connections: 7\n      http:\nextensions:\n  health_check:\n    idle_timeout: 5s\n";
        let c = Config::parse("c.yaml", t, &env).unwrap();
        let g = c.receivers.otlp.protocols.grpc.unwrap().connections();
        assert_eq!((g.read_header_timeout, g.idle_timeout, g.max_connections), (Duration::from_secs(2), Duration::from_secs(60), 7));
        assert_eq!(c.receivers.otlp.protocols.http.unwrap().connections(), ConnectionLimits::default());
        assert_eq!(c.extensions.health_check.unwrap().connections().idle_timeout, Duration::from_secs(5));
        for (bad, key) in [
            ("exporters:\n  prometheus:\n    max_connections: 0\n", "exporters.prometheus.max_connections"),
            ("extensions:\n  gate:\n    idle_timeout: 0s\n", "extensions.gate.idle_timeout"),
            ("receivers:\n  otlp:\n    protocols:\n      http:\n        tls:\n", "receivers.otlp.protocols.http.tls.cert_file"),
            ("receivers:\n  otlp:\n    protocols:\n      http:\n        tls: {cert_file: /nope.pem, key_file: /nope.key}\n", "/nope.pem"),
        ] {
            let e = Config::parse("c.yaml", bad, &env).unwrap_err().to_string();
            assert!(e.contains(key), "{bad:?}: {e}");
        }
        // Plaintext only: the Prometheus endpoint and the health check take no `tls`.
        assert!(Config::parse("c.yaml", "extensions:\n  health_check:\n    tls: {}\n", &env).is_err());
        // The documented TLS keys, uncommented, are real keys: the sample paths are what fails.
        let doc = include_str!("../../otel-config/mcp-health.yaml")
            .replacen("        # tls:  ", "        tls:    ", 1)
            .replacen("        #   cert_file:", "          cert_file:", 1)
            .replacen("        #   key_file:", "          key_file:", 1)
            .replacen("        #   client_ca_file:", "          client_ca_file:", 1)
            .replacen("        #   min_version:", "          min_version:", 1)
            .replacen("        #   max_version:", "          max_version:", 1);
        let e = Config::parse("doc", &doc, &env).unwrap_err().to_string();
        assert!(e.contains("receivers.otlp.protocols.grpc.tls.cert_file") && e.contains("/etc/mcp-health/tls/server.pem"), "{e}");
    }

    /// Issue 10: a misspelled log level silently disabled every log; a message size of 2^44 MiB
    /// passed and made every request too large; `localhost:4317` was refused.
    #[test]
    fn log_levels_message_sizes_and_host_names_are_checked() {
        let e = Config::parse("c.yaml", "service:\n  telemetry:\n    logs:\n      level: warning\n", &env).unwrap_err().to_string();
        assert!(e.contains("service.telemetry.logs.level"), "{e}");
        let t = "receivers:\n  otlp:\n    protocols:\n      grpc:\n        max_recv_msg_size_mib: 17592186044416\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("max_recv_msg_size_mib"), "{e}");
        let t = "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: localhost:4317\n";
        assert!(Config::parse("c.yaml", t, &env).is_ok());
        for bad in ["localhost", ":4317", "local host:1", "a..b:1", "x:99999"] {
            assert!(!listen_address_ok(bad), "{bad}");
        }
        for good in ["127.0.0.1:4317", "[::1]:4317", "localhost:4317", "mcp-health.ns.svc:4317"] {
            assert!(listen_address_ok(good), "{good}");
        }
    }

    /// `service.telemetry.metrics.level` takes the collector's four levels, `normal` by default;
    /// anything else is an error that names the key.
    #[test]
    fn the_metrics_level_is_one_of_the_collectors() {
        let level = |v: &str| Config::parse("c.yaml", &format!("service:\n  telemetry:\n    metrics:\n      level: {v}\n"), &env);
        assert_eq!(Config::parse("c.yaml", "{}", &env).unwrap().service.telemetry.metrics.level, MetricsLevel::Normal);
        for (v, want) in [
            ("none", MetricsLevel::None),
            ("basic", MetricsLevel::Basic),
            ("normal", MetricsLevel::Normal),
            ("detailed", MetricsLevel::Detailed),
        ] {
            assert_eq!(level(v).unwrap().service.telemetry.metrics.level, want, "{v}");
            assert_eq!(want.as_str(), v);
        }
        for bad in ["verbose", "Normal", "1"] {
            let e = level(bad).unwrap_err().to_string();
            assert!(e.contains("metrics") && e.contains("level"), "{bad}: {e}");
        }
    }

    /// Issue 10: `service.telemetry.logs.encoding` is the collector's key; console by default,
    /// json on request, anything else an error named by its key (not console lines in silence).
    #[test]
    fn the_log_encoding_is_console_or_json() {
        let enc = |v: &str| Config::parse("c.yaml", &format!("service:\n  telemetry:\n    logs:\n      encoding: {v}\n"), &env);
        assert_eq!(Config::parse("c.yaml", "{}", &env).unwrap().service.telemetry.logs.encoding, "console");
        assert_eq!(enc("json").unwrap().service.telemetry.logs.encoding, "json");
        assert_eq!(enc("console").unwrap().service.telemetry.logs.encoding, "console");
        for bad in ["JSON", "text", "logfmt"] {
            let e = enc(bad).unwrap_err().to_string();
            assert!(e.contains("service.telemetry.logs.encoding") && e.contains("console or json"), "{bad}: {e}");
        }
    }

    /// Issue 10: an exporter pointed at one of mcp-health's own receivers makes everything loop;
    /// `validate` (and the start) refuse it, across the names of this machine.
    #[test]
    fn an_exporter_pointed_at_an_own_receiver_is_refused() {
        let cfg = |recv: &str, exp: &str, key: &str| {
            format!("receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: \"{recv}\"\n      http:\n        endpoint: 127.0.0.1:4318\nexporters:\n  otlp:\n    {key}: \"{exp}\"\n")
        };
        for (recv, exp) in [
            ("127.0.0.1:4317", "http://127.0.0.1:4317"),
            ("127.0.0.1:4317", "localhost:4317"),
            ("0.0.0.0:4317", "http://localhost:4317"),
            ("localhost:4317", "https://127.0.0.1:4317/"),
            ("[::]:4317", "http://[::1]:4317"),
            ("0.0.0.0:4317", "http://0.0.0.0:4317"),
            ("collector.internal:4317", "http://Collector.Internal:4317"),
        ] {
            for key in ["endpoint", "metrics_endpoint"] {
                match Config::parse("c.yaml", &cfg(recv, exp, key), &env) {
                    Err(ConfigError::Invalid { key: k, message, .. }) => {
                        assert_eq!(k, format!("exporters.otlp.{key}"));
                        assert!(
                            message.contains("own receiver") && message.contains("receivers.otlp.protocols.grpc.endpoint"),
                            "{message}"
                        );
                    }
                    other => panic!("{recv} <- {exp} ({key}): {other:?}"),
                }
            }
        }
        // The HTTP receiver too, through an HTTP exporter's base URL.
        let t = cfg("127.0.0.1:4317", "http://127.0.0.1:4318/v1/traces", "endpoint");
        assert!(
            matches!(Config::parse("c.yaml", &t, &env), Err(ConfigError::Invalid { message, .. }) if message.contains("protocols.http"))
        );
        // Another port, or another host: fine.
        for (recv, exp) in [
            ("127.0.0.1:4317", "http://127.0.0.1:14317"),
            ("0.0.0.0:4317", "http://collector:4317"),
            ("10.0.0.1:4317", "http://127.0.0.1:4317"),
        ] {
            Config::parse("c.yaml", &cfg(recv, exp, "endpoint"), &env).unwrap_or_else(|e| panic!("{recv} <- {exp}: {e}"));
        }
    }

    #[test]
    fn the_memory_limiter_takes_the_collector_keys() {
        let t = "processors:\n  memory_limiter:\n    check_interval: 2s\n    limit_mib: 512\n    spike_limit_mib: 128\n";
        let m = Config::parse("c.yaml", t, &env).unwrap().processors.memory_limiter.unwrap();
        assert_eq!((m.check_interval, m.limit_mib, m.spike_limit_mib), (Duration::from_secs(2), Some(512), Some(128)));
        for (bad, key) in [
            ("processors:\n  memory_limiter:\n", "limit_mib"),
            ("processors:\n  memory_limiter:\n    limit_mib: 100\n    spike_limit_mib: 100\n", "spike_limit_mib"),
        ] {
            let e = Config::parse("c.yaml", bad, &env).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
        assert!(Config::parse("c.yaml", "{}", &env).unwrap().processors.memory_limiter.is_none(), "off unless configured");
    }

    /// Issue 10: `protocols: {grpc:, http:}` and `health_check:` (empty values) disabled the
    /// receivers and the health check while `validate` said ok. Empty means defaults.
    #[test]
    fn an_empty_component_is_on_with_its_defaults() {
        let t = "receivers:\n  otlp:\n    protocols:\n      grpc:\n      http:\nextensions:\n  health_check:\n  gate:\nexporters:\n  prometheus:\n  verdict_log:\n";
        let c = Config::parse("c.yaml", t, &env).unwrap();
        assert_eq!(c.receivers.otlp.protocols.grpc.as_ref().map(|g| g.endpoint.as_str()), Some("127.0.0.1:4317"));
        assert_eq!(c.receivers.otlp.protocols.http.as_ref().map(|h| h.endpoint.as_str()), Some("127.0.0.1:4318"));
        assert!(c.extensions.health_check.is_some() && c.extensions.gate.is_some());
        assert!(c.exporters.prometheus.is_some());
        assert_eq!(c.exporters.verdict_log.as_ref().map(|v| v.path.as_str()), Some("stdout"));
        // Not named at all: off.
        let c = Config::parse("c.yaml", "receivers:\n  otlp:\n    protocols:\n      grpc:\n", &env).unwrap();
        assert!(c.receivers.otlp.protocols.http.is_none() && c.extensions.gate.is_none());
    }

    #[test]
    fn limits_parse_with_defaults_and_refuse_zero() {
        let c = Config::parse("c.yaml", "{}", &env).unwrap();
        assert_eq!(
            c.processors.mcp_health.state_limits.entries(),
            [
                ("gate_board", 100_000),
                ("digest_cache", 16_384),
                ("tool_definitions", 8_192),
                ("interner", 4_096),
                ("redaction_cache", 4_096),
                ("tap_sessions", 16_384),
                ("operation_keys", 100_000),
                ("parked_verifiers", 10_000),
                ("drift_reported", 100_000),
                ("working_reported", 100_000)
            ]
        );
        let t = "processors:\n  mcp_health:\n    limits:\n      interner: 10\n      gate_board: 5\n";
        let l = Config::parse("c.yaml", t, &env).unwrap().processors.mcp_health.state_limits;
        assert_eq!((l.interner, l.gate_board, l.redaction_cache), (10, 5, 4_096));
        let t = "processors:\n  mcp_health:\n    limits:\n      redaction_cache: 0\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("processors.mcp_health.limits.redaction_cache"), "{e}");
        let t = "processors:\n  mcp_health:\n    limits:\n      interners: 1\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("interners") && e.contains("line 4"), "{e}");
    }

    /// Issue 10: substitution was textual. A value with `#` lost its tail (read as a comment), a
    /// value with a newline injected keys, and `${env:X}` in a comment had to be set. Now each
    /// scalar value is substituted after parsing; the existing forms and typed fields still work.
    #[test]
    fn substitution_is_per_value_after_parsing() {
        let vars = |k: &str| match k {
            "TOK" => Some("Bearer abc #def".to_string()),
            "NL" => Some("svc\n    logs:\n      level: debug\ncompression: none".to_string()),
            "N" => Some("7".to_string()),
            "OFF" => Some("false".to_string()),
            "WAIT" => Some("5s".to_string()),
            "POLICY" => Some("deny".to_string()),
            _ => None,
        };
        let otlp = |extra: &str| format!("exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n{extra}");
        type Check = fn(&Config) -> bool;
        let cases: &[(&str, String, Check)] = &[
            (
                "a value with # keeps it",
                otlp("    headers:\n      authorization: ${env:TOK}\n      plain: x${TOK}y\n"),
                |c| {
                    let h = &c.exporters.otlp.as_ref().unwrap().headers;
                    h["authorization"] == "Bearer abc #def" && h["plain"] == "xBearer abc #defy"
                },
            ),
            (
                "a value with a newline is one value and injects no key",
                "service:\n  telemetry:\n    service_name: ${env:NL}\n".into(),
                |c| {
                    c.service.telemetry.service_name.as_deref() == Some("svc\n    logs:\n      level: debug\ncompression: none")
                        && c.service.telemetry.logs.level == "info"
                },
            ),
            (
                "a reference in a comment is not looked at",
                "# token: ${env:UNSET}\nservice:  # ${UNSET}\n  telemetry:\n    service_name: a # ${env:UNSET:-x}\n".into(),
                |c| c.service.telemetry.service_name.as_deref() == Some("a"),
            ),
            (
                "the existing forms",
                "service:\n  telemetry:\n    service_name: '${env:UPSTREAM}|${UPSTREAM}|${env:UNSET:-fallback}|$$literal|$'\n".into(),
                |c| c.service.telemetry.service_name.as_deref() == Some("http://127.0.0.1:9999|http://127.0.0.1:9999|fallback|$literal|$"),
            ),
            (
                "numbers, booleans, durations and enum values may be references",
                format!(
                    "{}processors:\n  mcp_health:\n    max_chains: ${{env:N}}\n    decision_wait: ${{env:WAIT}}\n    max_wait: ${{env:UNSET:-9s}}\nextensions:\n  gate:\n    unpinned: ${{env:POLICY}}\n",
                    otlp("    passthrough: ${env:OFF}\n")
                ),
                |c| {
                    let p = &c.processors.mcp_health;
                    p.max_chains == Some(7)
                        && p.decision_wait == Duration::from_secs(5)
                        && p.max_wait == Duration::from_secs(9)
                        && !c.exporters.otlp.as_ref().unwrap().passthrough
                        && c.extensions.gate.as_ref().unwrap().unpinned == crate::gate::UnpinnedPolicy::Deny
                },
            ),
            (
                "an optional value that expands to nothing is absent; otherwise it is read as written",
                format!(
                    "{}service:\n  telemetry:\n    service_name: ${{env:UNSET:-}}\n    shutdown_timeout: ${{env:WAIT}}\nprocessors:\n  mcp_health:\n    lockfile: \"${{env:UNSET:-}}\"\n",
                    otlp("    timeout: 3s\n    compression: ${env:UNSET:-gzip}\n    metrics_endpoint: x$${TOK}\n")
                ),
                |c| {
                    let o = c.exporters.otlp.as_ref().unwrap();
                    c.service.telemetry.service_name.is_none()
                        && c.processors.mcp_health.lockfile.is_none()
                        && c.service.telemetry.shutdown_timeout == Some(Duration::from_secs(5))
                        && o.timeout == Some(Duration::from_secs(3))
                        && o.compression.as_deref() == Some("gzip")
                        && o.metrics_endpoint.as_deref() == Some("x${TOK}")
                        && c.storage.is_none()
                },
            ),
        ];
        let both = |k: &str| vars(k).or_else(|| env(k));
        for (name, text, check) in cases {
            match Config::parse("c.yaml", text, &both) {
                Ok(c) => assert!(check(&c), "{name}: {c:#?}"),
                Err(e) => panic!("{name}: {e}"),
            }
        }
        let t = "processors:\n  mcp_health:\n    refresh_policy: {mode: '${env:UNSET:-max_age}', max_age: \"${env:WAIT}\"}\n    progress:\n      tools:\n        t:\n          inactivity: ${env:WAIT}\n          deadline: 1m\n";
        let p = Config::parse("c.yaml", t, &both).unwrap().processors.mcp_health;
        assert_eq!(p.refresh_policy, crate::classify::catalog::RefreshPolicy::MaxAge { max_age: Duration::from_secs(5) });
        assert_eq!(p.progress.clocks(Some("t")).inactivity, Duration::from_secs(5));
        let c = Config::parse("c.yaml", "storage:\n  directory: ${env:UNSET:-/var/lib/x}\n", &both).unwrap();
        assert_eq!(c.storage, Some(Storage::Embedded { directory: "/var/lib/x".into(), journal_max_bytes: JOURNAL_MAX_BYTES }));
        // Keys are taken as written, and a variable that is not set is named with key, line, column.
        let c = Config::parse("c.yaml", &otlp("    headers:\n      ${TOK}: v\n"), &both).unwrap();
        assert!(c.exporters.otlp.unwrap().headers.contains_key("${TOK}"));
        let e = Config::parse("c.yaml", &otlp("    headers:\n      a: ${env:NOPE}\n"), &both).unwrap_err().to_string();
        assert!(e.contains("NOPE") && e.contains("exporters.otlp.headers.a") && e.contains("line 5, column 10"), "{e}");
        let e = Config::parse("c.yaml", "service:\n  telemetry:\n    service_name: ${NOPE}\n", &both).unwrap_err().to_string();
        assert!(e.contains("NOPE") && e.contains("service.telemetry.service_name") && e.contains("line 3, column 19"), "{e}");
        let e = Config::parse("c.yaml", "processors:\n  mcp_health:\n    max_chains: ${env:TOK}\n", &both).unwrap_err().to_string();
        assert!(e.contains("processors.mcp_health.max_chains") && e.contains("line 3, column 17"), "{e}");
    }

    /// Issue 10: errors found after parsing had no line and column.
    #[test]
    fn bad_values_found_after_parsing_name_key_line_and_column() {
        let cases = [
            (
                "processors:\n  mcp_health:\n    decision_wait: 0s\n",
                "line 3, column 5: processors.mcp_health.decision_wait: must be greater",
            ),
            // Flow style too.
            (
                "processors: {mcp_health: {limits: {interner: 0}}}\n",
                "line 1, column 36: processors.mcp_health.limits.interner: must be at least 1",
            ),
            // The key is a default (not written): its nearest written ancestor.
            (
                "processors:\n  mcp_health:\n    decision_wait: 40s\n",
                "line 2, column 3: processors.mcp_health.max_wait: must not be shorter",
            ),
            ("exporters:\n  prometheus:\n    endpoint: nowhere\n", "line 3, column 5: exporters.prometheus.endpoint: must be host:port"),
        ];
        for (text, want) in cases {
            let e = Config::parse("c.yaml", text, &env).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// Issue 10: the exporter's protocol, zstd and client TLS keys; TLS settings with an http://
    /// endpoint are refused (they would be silently unused).
    #[test]
    fn exporter_protocol_compression_and_tls_keys_are_checked() {
        let otlp = |extra: &str| format!("exporters:\n  otlp:\n    endpoint: https://c:4318\n{extra}");
        let t = otlp("    protocol: http/protobuf\n    compression: zstd\n    tls:\n      ca_file: /ca.pem\n      server_name_override: c.internal\n");
        let o = Config::parse("c.yaml", &t, &env).unwrap().exporters.otlp.unwrap();
        assert_eq!((o.protocol.as_deref(), o.compression.as_deref()), (Some("http/protobuf"), Some("zstd")));
        let tls = o.tls.unwrap();
        assert_eq!(
            (tls.ca_file.as_deref(), tls.server_name_override.as_deref()),
            (Some(std::path::Path::new("/ca.pem")), Some("c.internal"))
        );
        for (extra, key) in [
            ("    protocol: thrift\n", "exporters.otlp.protocol"),
            ("    compression: lz4\n", "exporters.otlp.compression"),
            ("    tls:\n      cert_file: /c.pem\n", "exporters.otlp.tls"),
            ("    tls:\n      ca_fil: /c.pem\n", "ca_fil"),
        ] {
            let e = Config::parse("c.yaml", &otlp(extra), &env).unwrap_err().to_string();
            assert!(e.contains(key), "{extra:?}: {e}");
        }
        let plain = "exporters:\n  otlp:\n    endpoint: http://c:4317\n    tls:\n      ca_file: /ca.pem\n";
        let e = Config::parse("c.yaml", plain, &env).unwrap_err().to_string();
        assert!(e.contains("exporters.otlp.tls") && e.contains("http://"), "{e}");
        let plain = "exporters:\n  otlp:\n    endpoint: http://c:4317\n    tls:\n      insecure: true\n";
        assert!(Config::parse("c.yaml", plain, &env).is_ok(), "insecure: true says plaintext on purpose");
    }

    #[test]
    fn the_component_health_keys_default_and_are_checked() {
        let c = Config::parse("c.yaml", "extensions:\n  health_check:\n", &env).unwrap();
        let h = c.extensions.health_check.unwrap();
        assert_eq!((h.exporter_failure_threshold, h.fail_on_component_error), (Duration::from_secs(30), false));
        let t = "extensions:\n  health_check:\n    exporter_failure_threshold: 2s\n    fail_on_component_error: true\n";
        let h = Config::parse("c.yaml", t, &env).unwrap().extensions.health_check.unwrap();
        assert_eq!((h.exporter_failure_threshold, h.fail_on_component_error), (Duration::from_secs(2), true));
        let e =
            Config::parse("c.yaml", "extensions:\n  health_check:\n    exporter_failure_threshold: 0s\n", &env).unwrap_err().to_string();
        assert!(e.contains("extensions.health_check.exporter_failure_threshold"), "{e}");
    }

    #[test]
    fn status_trace_url_is_an_http_url_with_a_trace_id_placeholder() {
        let cfg = |url: &str| format!("extensions:\n  health_check:\n    status:\n      trace_url: '{url}'\n");
        let c = Config::parse("c.yaml", &cfg("https://jaeger.example/trace/{trace_id}"), &env).unwrap();
        let status = c.extensions.health_check.unwrap().status.unwrap();
        assert_eq!(status.trace_url.as_deref(), Some("https://jaeger.example/trace/{trace_id}"));
        assert!(Config::parse("c.yaml", &cfg("http://127.0.0.1:16686/trace/{trace_id}?uiFind=x"), &env).is_ok());
        for (url, words) in [
            ("ftp://jaeger.example/{trace_id}", "http:// or https://"),
            ("javascript:alert(1)//{trace_id}", "http:// or https://"),
            ("https://jaeger.example/trace/", "{trace_id}"),
            ("https:///trace/{trace_id}", "host"),
            ("https://j.example/\"><script>/{trace_id}", "quotes"),
        ] {
            let e = Config::parse("c.yaml", &cfg(url), &env).unwrap_err().to_string();
            assert!(e.contains("extensions.health_check.status.trace_url") && e.contains(words), "{url}: {e}");
        }
        let e = Config::parse("c.yaml", "extensions:\n  health_check:\n    status:\n      trace_link: x\n", &env).unwrap_err().to_string();
        assert!(e.contains("trace_link"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let t = "processors:\n  mcp_health:\n    decision_wait: 10s\n    max_wait: 1s\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("processors.mcp_health.max_wait"), "{e}");
        let t = "processors:\n  mcp_health:\n    decision_wait: soon\n";
        let e = Config::parse("c.yaml", t, &env).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
    }

    /// Collector configurations copied in mean what they mean there: `sending_queue.enabled`
    /// is a known key, `max_elapsed_time: 0` is no limit (not "never retry"), and
    /// `sending_queue.storage` puts the queue of mcp-health's own output on disk.
    #[test]
    fn collector_sending_queue_and_retry_keys() {
        let otlp = |extra: &str| format!("exporters:\n  otlp:\n    endpoint: http://c:4317\n{extra}");
        // enabled: false — one slot, never on disk (not even with storage.directory).
        let t = otlp("    sending_queue:\n      enabled: false\n      queue_size: 500\nstorage:\n  directory: /var/lib/x\n");
        let c = Config::parse("c.yaml", &t, &env).unwrap();
        let q = &c.exporters.otlp.as_ref().unwrap().sending_queue;
        assert_eq!((q.enabled, q.capacity()), (false, 1));
        assert_eq!(c.sending_queue_directory(), None);
        let t = otlp("    sending_queue:\n      enabled: false\n      storage: /q\n");
        let e = Config::parse("c.yaml", &t, &env).unwrap_err().to_string();
        assert!(e.contains("exporters.otlp.sending_queue.storage") && e.contains("enabled: false"), "{e}");
        // enabled: true is the default and keeps the size.
        let c = Config::parse("c.yaml", &otlp("    sending_queue:\n      enabled: true\n      queue_size: 7\n"), &env).unwrap();
        assert_eq!(c.exporters.otlp.unwrap().sending_queue.capacity(), 7);

        // max_elapsed_time: 0 (an integer as the collector's configs write it, or 0s) is no limit.
        for v in ["0", "0s", "'0'"] {
            let t = otlp(&format!("    retry_on_failure:\n      max_elapsed_time: {v}\n"));
            let r = Config::parse("c.yaml", &t, &env).unwrap_or_else(|e| panic!("{v}: {e}")).exporters.otlp.unwrap().retry_on_failure;
            assert!(r.enabled && r.max_elapsed_time.is_zero(), "{v}: {r:?}");
        }

        // Where the queue is kept.
        let dir = |t: &str| Config::parse("c.yaml", t, &env).unwrap().sending_queue_directory();
        assert_eq!(dir(&otlp("")), None, "in memory by default");
        assert_eq!(dir(&otlp("storage:\n  directory: /var/lib/x\n")), Some("/var/lib/x/sending_queue".into()));
        assert_eq!(dir(&otlp("    sending_queue:\n      storage: /q\nstorage:\n  directory: /var/lib/x\n")), Some("/q".into()));
        let ext = "extensions:\n  file_storage:\n    directory: /var/lib/otel\n";
        assert_eq!(
            dir(&format!("{}{ext}", otlp("    sending_queue:\n      storage: file_storage\n"))),
            Some("/var/lib/otel/sending_queue".into())
        );
        assert_eq!(dir(&otlp("storage:\n  kind: redis\n  endpoint: redis://r:6379\n")), None, "no local directory with redis");
        for (extra, want) in [
            ("    sending_queue:\n      storage: file_storage\n", "not configured"),
            ("    sending_queue:\n      storage: file_storage/queue\n", "one file_storage"),
            ("    sending_queue:\n      storage: ''\n", "a directory"),
            ("    sending_queue:\n      storage_max_bytes: 10\n", "storage_max_bytes"),
        ] {
            let e = Config::parse("c.yaml", &otlp(extra), &env).unwrap_err().to_string();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        let c = Config::parse("c.yaml", &otlp("    sending_queue:\n      storage_max_bytes: 2097152\n"), &env).unwrap();
        assert_eq!(c.exporters.otlp.unwrap().sending_queue.storage_max_bytes, 2 << 20);
    }

    /// `limits.gate_board` reaches the engine's board as a value, not through a process-wide
    /// setting: two engines built from two configurations keep their own bounds.
    #[test]
    fn the_gate_board_limit_reaches_the_board_as_a_value() {
        use crate::classify::catalog::{CatalogVerdict, Convergence};
        let verdict = CatalogVerdict {
            convergence: Convergence::Converged,
            reason: "r",
            next_step: "n",
            signal_at_ns: None,
            traversal_start_ns: None,
            traversal_end_ns: None,
            cursor_chain: Vec::new(),
            discovered_digest: None,
            installed_digest: None,
            tool_digests: Vec::new(),
            projection_version: "v",
        };
        let board_of = |c: Config| crate::engine::Engine::new(crate::cli::replay::engine_config(&c)).board();
        let small = board_of(Config::parse("c", "processors:\n  mcp_health:\n    limits:\n      gate_board: 1\n", &env).unwrap());
        let default = board_of(Config::load(None).unwrap());
        for board in [&small, &default] {
            board.publish("session:a", None, verdict.clone());
            board.publish("session:b", None, verdict.clone());
        }
        assert!(small.get("session:a").is_none() && small.get("session:b").is_some(), "gate_board: 1 keeps the newest only");
        assert!(default.get("session:a").is_some() && default.get("session:b").is_some(), "the default keeps both");
    }

    /// Each component's check names its keys under the prefix it is given, with the messages
    /// `Config::parse` reports.
    #[test]
    fn each_component_checks_its_own_keys_under_its_prefix() {
        let c = Config::load(None).unwrap();
        let mut gate: GateConfig = serde_yaml_ng::from_str("{}").unwrap();
        gate.max_connections = 0;
        assert_eq!(gate.check("x.gate"), Err(("x.gate.max_connections".to_string(), "must be from 1 to 1048576".to_string())));
        let mut receivers = c.receivers.clone();
        if let Some(g) = receivers.otlp.protocols.grpc.as_mut() {
            g.endpoint = "nowhere".into();
        }
        let e = receivers.check("r").unwrap_err();
        assert_eq!(e.0, "r.otlp.protocols.grpc.endpoint", "{e:?}");
        let storage = Storage::Embedded { directory: "".into(), journal_max_bytes: JOURNAL_MAX_BYTES };
        assert_eq!(storage.check("storage").unwrap_err().0, "storage.directory");
        let exporters: Exporters = serde_yaml_ng::from_str("otlp:\n  compression: lz4\n").unwrap();
        assert_eq!(exporters.check("exporters", false).unwrap_err().0, "exporters.otlp.compression");
    }
}
