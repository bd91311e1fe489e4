//! Streamable-HTTP mode: `mcp-health tap --listen ADDR --upstream http(s)://host:port`.
//!
//! A reverse proxy (hyper 1 server + hyper-util pooled client). Every request — POST, GET, DELETE,
//! any path — goes upstream with its method, path, query, headers (`Authorization`,
//! `Mcp-Session-Id`, `MCP-Protocol-Version`, `Host` included) and body unchanged; only hop-by-hop
//! headers (RFC 9110 §7.6.1) are left to each connection. One exception: a 2026-07-28 request
//! without trace context gets the tap's `traceparent` in its `_meta` (and its `Content-Length`
//! follows), so a server that honours `_meta` continues the tap's trace
//! (`jsonrpc::inject_trace_context`). The span records the tap's end of the upstream connection
//! (`network.local.*`: the client the server sees) and the request's `User-Agent`. Request bodies (one JSON-RPC message or
//! batch) are read whole before they are sent on; response bodies are streamed frame by frame
//! (`text/event-stream` included) and teed to the observer, never buffered.
//!
//! Upstream failures: a connection that cannot be made is answered 502 and reported as
//! `mcp_health.transport.outcome` = `connection_refused`, `dns_failure` or `timeout` with
//! `mcp_health.request.sent=false`; no response head within `--upstream-timeout` is 504 + `timeout`;
//! a response cut short is `connection_reset` (the client sees the stream end with an error).
//!
//! `https://` upstreams (most remote MCP servers) are reached over TLS (rustls with ring, through
//! hyper-rustls), verified against the system's roots or `--upstream-ca-file`;
//! `--upstream-insecure-skip-verify` accepts any certificate (tests, a lab). A handshake or
//! certificate that fails is 502 + `tls_failure`, with `mcp_health.request.sent=false`. The tap's
//! own `--listen` side stays plaintext: it is meant to sit next to the client (loopback).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use super::export::SpanSink;
use super::jsonrpc::{Ctx, Observer, ObserverStats, Oversize, ServerIdentity, Transport};
/// The tap's settings name the upstream's TLS here, beside the rest of [`HttpSettings`].
pub(crate) use super::upstream_tls::UpstreamTls;
use super::{now_ns, parse_www_authenticate, Challenge, SseParser};

/// Largest request body forwarded (larger: 413). MCP request bodies are single JSON-RPC messages.
pub(crate) const MAX_REQUEST_BODY: usize = 64 << 20;
/// Largest JSON response body / SSE event the observer parses (the bytes still flow).
pub(crate) const MAX_PARSE: usize = 16 << 20;
/// Most bytes of bodies (request bodies and response chunks) waiting for the observer; past it a
/// copy is not handed over (the bytes still flow) and is counted as unobserved.
const OBSERVER_BYTES: usize = 64 << 20;
/// Open exchanges the observer tracks; past it the oldest are forgotten (their end was lost).
const MAX_EXCHANGES: usize = 16_384;

/// Settings of [`run`].
#[derive(Clone, Debug)]
pub(crate) struct HttpSettings {
    pub listen: SocketAddr,
    /// `http://host:port[/prefix]`: request paths are appended to the prefix.
    pub upstream: Uri,
    /// Longest wait for an upstream response head.
    pub response_timeout: Duration,
    pub connect_timeout: Duration,
    /// Outcome verifiers (`--verifiers`): calls they name are checked after their response.
    pub verifiers: Option<super::verify::VerifierPool>,
    /// How an `https://` upstream is verified.
    pub upstream_tls: UpstreamTls,
    /// Put the tap's trace context into a 2026-07-28 request that carries none (see the module
    /// documentation); off: every body goes upstream unchanged.
    pub propagate_trace_context: bool,
}

/// What the HTTP tap did, for the exit summary.
#[derive(Debug, Default)]
pub(crate) struct HttpReport {
    pub exchanges: u64,
    pub unobserved_events: u64,
    pub stats: ObserverStats,
}

enum Event {
    Request {
        exchange: u64,
        at_ns: u64,
        session_id: Option<String>,
        protocol_version: Option<String>,
        had_authorization: bool,
        user_agent: Option<String>,
        /// The trace context put into the request's `_meta` (see `inject_trace_context`).
        injected: Option<super::jsonrpc::TraceContext>,
        body: Option<Bytes>,
    },
    ResponseHead {
        exchange: u64,
        at_ns: u64,
        status: u16,
        kind: BodyKind,
        assigned_session_id: Option<String>,
        challenge: Option<Challenge>,
        /// The tap's end of the upstream connection the exchange went over.
        local_addr: Option<SocketAddr>,
    },
    Chunk {
        exchange: u64,
        at_ns: u64,
        bytes: Bytes,
        /// The bytes were not handed over (the byte budget was full): the body is not read.
        lost: bool,
    },
    End {
        exchange: u64,
        at_ns: u64,
    },
    Failed {
        exchange: u64,
        at_ns: u64,
        outcome: &'static str,
        request_sent: bool,
    },
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyKind {
    Json,
    Sse,
    Other,
}

type RespBody = BoxBody<Bytes, Box<dyn StdError + Send + Sync>>;

struct Shared {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    scheme_authority: String,
    prefix: String,
    events: mpsc::Sender<Event>,
    next_exchange: AtomicU64,
    unobserved: AtomicU64,
    response_timeout: Duration,
    propagate_trace_context: bool,
    /// Bytes of the bodies handed to the observer and not yet read (at most [`OBSERVER_BYTES`]).
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl Shared {
    fn observe(&self, mut e: Event) {
        let size = e.body_bytes();
        if size > 0 && self.held.fetch_add(size, Ordering::Relaxed) + size > OBSERVER_BYTES {
            self.held.fetch_sub(size, Ordering::Relaxed);
            self.unobserved.fetch_add(1, Ordering::Relaxed);
            // The event itself still tells the observer the exchange's shape, without the bytes.
            e.drop_body();
        }
        if let Err(err) = self.events.try_send(e) {
            self.unobserved.fetch_add(1, Ordering::Relaxed);
            let lost = match err {
                mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e.body_bytes(),
            };
            self.held.fetch_sub(lost, Ordering::Relaxed);
        }
    }
}

impl Event {
    /// The body bytes this event hands to the observer.
    fn body_bytes(&self) -> usize {
        match self {
            Event::Request { body: Some(b), .. } => b.len(),
            Event::Chunk { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }

    fn drop_body(&mut self) {
        match self {
            Event::Request { body, .. } => *body = None,
            Event::Chunk { bytes, lost, .. } => {
                *bytes = Bytes::new();
                *lost = true;
            }
            _ => {}
        }
    }
}

/// `server.address` and `server.port` of an upstream URI.
pub(crate) fn upstream_identity(u: &Uri) -> ServerIdentity {
    ServerIdentity {
        address: u.host().unwrap_or("").trim_matches(['[', ']']).to_string(),
        port: Some(u.port_u16().unwrap_or(if u.scheme_str() == Some("https") { 443 } else { 80 })),
        transport: Transport::Tcp,
    }
}

/// Parse and check an upstream URL (`http` or `https`).
/// The upstream URL. Never echoed whole (it may carry a key): messages name it as
/// [`shown_upstream`] does. User information and a query are refused: credentials belong in the
/// client's headers, which the tap forwards, not in a URL it would print or log.
pub(crate) fn parse_upstream(s: &str) -> Result<Uri, String> {
    let u: Uri = s.parse().map_err(|_| "--upstream is not a URL (give one such as http://127.0.0.1:8000)".to_string())?;
    let shown = shown_upstream(&u);
    match u.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(format!("--upstream {shown}: scheme {other} is not supported (http or https)")),
        None => return Err("--upstream: give a URL such as http://127.0.0.1:8000".to_string()),
    }
    if u.host().is_none() {
        return Err("--upstream: no host".to_string());
    }
    if u.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(format!("--upstream {shown}: user information in the URL is refused (send credentials as headers)"));
    }
    if u.query().is_some() {
        return Err(format!("--upstream {shown}: a query in the upstream URL is refused (it would not be forwarded, and may hold a key)"));
    }
    Ok(u)
}

/// The upstream as the tap names it on its stderr and in errors: `scheme://host:port`.
pub(crate) fn shown_upstream(u: &Uri) -> String {
    let host = u.host().unwrap_or("?");
    match (u.scheme_str(), u.port_u16()) {
        (Some(sc), Some(p)) => format!("{sc}://{host}:{p}"),
        (Some(sc), None) => format!("{sc}://{host}"),
        (None, _) => host.to_string(),
    }
}

/// Bind and serve until `shutdown` resolves. `on_bound` is told the bound address (port 0 works).
pub(crate) async fn run(
    settings: HttpSettings,
    sink: SpanSink,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<HttpReport, String> {
    // A CA file that cannot be read fails before anything listens.
    settings.upstream_tls.client_config()?;
    let listener =
        tokio::net::TcpListener::bind(settings.listen).await.map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    on_bound(bound);
    serve(listener, settings, sink, shutdown).await
}

/// Serve on an already bound listener.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    settings: HttpSettings,
    sink: SpanSink,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<HttpReport, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(settings.connect_timeout));
    // The TLS connector below takes `https://`; plain `http://` goes through as before.
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(settings.upstream_tls.client_config()?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    // Header names keep the case each side wrote them in.
    let client =
        Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).http1_preserve_header_case(true).build(connector);
    let up = &settings.upstream;
    let scheme_authority = format!("{}://{}", up.scheme_str().unwrap_or("http"), up.authority().map(|a| a.as_str()).unwrap_or(""));
    let prefix = up.path().trim_end_matches('/').to_string();
    let (tx, rx) = mpsc::channel::<Event>(8192);
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let shared = Arc::new(Shared {
        client,
        scheme_authority,
        prefix,
        events: tx.clone(),
        next_exchange: AtomicU64::new(0),
        unobserved: AtomicU64::new(0),
        response_timeout: settings.response_timeout,
        propagate_trace_context: settings.propagate_trace_context,
        held: held.clone(),
    });
    // The observer parses on a thread of its own (a current-thread runtime): a large body it
    // reads never takes a worker that carries the client's bytes.
    let (done_tx, observer) = tokio::sync::oneshot::channel::<ObserverStats>();
    let (identity, verifiers) = (upstream_identity(up), settings.verifiers.clone());
    let spawned = std::thread::Builder::new().name("tap-observer".into()).spawn(move || {
        let stats = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(observe_loop(rx, identity, sink, verifiers, held)),
            Err(e) => {
                eprintln!("mcp-health tap: cannot start the observer ({e}); no spans will be emitted");
                ObserverStats::default()
            }
        };
        let _ = done_tx.send(stats);
    });
    if let Err(e) = spawned {
        return Err(format!("cannot start the observer thread: {e}"));
    }

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            acc = listener.accept() => {
                let (stream, _) = match acc {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and the like: back off instead of spinning.
                        eprintln!("mcp-health tap: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let sh = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(req, sh.clone()));
                    let _ = hyper::server::conn::http1::Builder::new().keep_alive(true).preserve_header_case(true).serve_connection(TokioIo::new(stream), svc).await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    let exchanges = shared.next_exchange.load(Ordering::Relaxed);
    let unobserved = shared.unobserved.load(Ordering::Relaxed);
    let _ = tx.send(Event::Stop).await;
    drop(tx);
    let stats = observer.await.unwrap_or_default();
    if let Some(line) = stats.unread_summary() {
        eprintln!("{line}");
    }
    Ok(HttpReport { exchanges, unobserved_events: unobserved, stats })
}

fn header_str(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so each side sets its own.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"] {
        h.remove(n);
    }
}

fn plain(status: StatusCode, text: &str) -> Response<RespBody> {
    let mut r = Response::new(Full::new(Bytes::from(format!("mcp-health tap: {text}\n"))).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

async fn handle(req: Request<Incoming>, sh: Arc<Shared>) -> Result<Response<RespBody>, Infallible> {
    let at_ns = now_ns();
    let exchange = sh.next_exchange.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let too_large = e.downcast_ref::<http_body_util::LengthLimitError>().is_some();
            return Ok(if too_large {
                plain(StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
            } else {
                plain(StatusCode::BAD_REQUEST, "request body could not be read")
            });
        }
    };
    let is_post = parts.method == hyper::Method::POST;
    let protocol_version = header_str(&parts.headers, "mcp-protocol-version");
    let mut parts = parts;
    // A 2026-07-28 request without trace context gets the tap's, so a server that honours `_meta`
    // continues the tap's trace (nothing to join across traces).
    let (body, injected) = match (sh.propagate_trace_context && is_post && body.len() <= MAX_PARSE)
        .then(|| super::jsonrpc::inject_trace_context(&body, protocol_version.as_deref()))
        .flatten()
    {
        Some((b, ids)) => {
            parts.headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(b.len()));
            (Bytes::from(b), Some(ids))
        }
        None => (body, None),
    };
    sh.observe(Event::Request {
        exchange,
        at_ns,
        session_id: header_str(&parts.headers, "mcp-session-id"),
        protocol_version,
        had_authorization: parts.headers.contains_key(hyper::header::AUTHORIZATION),
        user_agent: header_str(&parts.headers, "user-agent"),
        injected,
        // Parsed only up to the responses' limit (the bytes are forwarded whatever their size).
        body: if is_post && body.len() > MAX_PARSE {
            sh.unobserved.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            (is_post && !body.is_empty()).then(|| body.clone())
        },
    });

    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = match format!("{}{}{}", sh.scheme_authority, sh.prefix, pq).parse() {
        Ok(u) => u,
        Err(_) => {
            sh.observe(Event::End { exchange, at_ns });
            return Ok(plain(StatusCode::BAD_REQUEST, "bad request target"));
        }
    };
    let mut up = Request::new(Full::new(body));
    *up.method_mut() = parts.method;
    *up.uri_mut() = uri;
    *up.headers_mut() = parts.headers;
    // The extensions carry the request's header-name case map (and nothing else of the client's).
    *up.extensions_mut() = parts.extensions;
    strip_hop_by_hop(up.headers_mut());

    let resp = match tokio::time::timeout(sh.response_timeout, sh.client.request(up)).await {
        Err(_) => {
            sh.observe(Event::Failed { exchange, at_ns: now_ns(), outcome: "timeout", request_sent: true });
            return Ok(plain(StatusCode::GATEWAY_TIMEOUT, "upstream timeout"));
        }
        Ok(Err(e)) => {
            let (outcome, request_sent) = classify_client_error(&e);
            sh.observe(Event::Failed { exchange, at_ns: now_ns(), outcome, request_sent });
            return Ok(plain(StatusCode::BAD_GATEWAY, &format!("upstream {outcome}")));
        }
        Ok(Ok(r)) => r,
    };
    let (mut rparts, rbody) = resp.into_parts();
    let status = rparts.status.as_u16();
    let ct = rparts.headers.get(hyper::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let kind = if ct.starts_with("text/event-stream") {
        BodyKind::Sse
    } else if ct.contains("json") {
        BodyKind::Json
    } else {
        BodyKind::Other
    };
    // Only the sanitized error word and scope leave this function.
    let challenge = (status == 401 || status == 403).then(|| {
        let all: Vec<&str> = rparts.headers.get_all(hyper::header::WWW_AUTHENTICATE).iter().filter_map(|v| v.to_str().ok()).collect();
        let bearer = all.iter().find(|v| v.to_ascii_lowercase().contains("bearer")).or(all.first());
        bearer.map(|v| parse_www_authenticate(v)).unwrap_or_default()
    });
    sh.observe(Event::ResponseHead {
        exchange,
        at_ns: now_ns(),
        status,
        kind,
        assigned_session_id: header_str(&rparts.headers, "mcp-session-id"),
        challenge,
        local_addr: rparts.extensions.get::<hyper_util::client::legacy::connect::HttpInfo>().map(|i| i.local_addr()),
    });
    strip_hop_by_hop(&mut rparts.headers);
    let tee = TeeBody { inner: rbody, exchange, sh: sh.clone(), done: false };
    Ok(Response::from_parts(rparts, tee.boxed()))
}

/// A rustls error, possibly inside io::Errors: hyper-rustls hands it up wrapped (twice), and an
/// io::Error's `source` skips what it wraps.
fn is_tls_error(e: &(dyn StdError + 'static)) -> bool {
    if e.is::<rustls::Error>() {
        return true;
    }
    match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
        Some(inner) => is_tls_error(inner),
        None => false,
    }
}

/// (outcome, request_sent) of an upstream client error.
fn classify_client_error(e: &hyper_util::client::legacy::Error) -> (&'static str, bool) {
    let connect = e.is_connect();
    let mut src: Option<&(dyn StdError + 'static)> = Some(e);
    let mut outcome: Option<&'static str> = None;
    while let Some(s) = src {
        if is_tls_error(s) {
            outcome = Some("tls_failure");
            break;
        }
        if s.to_string().starts_with("dns error") {
            outcome = Some("dns_failure");
            break;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            outcome = match io.kind() {
                ConnectionRefused => Some("connection_refused"),
                TimedOut => Some("timeout"),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => Some("connection_reset"),
                _ => None,
            };
            if outcome.is_some() {
                break;
            }
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                outcome = Some("connection_reset");
                break;
            }
            if h.is_timeout() {
                outcome = Some("timeout");
                break;
            }
        }
        src = s.source();
    }
    (outcome.unwrap_or(if connect { "connection_refused" } else { "connection_reset" }), !connect)
}

/// The upstream response body, forwarded frame by frame; each data frame is also handed to the
/// observer (a refcounted `Bytes`, not a copy).
struct TeeBody {
    inner: Incoming,
    exchange: u64,
    sh: Arc<Shared>,
    done: bool,
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = Box<dyn StdError + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.sh.observe(Event::Chunk { exchange: this.exchange, at_ns: now_ns(), bytes: d.clone(), lost: false });
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                this.sh.observe(Event::Failed {
                    exchange: this.exchange,
                    at_ns: now_ns(),
                    outcome: "connection_reset",
                    request_sent: true,
                });
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                if !this.done {
                    this.done = true;
                    this.sh.observe(Event::End { exchange: this.exchange, at_ns: now_ns() });
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TeeBody {
    fn drop(&mut self) {
        if !self.done {
            // An empty body that was never polled, or a client that went away mid-stream.
            self.sh.observe(Event::End { exchange: self.exchange, at_ns: now_ns() });
        }
    }
}

/// Per-exchange state of the observer task.
struct Exchange {
    session_id: Option<String>,
    protocol_version: Option<String>,
    had_authorization: bool,
    user_agent: Option<String>,
    injected: Option<super::jsonrpc::TraceContext>,
    local_addr: Option<SocketAddr>,
    status: Option<u16>,
    assigned_session_id: Option<String>,
    body: BodyState,
}

enum BodyState {
    None,
    /// A JSON body, and whether it passed the parse limit.
    Json(Vec<u8>, bool),
    Sse(Box<SseParser>),
    /// A JSON body some bytes of which were not handed over: not read.
    Lost,
}

impl Exchange {
    fn ctx(&self, at_ns: u64, exchange: u64) -> Ctx<'_> {
        Ctx {
            at_ns,
            session_id: self.session_id.as_deref(),
            assigned_session_id: self.assigned_session_id.as_deref(),
            protocol_version: self.protocol_version.as_deref(),
            exchange: Some(exchange),
            http_status: self.status,
            had_authorization: self.had_authorization,
            local_addr: self.local_addr,
            user_agent: self.user_agent.as_deref(),
            injected: self.injected,
        }
    }
}

async fn observe_loop(
    mut rx: mpsc::Receiver<Event>,
    identity: ServerIdentity,
    sink: SpanSink,
    verifiers: Option<super::verify::VerifierPool>,
    held: Arc<std::sync::atomic::AtomicUsize>,
) -> ObserverStats {
    let mut obs = Observer::new(identity).with_verifiers(verifiers.as_ref().map(|v| v.rules().clone()));
    let mut exchanges: FxHashMap<u64, Exchange> = FxHashMap::default();
    let mut sweep = tokio::time::interval(Duration::from_secs(60));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = sweep.tick() => {
                // Requests whose response never came (a stream that was never resumed).
                obs.expire(now_ns().saturating_sub(15 * 60 * 1_000_000_000));
                // Exchanges whose end event was lost (observer queue full): bounded, oldest first.
                if exchanges.len() > MAX_EXCHANGES {
                    let mut ids: Vec<u64> = exchanges.keys().copied().collect();
                    ids.sort_unstable();
                    for id in &ids[..ids.len() - MAX_EXCHANGES / 2] {
                        exchanges.remove(id);
                    }
                }
                continue;
            }
        };
        let Some(ev) = ev else { break };
        held.fetch_sub(ev.body_bytes(), Ordering::Relaxed);
        match ev {
            Event::Stop => break,
            Event::Request { exchange, at_ns, session_id, protocol_version, had_authorization, user_agent, injected, body } => {
                let ex = exchanges.entry(exchange).or_insert(Exchange {
                    session_id,
                    protocol_version,
                    had_authorization,
                    user_agent,
                    injected,
                    local_addr: None,
                    status: None,
                    assigned_session_id: None,
                    body: BodyState::None,
                });
                if let Some(b) = body {
                    let ctx = ex.ctx(at_ns, exchange);
                    obs.client_bytes(&b, &ctx);
                }
            }
            Event::ResponseHead { exchange, at_ns, status, kind, assigned_session_id, challenge, local_addr } => {
                let Some(ex) = exchanges.get_mut(&exchange) else { continue };
                ex.status = Some(status);
                ex.local_addr = local_addr;
                ex.assigned_session_id = assigned_session_id;
                ex.body = match kind {
                    BodyKind::Json => BodyState::Json(Vec::new(), false),
                    BodyKind::Sse => BodyState::Sse(Box::new(SseParser::new(MAX_PARSE))),
                    BodyKind::Other => BodyState::None,
                };
                if let Some(c) = challenge {
                    let ctx = ex.ctx(at_ns, exchange);
                    obs.http_auth_failure(exchange, status, &c, &ctx);
                }
            }
            Event::Chunk { exchange, at_ns, bytes, lost } => {
                let Some(ex) = exchanges.get_mut(&exchange) else { continue };
                let mut body = std::mem::replace(&mut ex.body, BodyState::None);
                match &mut body {
                    // A body with a hole is not read (counted as unobserved where it was lost).
                    BodyState::Json(..) if lost => body = BodyState::Lost,
                    BodyState::Sse(p) if lost => p.gap(),
                    BodyState::Json(buf, over) => {
                        if buf.len() + bytes.len() > MAX_PARSE {
                            *over = true;
                            buf.clear();
                        } else if !*over {
                            buf.extend_from_slice(&bytes);
                        }
                    }
                    BodyState::Sse(p) => {
                        let ctx = ex.ctx(at_ns, exchange);
                        p.feed(&bytes, |data| obs.server_bytes(data, &ctx));
                    }
                    BodyState::None | BodyState::Lost => {}
                }
                ex.body = body;
            }
            Event::End { exchange, at_ns } => {
                let Some(ex) = exchanges.remove(&exchange) else { continue };
                let ctx = ex.ctx(at_ns, exchange);
                match &ex.body {
                    BodyState::Json(buf, false) => obs.server_bytes(buf, &ctx),
                    BodyState::Json(_, true) => obs.stats.count(Oversize::Message),
                    BodyState::Sse(p) => (0..p.oversize_events).for_each(|_| obs.stats.count(Oversize::Message)),
                    BodyState::None | BodyState::Lost => {}
                }
                if let Some(st) = ex.status {
                    obs.exchange_end(exchange, st, &ctx);
                }
            }
            Event::Failed { exchange, at_ns, outcome, request_sent } => {
                let Some(ex) = exchanges.remove(&exchange) else { continue };
                let ctx = ex.ctx(at_ns, exchange);
                obs.transport_failure(exchange, outcome, request_sent, &ctx);
            }
        }
        for s in obs.take_spans() {
            sink.emit(s);
        }
        // After the spans: the response has been forwarded already (the observer reads a copy).
        if let Some(v) = &verifiers {
            for j in obs.take_jobs() {
                v.submit(j);
            }
        }
    }
    for s in obs.take_spans() {
        sink.emit(s);
    }
    if let Some(v) = &verifiers {
        for j in obs.take_jobs() {
            v.submit(j);
        }
    }
    obs.stats
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22: the upstream is named as `scheme://host:port`, never with user information or a
    /// query, and those are refused at start without being echoed.
    #[test]
    fn the_upstream_is_shown_without_credentials() {
        let u = parse_upstream("http://127.0.0.1:8000/mcp-prefix").unwrap();
        assert_eq!(shown_upstream(&u), "http://127.0.0.1:8000");
        for bad in ["http://user:PLANTED_PW@h:1/", "https://h/?api_key=PLANTED_KEY", "ftp://h/", "not a url PLANTED"] {
            let e = parse_upstream(bad).unwrap_err();
            assert!(!e.contains("PLANTED"), "{e}");
        }
    }
}
