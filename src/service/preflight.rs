//! The checks `serve` runs before it binds anything, shared with `validate`: what `serve`
//! refuses at start, `validate` refuses too, with the same message.

use crate::config::{Config, OtlpExporter};
use crate::emit::otlp_target::Targets;
use crate::service::error::ServeError;

/// The process environment, empty values as unset (as `serve` and `validate` read it).
pub(crate) fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// What `serve` decides from the configuration and the environment before it binds anything.
pub(crate) struct Prepared {
    /// The OTLP exporter: the file's, else one made for the `OTEL_EXPORTER_OTLP_*` endpoint
    /// variables (own telemetry only, no pass-through).
    pub(crate) otlp: Option<OtlpExporter>,
    /// Where each signal goes.
    pub(crate) targets: Targets,
}

/// The exporter's settings resolved with the `OTEL_EXPORTER_OTLP_*` variables (an unknown
/// protocol, a bad timeout, an unsupported endpoint scheme), an endpoint that cannot be a URI,
/// and an exporter pointed at one of this service's own receivers.
pub(crate) fn prepare(cfg: &Config, env: &dyn Fn(&str) -> Option<String>) -> Result<Prepared, ServeError> {
    let otlp = cfg.exporters.otlp.clone().or_else(|| {
        env("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).map(|_| {
            // The OTEL_* variables configure mcp-health's own telemetry (metrics, health spans),
            // as the SDK specification says. Pass-through of received spans is only ever
            // switched on in the configuration: pointed at the collector that feeds
            // mcp-health, a variable alone made every span loop.
            let mut o: OtlpExporter = serde_yaml_ng::from_str("{}").unwrap_or_else(|_| unreachable!("defaults deserialize"));
            o.passthrough = false;
            o
        })
    });
    // Where each signal goes, over which transport: the file, then the OTLP exporter
    // specification's variables (see `emit::otlp_target`).
    let targets = match &otlp {
        Some(o) => crate::emit::otlp_target::resolve(o, env)?,
        None => Targets::default(),
    };
    for t in [&targets.traces, &targets.metrics, &targets.logs].into_iter().flatten() {
        // An exporter target that is one of this service's own receivers (from the file or from
        // an OTEL_EXPORTER_OTLP_* variable): refused, never a loop.
        if let Some(why) = cfg.export_loop(&t.url) {
            return Err(ServeError::ExportLoop(why));
        }
        tonic::transport::Endpoint::from_shared(t.url.clone())
            .map_err(|e| crate::emit::otlp_traces::ExportError::Endpoint(t.url.clone(), e.to_string()))?;
    }
    Ok(Prepared { otlp, targets })
}

/// The files `serve` reads before it binds: the receivers' certificates and keys and the
/// lockfile (read, not kept: `serve` reads them again when it starts).
pub(crate) fn check_files(cfg: &Config) -> Result<(), ServeError> {
    let p = &cfg.receivers.otlp.protocols;
    let receivers = [
        ("receivers.otlp.protocols.grpc", p.grpc.as_ref().and_then(|g| g.tls.as_ref()), &[&b"h2"[..]][..]),
        ("receivers.otlp.protocols.http", p.http.as_ref().and_then(|h| h.tls.as_ref()), &[&b"http/1.1"[..]][..]),
    ];
    for (prefix, tls, alpn) in receivers {
        if let Some(t) = tls {
            t.build(alpn).map_err(|e| ServeError::Tls(format!("{prefix}.tls.{}", e.key()), e))?;
        }
    }
    if let Some(l) = &cfg.processors.mcp_health.lockfile {
        crate::config::lockfile::load_lockfile(l).map_err(ServeError::Lockfile)?;
    }
    Ok(())
}
