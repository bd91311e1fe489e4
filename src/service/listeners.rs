//! The service's listeners (OTLP/gRPC, OTLP/HTTP, Prometheus, the health check, the gate) as one
//! set that a SIGHUP reconciles against a new configuration without closing anything that did not
//! change: a probe or a client never finds the port closed because of a reload.
//!
//! A reload is two steps so that a bad new configuration changes nothing:
//! [`Listeners::prepare`] binds every socket the new configuration needs (a new endpoint is bound
//! while the old one still serves; an unchanged endpoint whose other settings changed takes a
//! duplicate of the running socket, so the port is never unbound) and builds TLS; any error drops
//! what was prepared and the running set goes on. [`Listeners::commit`] then starts the new
//! servers and stops the replaced ones (they finish what they are serving). A SIGTERM during
//! either step is not held up by it: the supervisor drops the reload and drains.
//!
//! A TLS listener whose settings did not change keeps serving, and its certificate is read again
//! in place ([`Listeners::reload_certificates`]): renewed files at the same path are no change of
//! the settings.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, TlsServerSettings};
use crate::emit::metrics::ManualReaderHandle;
use crate::emit::prometheus;
use crate::evidence::time::Moment;
use crate::gate::GateState;
use crate::receive::admit::Admission;
use crate::receive::certificates::{CertificateWatch, Trigger};
use crate::receive::listen::{self, Listener, ListenerName, Protocol};
use crate::receive::{otlp_grpc, otlp_http};
use crate::service::components::Thresholds;
use crate::service::Heartbeat;

/// Why a listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListenError {
    #[error("{0}")]
    Bind(std::io::Error),
    /// A certificate or key that cannot be used; `0` is the key (`receivers.otlp.protocols.grpc.tls.cert_file`).
    #[error("{0}: {1}")]
    Tls(String, crate::config::tls::TlsError),
}

/// What the servers behind the listeners serve from: built once with the pipeline and shared by
/// every generation of listeners, so a reload never touches the engine's queue or the metrics.
#[derive(Clone)]
pub(crate) struct Served {
    pub admission: Admission,
    /// The Prometheus reader and exemplars (`None`: no Prometheus exporter at start).
    pub prometheus: Option<(Arc<ManualReaderHandle>, Arc<crate::emit::metrics::Exemplars>)>,
    pub heartbeat: Arc<Heartbeat>,
    /// The engine counts as stuck when silent for longer.
    pub stall_after: Duration,
    pub started: Instant,
    /// The gate's state less its `unpinned` policy, which comes from the configuration.
    pub gate: GateState,
    /// The status page's snapshot (`/status`, `/status.json` on the health-check listener).
    pub status: crate::service::status::Status,
    /// What `/status/health` reports on (and `/` with `fail_on_component_error`).
    pub components: Arc<crate::service::components::Components>,
}

/// The settings of one listener, as written in the configuration: a change of any of them
/// replaces the server; the same settings keep it (and its connections).
#[derive(Clone, Debug, PartialEq)]
enum Spec {
    Grpc(crate::config::GrpcReceiver),
    Http(crate::config::HttpReceiver),
    Prometheus(crate::config::PrometheusExporter),
    Health(crate::config::HealthCheck),
    Gate(crate::config::GateConfig),
}

impl Spec {
    fn endpoint(&self) -> &str {
        match self {
            Spec::Grpc(g) => &g.endpoint,
            Spec::Http(h) => &h.endpoint,
            Spec::Prometheus(p) => &p.endpoint,
            Spec::Health(h) => &h.endpoint,
            Spec::Gate(g) => &g.endpoint,
        }
    }

    /// The listener's name in metrics and logs.
    fn listener(&self) -> ListenerName {
        match self {
            Spec::Grpc(_) => ListenerName::OtlpGrpc,
            Spec::Http(_) => ListenerName::OtlpHttp,
            Spec::Prometheus(_) => ListenerName::Prometheus,
            Spec::Health(_) => ListenerName::HealthCheck,
            Spec::Gate(_) => ListenerName::Gate,
        }
    }

    /// The key of the listener's section (`receivers.otlp.protocols.grpc`).
    fn prefix(&self) -> &'static str {
        match self {
            Spec::Grpc(_) => "receivers.otlp.protocols.grpc",
            Spec::Http(_) => "receivers.otlp.protocols.http",
            Spec::Prometheus(_) => "exporters.prometheus",
            Spec::Health(_) => "extensions.health_check",
            Spec::Gate(_) => "extensions.gate",
        }
    }

    /// The parts of a listener's section that its server uses (Prometheus's
    /// `cardinality_limit` belongs to the metrics pipeline, not to the listener).
    fn comparable(&self) -> Spec {
        match self {
            Spec::Prometheus(p) => Spec::Prometheus(crate::config::PrometheusExporter { cardinality_limit: 0, ..p.clone() }),
            s => s.clone(),
        }
    }
}

/// The listeners a configuration asks for.
fn specs(cfg: &Config) -> BTreeMap<&'static str, Spec> {
    let mut m = BTreeMap::new();
    let p = &cfg.receivers.otlp.protocols;
    if let Some(g) = &p.grpc {
        m.insert(ListenerName::OtlpGrpc.as_str(), Spec::Grpc(g.clone()));
    }
    if let Some(h) = &p.http {
        m.insert(ListenerName::OtlpHttp.as_str(), Spec::Http(h.clone()));
    }
    if let Some(pr) = &cfg.exporters.prometheus {
        m.insert(ListenerName::Prometheus.as_str(), Spec::Prometheus(pr.clone()));
    }
    if let Some(h) = &cfg.extensions.health_check {
        m.insert(ListenerName::HealthCheck.as_str(), Spec::Health(h.clone()));
    }
    if let Some(g) = &cfg.extensions.gate {
        m.insert(ListenerName::Gate.as_str(), Spec::Gate(g.clone()));
    }
    m
}

/// One serving listener.
struct Running {
    spec: Spec,
    /// A duplicate of the listening socket: a replacement on the same endpoint serves from it,
    /// so the port stays open while the servers change hands.
    spare: std::net::TcpListener,
    down: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The certificate of a TLS listener (published, reloaded; dropped with the listener).
    certificate: Option<CertificateWatch>,
}

/// A listener bound (or re-used) for the next configuration, not serving yet.
struct Prepared {
    spec: Spec,
    /// Serves from a duplicate of the running server's socket (the endpoint did not change).
    same_endpoint: bool,
    listener: Listener,
    spare: std::net::TcpListener,
    certificate: Option<Arc<crate::receive::certificates::ServedCertificate>>,
}

/// How long a replacement on the same socket waits for the server it replaces to stop accepting
/// (it ends once its requests in flight are answered) before it starts anyway.
const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// The running listeners, by name.
#[derive(Default)]
pub(crate) struct Listeners {
    running: BTreeMap<&'static str, Running>,
    /// Replaced servers finishing what they serve; awaited (bounded) at shutdown.
    retiring: Vec<JoinHandle<()>>,
}

/// What [`Listeners::prepare`] made: the new and changed listeners, bound; the names to stop.
pub(crate) struct Plan {
    start: Vec<(&'static str, Prepared)>,
    stop: Vec<&'static str>,
}

impl Plan {
    /// The names of the listeners that change (started anew or stopped).
    pub(crate) fn changed(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.start.iter().map(|(n, _)| *n).chain(self.stop.iter().copied()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl Listeners {
    /// Bind what `cfg` needs that is not serving already. Nothing running is touched.
    pub(crate) async fn prepare(&self, cfg: &Config) -> Result<Plan, ListenError> {
        let wanted = specs(cfg);
        let mut plan = Plan { start: Vec::new(), stop: Vec::new() };
        for (name, r) in &self.running {
            if wanted.get(name).is_none_or(|s| s.comparable() != r.spec.comparable()) {
                plan.stop.push(name);
            }
        }
        for (name, spec) in wanted {
            let same_endpoint = match self.running.get(name) {
                Some(r) if r.spec.comparable() == spec.comparable() => continue,
                Some(r) if r.spec.endpoint() == spec.endpoint() => Some(&r.spare),
                _ => None,
            };
            let reuse = same_endpoint.is_some();
            let tcp = match same_endpoint {
                Some(spare) => duplicate(spare).map_err(ListenError::Bind)?,
                None => bind(spec.endpoint()).await?,
            };
            let spare = tcp_spare(&tcp).map_err(ListenError::Bind)?;
            let (listener, certificate) = build_listener(&spec, tcp)?;
            plan.start.push((name, Prepared { spec, same_endpoint: reuse, listener, spare, certificate }));
        }
        Ok(plan)
    }

    /// Start the prepared servers and stop the ones they replace (or that are gone). A server on
    /// a new endpoint starts before the old one is told to stop. One that takes over the same
    /// socket starts once the old one has stopped accepting (at most [`HANDOVER_WAIT`] later):
    /// meanwhile new connections wait in the socket's backlog, none is refused, and none is
    /// accepted by a server that is going away.
    pub(crate) async fn commit(&mut self, plan: Plan, served: &Served) {
        let replacing: Vec<_> = plan.start.iter().map(|(n, _)| *n).collect();
        for name in plan.stop.into_iter().filter(|n| !replacing.contains(n)) {
            served.components.forget(name);
            if let Some(r) = self.running.remove(name) {
                let _ = r.down.send(true);
                self.retiring.push(r.task);
            }
        }
        for (name, p) in plan.start {
            let old = self.running.remove(name);
            let old = match old {
                Some(mut r) if p.same_endpoint => {
                    let _ = r.down.send(true);
                    if tokio::time::timeout(HANDOVER_WAIT, &mut r.task).await.is_err() {
                        self.retiring.push(r.task);
                    }
                    None
                }
                other => other,
            };
            let (down, down_rx) = watch::channel(false);
            let addr = p.listener.local_addr().map_or(String::new(), |a| a.to_string());
            let task = start(&p.spec, p.listener, served, down_rx, &addr);
            let certificate = p.certificate.map(|c| CertificateWatch::start(p.spec.listener(), p.spec.prefix(), c));
            self.running.insert(name, Running { spec: p.spec, spare: p.spare, down, task, certificate });
            if let Some(r) = old {
                let _ = r.down.send(true);
                self.retiring.push(r.task);
            }
        }
        self.retiring.retain(|t| !t.is_finished());
    }

    /// Read the certificate and key of every serving TLS listener again (SIGHUP): new handshakes
    /// get a renewed certificate; one that cannot be used leaves the served one (logged, counted).
    pub(crate) fn reload_certificates(&self) {
        for r in self.running.values() {
            if let Some(c) = &r.certificate {
                c.reload(Trigger::Sighup);
            }
        }
    }

    /// Stop every listener but the health check (which answers 503 while the service drains)
    /// and wait until they have.
    pub(crate) async fn stop_serving(&mut self) {
        let names: Vec<_> = self.running.keys().copied().filter(|n| *n != ListenerName::HealthCheck.as_str()).collect();
        let mut tasks = std::mem::take(&mut self.retiring);
        for n in names {
            if let Some(r) = self.running.remove(n) {
                let _ = r.down.send(true);
                tasks.push(r.task);
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    /// Stop the health check last, waiting at most `limit`.
    pub(crate) async fn stop_health(&mut self, limit: Duration) {
        if let Some(r) = self.running.remove(ListenerName::HealthCheck.as_str()) {
            let _ = r.down.send(true);
            let _ = tokio::time::timeout(limit, r.task).await;
        }
    }

    /// Resolves with the name of the first listener whose server ended without being asked to:
    /// a receiver that stopped accepting ends the service rather than leave it deaf.
    pub(crate) async fn ended(&mut self) -> &'static str {
        std::future::poll_fn(|cx| {
            for (name, r) in self.running.iter_mut() {
                if std::pin::Pin::new(&mut r.task).poll(cx).is_ready() {
                    return std::task::Poll::Ready(*name);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

use std::future::Future as _;

/// Build the TLS settings and the listener for `spec` on the bound socket `tcp`; the certificate
/// it serves when it is a TLS listener.
fn build_listener(
    spec: &Spec,
    tcp: tokio::net::TcpListener,
) -> Result<(Listener, Option<Arc<crate::receive::certificates::ServedCertificate>>), ListenError> {
    let (limits, tls, alpn, protocol): (_, _, &[&[u8]], _) = match spec {
        Spec::Grpc(g) => (g.connections(), g.tls.as_ref(), &[b"h2"], Protocol::Http2),
        Spec::Http(h) => (h.connections(), h.tls.as_ref(), &[b"http/1.1"], Protocol::Http1),
        Spec::Prometheus(p) => (p.connections(), None, &[], Protocol::Http1),
        Spec::Health(h) => (h.connections(), None, &[], Protocol::Http1),
        Spec::Gate(g) => (g.connections(), g.tls.as_ref(), &[b"h2"], Protocol::Http2),
    };
    let built = tls
        .map(|t: &TlsServerSettings| t.build(alpn).map_err(|e| ListenError::Tls(format!("{}.tls.{}", spec.prefix(), e.key()), e)))
        .transpose()?;
    let (config, certificate) = built.unzip();
    Ok((Listener::new(tcp, spec.listener(), limits, config, protocol), certificate))
}

/// Spawn the server of `spec` on `l`, until `down` turns true.
fn start(spec: &Spec, l: Listener, served: &Served, down: watch::Receiver<bool>, addr: &str) -> JoinHandle<()> {
    let sd = async move {
        let mut down = down;
        let _ = down.wait_for(|v| *v).await;
    };
    match spec {
        Spec::Grpc(g) => {
            tracing::info!(addr, tls = g.tls.is_some(), "OTLP/gRPC receiver listening");
            let (adm, max, token) = (served.admission.clone(), g.max_recv_msg_size_mib << 20, crate::config::ReceiverAuth::token(&g.auth));
            let listening = served.components.listening(ListenerName::OtlpGrpc.as_str());
            tokio::spawn(async move {
                let _listening = listening;
                if let Err(e) = otlp_grpc::serve(l, adm, max, token, sd).await {
                    tracing::error!(error = %e, "OTLP/gRPC receiver failed");
                }
            })
        }
        Spec::Http(h) => {
            tracing::info!(addr, tls = h.tls.is_some(), "OTLP/HTTP receiver listening");
            let app = otlp_http::router(served.admission.clone(), h.max_request_body_size, crate::config::ReceiverAuth::token(&h.auth));
            let listening = served.components.listening(ListenerName::OtlpHttp.as_str());
            tokio::spawn(async move {
                let _listening = listening;
                listen::serve_http(l, app, sd).await
            })
        }
        Spec::Gate(g) => {
            tracing::info!(addr, tls = g.tls.is_some(), "gate gRPC API listening");
            let state = GateState { unpinned: g.unpinned, ..served.gate.clone() };
            tokio::spawn(async move {
                if let Err(e) = crate::gate::service::serve(l, state, sd).await {
                    tracing::error!(error = %e, "gate gRPC API failed");
                }
            })
        }
        Spec::Prometheus(_) => {
            let Some((reader, exemplars)) = served.prometheus.clone() else {
                // The metrics pipeline was built without a Prometheus reader: there is nothing to
                // serve until a restart. The socket stays bound (so a later reload can keep it).
                tracing::warn!(addr, "exporters.prometheus was added by a reload; it serves from the next start");
                return tokio::spawn(async move {
                    sd.await;
                    drop(l);
                });
            };
            tracing::info!(addr, "Prometheus endpoint listening on /metrics");
            // OpenMetrics (with exemplars) when the scraper asks for it, as Prometheus does; the
            // text format otherwise.
            let app = Router::new().route(
                "/metrics",
                get(move |headers: axum::http::HeaderMap| {
                    let (reader, exemplars) = (reader.clone(), exemplars.clone());
                    async move {
                        let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
                        let format = prometheus::Format::negotiate(accept);
                        let body = prometheus::render_as(&reader, format, Some(&exemplars));
                        let encoding = headers.get(axum::http::header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok());
                        let gzip = if accepts_gzip(encoding) { gzip_body(body.as_bytes()) } else { None };
                        let mut h = axum::http::HeaderMap::new();
                        h.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static(format.content_type()));
                        h.insert(axum::http::header::VARY, axum::http::HeaderValue::from_static("accept-encoding"));
                        match gzip {
                            Some(z) => {
                                h.insert(axum::http::header::CONTENT_ENCODING, axum::http::HeaderValue::from_static("gzip"));
                                (h, z)
                            }
                            None => (h, body.into_bytes()),
                        }
                    }
                }),
            );
            tokio::spawn(listen::serve_http(l, app, sd))
        }
        Spec::Health(h) => {
            tracing::info!(addr, "health check listening");
            let (hb, stall_after, started) = (served.heartbeat.clone(), served.stall_after, served.started);
            let thresholds = Thresholds { stall_after, exporter_failure: h.exporter_failure_threshold };
            let (components, strict) = (served.components.clone(), h.fail_on_component_error);
            let all = served.components.clone();
            let app = Router::new()
                .route(
                    "/",
                    get(move || {
                        let (hb, components) = (hb.clone(), components.clone());
                        async move {
                            let now = Moment::wall_now();
                            let h = hb.health(now, stall_after);
                            let uptime = started.elapsed().as_secs();
                            // Only when asked: by default a liveness probe on `/` must not
                            // restart the process for a backend that is down.
                            let failing = if strict && h.is_ok() { components.report(now, thresholds).unhealthy() } else { Vec::new() };
                            if !failing.is_empty() {
                                let status = format!("Component unhealthy: {}", failing.join(", "));
                                return (
                                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                    axum::Json(serde_json::json!({"status": status, "uptime_seconds": uptime})),
                                );
                            }
                            let code = if h.is_ok() { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
                            (code, axum::Json(serde_json::json!({"status": h.as_str(), "uptime_seconds": uptime})))
                        }
                    }),
                )
                .route(
                    "/status/health",
                    get(move || {
                        let all = all.clone();
                        async move {
                            let r = all.report(Moment::wall_now(), thresholds);
                            let code = if r.healthy { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
                            (code, axum::Json(r))
                        }
                    }),
                );
            let trace_url = h.status.as_ref().and_then(|s| s.trace_url.as_deref());
            let app = if h.status_page { app.merge(served.status.routes(trace_url)) } else { app };
            tokio::spawn(listen::serve_http(l, app, sd))
        }
    }
}

/// Whether an `Accept-Encoding` value takes gzip: named (or `*`) without `q=0`. Prometheus asks
/// for it on every scrape, and the text of a few thousand series shrinks about tenfold.
fn accepts_gzip(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        v.split(',').any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")).and_then(|q| q.trim().parse::<f32>().ok()).is_some_and(|q| q <= 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
    })
}

/// `body` gzipped (fast level: a scrape is answered on a runtime thread); `None` if that fails,
/// and the body goes out as it is.
fn gzip_body(body: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), flate2::Compression::fast());
    z.write_all(body).ok()?;
    z.finish().ok()
}

/// Bind `host:port`; a name (`localhost:4317`) is resolved and its first address bound.
pub(crate) async fn bind(endpoint: &str) -> Result<tokio::net::TcpListener, ListenError> {
    let bad = |m: String| ListenError::Bind(std::io::Error::new(std::io::ErrorKind::InvalidInput, m));
    let addr: SocketAddr = match endpoint.parse() {
        Ok(a) => a,
        Err(_) => tokio::net::lookup_host(endpoint)
            .await
            .map_err(|e| bad(format!("cannot resolve {endpoint}: {e}")))?
            .next()
            .ok_or_else(|| bad(format!("{endpoint} resolves to no address")))?,
    };
    otlp_grpc::bind(addr).await.map_err(ListenError::Bind)
}

/// A second descriptor of a bound socket, kept aside (see [`Running::spare`]).
#[cfg(unix)]
fn tcp_spare(tcp: &tokio::net::TcpListener) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::AsFd;
    let owned = tcp.as_fd().try_clone_to_owned()?;
    Ok(std::net::TcpListener::from(owned))
}

#[cfg(windows)]
fn tcp_spare(tcp: &tokio::net::TcpListener) -> std::io::Result<std::net::TcpListener> {
    use std::os::windows::io::AsSocket;
    let owned = tcp.as_socket().try_clone_to_owned()?;
    Ok(std::net::TcpListener::from(owned))
}

/// A serving socket for a replacement server, from the spare descriptor of the running one.
fn duplicate(spare: &std::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    let dup = spare.try_clone()?;
    dup.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(dup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_chosen_when_named_or_starred_without_q_zero() {
        let cases: &[(Option<&str>, bool)] = &[
            (None, false),
            (Some(""), false),
            (Some("gzip"), true),
            (Some("GZIP"), true),
            (Some("identity"), false),
            (Some("deflate, gzip;q=0.5"), true),
            (Some("gzip;q=0"), false),
            (Some("gzip; q=0.0, identity"), false),
            (Some("*"), true),
            (Some("br, *;q=0"), false),
            (Some("zstd,gzip"), true),
        ];
        for (value, want) in cases {
            assert_eq!(accepts_gzip(*value), *want, "{value:?}");
        }
        let body = b"mcp_health_verdicts_total{state=\"healthy\"} 1\n".repeat(100);
        let z = gzip_body(&body).unwrap();
        assert!(z.len() < body.len() / 5);
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&z[..]), &mut plain).unwrap();
        assert_eq!(plain, body);
    }
}
