//! Where each signal goes and how: the exporter's configuration merged with the OTLP exporter
//! specification's environment variables, resolved once at start.
//!
//! Precedence, per setting: the configuration file, then the signal's variable
//! (`OTEL_EXPORTER_OTLP_TRACES_*`, `..._METRICS_*`), then the generic one (`OTEL_EXPORTER_OTLP_*`),
//! then the default. For OTLP/HTTP a generic endpoint (`exporters.otlp.endpoint`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) is a base URL that gets `/v1/<signal>` appended; a signal's own
//! endpoint (`exporters.otlp.metrics_endpoint`, `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`) is used as
//! it is. Log records (incident records, pass-through logs) follow the traces settings, at
//! `/v1/logs` (or `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`).
//!
//! Where this differs from the specification, on purpose: the default protocol stays `grpc` (what
//! mcp-health always spoke; the specification's default is `http/protobuf`), and an endpoint
//! without a scheme is plaintext unless TLS settings are given (the specification and the
//! collector default to TLS there), so existing configurations keep working. Settings that ask for
//! TLS with an `http://` endpoint are refused rather than silently unused.

use std::sync::Arc;
use std::time::Duration;

use crate::emit::config::OtlpExporter;
use crate::emit::tls_client::TlsClientError;

/// The wire format of one signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Grpc,
    HttpProtobuf,
    HttpJson,
}

impl Protocol {
    pub(crate) fn parse(s: &str) -> Option<Protocol> {
        match s.trim() {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            "http/json" => Some(Protocol::HttpJson),
            _ => None,
        }
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
    pub(crate) fn is_http(self) -> bool {
        self != Protocol::Grpc
    }
}

/// Request compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub(crate) fn parse(s: &str) -> Option<Compression> {
        match s.trim() {
            "none" | "" => Some(Compression::None),
            "gzip" => Some(Compression::Gzip),
            "zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// The signals a target serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    fn path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
        }
    }
    fn var(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        }
    }
}

/// Everything needed to send one signal.
#[derive(Clone)]
pub(crate) struct Target {
    pub protocol: Protocol,
    /// gRPC: `http[s]://host:port`; HTTP: the full URL, path included.
    pub url: String,
    /// Set when the connection is TLS.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub server_name: Option<rustls::pki_types::ServerName<'static>>,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub compression: Compression,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: never printed.
        f.debug_struct("Target")
            .field("protocol", &self.protocol)
            .field("url", &self.url)
            .field("tls", &self.tls.is_some())
            .field("server_name", &self.server_name)
            .field("headers", &self.headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("compression", &self.compression)
            .finish()
    }
}

/// One target per signal; a signal without an endpoint has none.
#[derive(Clone, Debug, Default)]
pub(crate) struct Targets {
    pub traces: Option<Target>,
    pub metrics: Option<Target>,
    pub logs: Option<Target>,
}

/// Why the exporter's settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("{var}: {value:?} is not one of {allowed}")]
    BadValue { var: String, value: String, allowed: &'static str },
    #[error("{0}: TLS settings with an http:// endpoint would be unused; use https:// (or tls.insecure: true for plaintext)")]
    TlsWithHttp(String),
    #[error("exporter TLS ({0}): {1}")]
    Tls(String, TlsClientError),
    /// An endpoint with a scheme the exporter cannot send to (`unix://`): named, not sent to
    /// `http://` with the path as its host. Only the scheme is shown (the rest may hold credentials).
    #[error("exporter endpoint: the {0}:// scheme is not supported (use http://, https:// or host:port)")]
    Scheme(String),
}

/// Resolve the targets of `o` with the variables `env` reads (empty values count as unset).
pub(crate) fn resolve(o: &OtlpExporter, env: &dyn Fn(&str) -> Option<String>) -> Result<Targets, TargetError> {
    let var = |name: String| env(&name).filter(|v| !v.trim().is_empty()).map(|v| (name, v));
    let generic = o.endpoint.clone().or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT".into()).map(|(_, v)| v));
    let traces_own = if o.endpoint.is_some() { None } else { var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT".into()).map(|(_, v)| v) };
    let traces = build(o, env, Signal::Traces, Signal::Traces, traces_own, generic.clone())?;
    let metrics_own = o.metrics_endpoint.clone().or_else(|| var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT".into()).map(|(_, v)| v));
    // Only a traces endpoint given: metrics go there too, as they always did.
    let metrics_own = metrics_own.or_else(|| match (&generic, &traces) {
        (None, Some(t)) => Some(sibling(t, Signal::Metrics)),
        _ => None,
    });
    let metrics = build(o, env, Signal::Metrics, Signal::Metrics, metrics_own, generic.clone())?;
    let logs_own = var("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT".into()).map(|(_, v)| v).or_else(|| match (&generic, &traces) {
        (None, Some(t)) => Some(sibling(t, Signal::Logs)),
        _ => None,
    });
    // Logs take the traces settings (protocol, headers, TLS...): only their URL differs.
    let logs = build(o, env, Signal::Traces, Signal::Logs, logs_own, generic)?;
    Ok(Targets { traces, metrics, logs })
}

/// The URL of another signal beside a signal-specific one (`.../v1/traces` → `.../v1/metrics`);
/// for gRPC the same endpoint.
fn sibling(t: &Target, s: Signal) -> String {
    match t.url.strip_suffix(Signal::Traces.path()) {
        Some(base) if t.protocol.is_http() => format!("{base}{}", s.path()),
        _ => t.url.clone(),
    }
}

/// The target of `path`'s signal, with the settings (variables) of `signal`.
fn build(
    o: &OtlpExporter,
    env: &dyn Fn(&str) -> Option<String>,
    signal: Signal,
    path: Signal,
    own: Option<String>,
    generic: Option<String>,
) -> Result<Option<Target>, TargetError> {
    // The setting's signal variable, else the generic one: (name, value).
    let pick = |key: &str| -> Option<(String, String)> {
        [format!("OTEL_EXPORTER_OTLP_{}_{key}", signal.var()), format!("OTEL_EXPORTER_OTLP_{key}")]
            .into_iter()
            .find_map(|n| env(&n).filter(|v| !v.trim().is_empty()).map(|v| (n, v)))
    };
    let protocol = match &o.protocol {
        Some(p) => Protocol::parse(p).ok_or_else(|| bad("exporters.otlp.protocol", p, "grpc, http/protobuf, http/json"))?,
        None => match pick("PROTOCOL") {
            Some((n, v)) => Protocol::parse(&v).ok_or_else(|| bad(&n, &v, "grpc, http/protobuf, http/json"))?,
            None => Protocol::Grpc,
        },
    };
    let (endpoint, appended) = match (own, generic) {
        (Some(e), _) => (e, false),
        (None, Some(g)) => (g, true),
        (None, None) => return Ok(None),
    };
    let compression = match &o.compression {
        Some(c) => Compression::parse(c).ok_or_else(|| bad("exporters.otlp.compression", c, "gzip, zstd, none"))?,
        None => match pick("COMPRESSION") {
            Some((n, v)) => Compression::parse(&v).ok_or_else(|| bad(&n, &v, "gzip, zstd, none"))?,
            None => Compression::None,
        },
    };
    let timeout = match o.timeout {
        Some(t) => t,
        None => match pick("TIMEOUT") {
            Some((n, v)) => Duration::from_millis(v.trim().parse().map_err(|_| bad(&n, &v, "a number of milliseconds"))?),
            None => Duration::from_secs(10),
        },
    };
    let mut headers = pick("HEADERS").map(|(_, h)| parse_otel_headers(&h)).unwrap_or_default();
    for (k, v) in &o.headers {
        headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(k));
        headers.push((k.to_ascii_lowercase(), v.clone()));
    }
    // TLS: the file's `tls` block, each file falling back to its variable.
    let mut tls = o.tls.clone().unwrap_or_default();
    let from_env = o.tls.is_none();
    tls.ca_file = tls.ca_file.or_else(|| pick("CERTIFICATE").map(|(_, v)| v.into()));
    tls.cert_file = tls.cert_file.or_else(|| pick("CLIENT_CERTIFICATE").map(|(_, v)| v.into()));
    tls.key_file = tls.key_file.or_else(|| pick("CLIENT_KEY").map(|(_, v)| v.into()));
    if from_env {
        if let Some((n, v)) = pick("INSECURE") {
            tls.insecure = match v.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(bad(&n, &v, "true, false")),
            };
        }
    }
    // A base URL loses a trailing `/` before the signal's path is appended; a signal's own URL is kept.
    let endpoint = if appended { endpoint.trim().trim_end_matches('/') } else { endpoint.trim() }.to_string();
    if let Some((scheme, _)) = endpoint.split_once("://") {
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            let shown: String = scheme.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')).take(32).collect();
            return Err(TargetError::Scheme(shown));
        }
    }
    let use_tls = if endpoint.starts_with("https://") {
        true
    } else if endpoint.starts_with("http://") {
        if tls.asks_for_tls() && !tls.insecure {
            return Err(TargetError::TlsWithHttp(endpoint));
        }
        false
    } else {
        !tls.insecure && (o.tls.is_some() || tls.asks_for_tls())
    };
    let host = endpoint.split_once("://").map_or(endpoint.as_str(), |(_, rest)| rest);
    let base = format!("{}://{host}", if use_tls { "https" } else { "http" });
    let url = if protocol.is_http() && appended { format!("{base}{}", path.path()) } else { base };
    let (tls, server_name) = if use_tls {
        let cfg = tls.client_config().map_err(|e| TargetError::Tls(url.clone(), e))?;
        (Some(Arc::new(cfg)), tls.server_name().map_err(|e| TargetError::Tls(url.clone(), e))?)
    } else {
        (None, None)
    };
    Ok(Some(Target { protocol, url, tls, server_name, headers, timeout, compression }))
}

fn bad(var: &str, value: &str, allowed: &'static str) -> TargetError {
    TargetError::BadValue { var: var.into(), value: value.into(), allowed }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `k=v,k2=v2`, values percent-decoded.
pub(crate) fn parse_otel_headers(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), percent_encoding::percent_decode_str(v.trim()).decode_utf8_lossy().into_owned()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exporter(yaml: &str) -> OtlpExporter {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_protocol_variables_choose_the_transport_signal_first() {
        let o = exporter("{}");
        let t = resolve(&o, &with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]))
            .unwrap();
        let (tr, me, lo) = (t.traces.unwrap(), t.metrics.unwrap(), t.logs.unwrap());
        assert_eq!((tr.protocol, tr.url.as_str()), (Protocol::HttpProtobuf, "http://c:4318/v1/traces"));
        assert_eq!(me.url, "http://c:4318/v1/metrics");
        assert_eq!(lo.url, "http://c:4318/v1/logs");
        // A signal's own variable wins over the generic one.
        let t = resolve(
            &o,
            &with(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9999/custom"),
            ]),
        )
        .unwrap();
        assert_eq!(t.traces.unwrap().protocol, Protocol::Grpc);
        let m = t.metrics.unwrap();
        assert_eq!((m.protocol, m.url.as_str()), (Protocol::HttpJson, "http://m:9999/custom"), "a signal endpoint is used as is");
        // The file wins over every variable.
        let o = exporter("{endpoint: 'http://f:4317', protocol: grpc}");
        let t = resolve(&o, &with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x")]))
            .unwrap();
        let tr = t.traces.unwrap();
        assert_eq!((tr.protocol, tr.url.as_str()), (Protocol::Grpc, "http://f:4317"));
        let e = resolve(&exporter("{}"), &with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:1"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("thrift"), "{e}");
    }

    /// A `unix://` endpoint (file or variable) is refused by its scheme, not sent to
    /// `http:///path`; what follows the scheme (it may hold credentials) is not shown.
    #[test]
    fn an_endpoint_scheme_other_than_http_is_refused_by_name() {
        for (o, vars) in [
            (exporter("{endpoint: 'unix:///run/otel.sock'}"), vec![]),
            (exporter("{}"), vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "unix://user:secret@/run/otel.sock")]),
        ] {
            let e = resolve(&o, &with(&vars)).unwrap_err().to_string();
            assert!(e.contains("unix://") && !e.contains("secret") && !e.contains("otel.sock"), "{e}");
        }
        assert!(resolve(&exporter("{endpoint: 'HTTP://c:4317'}"), &with(&[])).is_ok());
        assert!(resolve(&exporter("{endpoint: 'c:4317'}"), &with(&[])).is_ok());
    }

    #[test]
    fn a_traces_endpoint_alone_is_used_as_is_and_its_siblings_follow() {
        let vars =
            with(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/otlp/v1/traces"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]);
        let t = resolve(&exporter("{}"), &vars).unwrap();
        assert_eq!(t.traces.as_ref().unwrap().url, "https://c/otlp/v1/traces");
        assert!(t.traces.as_ref().unwrap().tls.is_some(), "https is TLS");
        assert_eq!(t.metrics.unwrap().url, "https://c/otlp/v1/metrics");
        assert_eq!(t.logs.unwrap().url, "https://c/otlp/v1/logs");
        assert!(resolve(&exporter("{}"), &with(&[])).unwrap().traces.is_none(), "no endpoint, no target");
    }

    #[test]
    fn headers_timeout_and_compression_signal_specific_over_generic_and_the_file_over_both() {
        let vars = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=generic,b=2"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=traces"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "700"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd"),
        ]);
        let t = resolve(&exporter("{headers: {c: file}}"), &vars).unwrap();
        let (tr, me) = (t.traces.unwrap(), t.metrics.unwrap());
        assert_eq!(tr.headers, vec![("a".to_string(), "traces".to_string()), ("c".to_string(), "file".to_string())]);
        assert_eq!(me.headers.len(), 3, "{:?}", me.headers);
        assert_eq!((tr.timeout, me.timeout), (Duration::from_millis(2500), Duration::from_millis(700)));
        assert_eq!((tr.compression, me.compression), (Compression::Zstd, Compression::Gzip));
        let t = resolve(&exporter("{compression: none, timeout: 3s}"), &vars).unwrap();
        let tr = t.traces.unwrap();
        assert_eq!((tr.compression, tr.timeout), (Compression::None, Duration::from_secs(3)));
    }

    #[test]
    fn tls_settings_with_a_plaintext_endpoint_are_refused_and_a_bad_file_is_named() {
        let vars = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/ca.pem")]);
        let e = resolve(&exporter("{}"), &vars).unwrap_err().to_string();
        assert!(e.contains("http://c:4317"), "{e}");
        let vars = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"), ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/ca.pem")]);
        let e = resolve(&exporter("{}"), &vars).unwrap_err().to_string();
        assert!(e.contains("/no/ca.pem"), "{e}");
        // No scheme: plaintext unless TLS is configured.
        let t = resolve(&exporter("{endpoint: 'c:4317'}"), &with(&[])).unwrap();
        assert_eq!(t.traces.unwrap().url, "http://c:4317");
        let t = resolve(&exporter("{endpoint: 'c:4317', tls: {insecure_skip_verify: true}}"), &with(&[])).unwrap();
        let tr = t.traces.unwrap();
        assert_eq!(tr.url, "https://c:4317");
        assert!(tr.tls.is_some());
        let t = resolve(&exporter("{endpoint: 'c:4317', tls: {insecure: true}}"), &with(&[])).unwrap();
        assert!(t.traces.unwrap().tls.is_none());
    }

    #[test]
    fn otel_headers_parse() {
        assert_eq!(
            parse_otel_headers("api-key=abc%20def, X-Tenant = t1,bad"),
            vec![("api-key".to_string(), "abc def".to_string()), ("x-tenant".to_string(), "t1".to_string())]
        );
        // UTF-8 in escapes, an escape cut short and one that is not hex: the last two as written.
        assert_eq!(
            parse_otel_headers("a=%E2%9C%93,b=x%2,c=%zz%41"),
            vec![("a".to_string(), "\u{2713}".to_string()), ("b".to_string(), "x%2".to_string()), ("c".to_string(), "%zzA".to_string())]
        );
    }
}
