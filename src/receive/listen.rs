//! How every listener of the service accepts connections: the OTLP/gRPC and OTLP/HTTP receivers,
//! the Prometheus endpoint, the health check and the gate.
//!
//! Issue 10: 500 half-open connections were held for 65 s, and with a low open-file limit they
//! made OTLP, the metrics and the health check unavailable. So each listener has
//!
//! - a connection limit (`max_connections`): one more connection is accepted and closed at once,
//!   so it costs a file descriptor for microseconds, not until the client gives up; each listener
//!   has its own limit, so a flood on one (OTLP) cannot take another's (the health check);
//! - a header-read timeout (`read_header_timeout`): a connection must finish its TLS handshake and
//!   send its first request head within it. On HTTP/1 a following request's head, from its first
//!   byte, has the same time (a slowloris head cannot hold the connection);
//! - an idle timeout (`idle_timeout`): a connection on which nothing is read and no request starts
//!   or ends for this long is closed. HTTP/2 frames count as activity, so a gRPC client's
//!   keepalive pings keep its connection (the collector's gRPC `max_connection_idle` does not
//!   count them; here the connection limit bounds what such clients can hold).
//!
//! Refusals and timeouts are counted per listener in `mcp_health.connections.refused` and
//! `mcp_health.connections.timed_out` (read from [`closed_counts`] at each collection), and a
//! listener at its limit says so in the log at most every 10 s.
//!
//! The timeouts are enforced in the connection's I/O ([`Guarded`]), under TLS and under hyper or
//! tonic, so the same rule holds for HTTP/1 and HTTP/2 and for the handshake: when a deadline
//! passes, the next read or write fails and the server drops the connection. Requests are marked
//! by the server side ([`ConnInfo::request_started`]): hyper's service for HTTP/1, a tower layer
//! ([`TrackLayer`]) for tonic, which finds the connection in the request's extensions.
//!
//! TLS is accepted here too (tokio-rustls), not by tonic, so handshakes count against the limit
//! and the header-read timeout like any connection, and a failed handshake is counted.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// How long after its last bytes were read a connection's header-read deadline still waits
/// (see `ConnState::head_deadline`).
const READ_GRACE: Duration = Duration::from_secs(1);

/// The timeouts and the connection limit of one listener (the same keys on every listener).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub read_header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { read_header_timeout: Duration::from_secs(10), idle_timeout: Duration::from_secs(60), max_connections: 4096 }
    }
}

/// How a listener's connections carry requests: it decides when the header-read clock runs again
/// after the first request (HTTP/1 only: HTTP/2 sends frames that are not requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

/// The listeners, as named in the connection metrics' `listener` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListenerName {
    OtlpGrpc,
    OtlpHttp,
    Prometheus,
    HealthCheck,
    Gate,
}

impl ListenerName {
    pub(crate) const ALL: [ListenerName; 5] =
        [ListenerName::OtlpGrpc, ListenerName::OtlpHttp, ListenerName::Prometheus, ListenerName::HealthCheck, ListenerName::Gate];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ListenerName::OtlpGrpc => "otlp_grpc",
            ListenerName::OtlpHttp => "otlp_http",
            ListenerName::Prometheus => "prometheus",
            ListenerName::HealthCheck => "health_check",
            ListenerName::Gate => "gate",
        }
    }
}

/// Why a connection was refused or closed by the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// The listener held `max_connections` already.
    MaxConnections,
    /// The TLS handshake failed (no or a bad client certificate, a plaintext client, …).
    TlsHandshake,
    /// No (complete) request head within `read_header_timeout`.
    ReadHeader,
    /// Nothing happened for `idle_timeout`.
    Idle,
}

impl Closed {
    pub(crate) const ALL: [Closed; 4] = [Closed::MaxConnections, Closed::TlsHandshake, Closed::ReadHeader, Closed::Idle];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Closed::MaxConnections => "max_connections",
            Closed::TlsHandshake => "tls_handshake",
            Closed::ReadHeader => "read_header",
            Closed::Idle => "idle",
        }
    }

    /// A timeout (`mcp_health.connections.timed_out`), else a refusal (`…refused`).
    pub(crate) fn is_timeout(self) -> bool {
        matches!(self, Closed::ReadHeader | Closed::Idle)
    }
}

/// Process-wide tallies, read by the metrics at each collection (as the bounded tables' are).
static CLOSED: [[AtomicU64; 4]; 5] = [const { [const { AtomicU64::new(0) }; 4] }; 5];
static OPEN: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

fn count(l: ListenerName, why: Closed) {
    CLOSED[l as usize][why as usize].fetch_add(1, Ordering::Relaxed);
}

/// (listener, reason, count) of every connection refused or closed so far.
pub(crate) fn closed_counts() -> impl Iterator<Item = (ListenerName, Closed, u64)> {
    ListenerName::ALL
        .into_iter()
        .flat_map(|l| Closed::ALL.into_iter().map(move |c| (l, c, CLOSED[l as usize][c as usize].load(Ordering::Relaxed))))
}

/// (listener, connections open now).
pub(crate) fn open_counts() -> impl Iterator<Item = (ListenerName, u64)> {
    ListenerName::ALL.into_iter().map(|l| (l, OPEN[l as usize].load(Ordering::Relaxed)))
}

/// What one connection is doing, shared by its I/O (which enforces the deadlines) and the server
/// (which says when requests start and end). Times are milliseconds since `start`.
struct ConnState {
    start: Instant,
    limits: ConnectionLimits,
    protocol: Protocol,
    last_active: AtomicU64,
    /// 1 + when bytes were last read; 0: never.
    last_read: AtomicU64,
    requests: AtomicU64,
    in_flight: AtomicU32,
    /// 1 + when bytes arrived on an HTTP/1 connection between requests (a head is being read); 0: none.
    head_started: AtomicU64,
    expired: AtomicBool,
}

impl ConnState {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// When a request head that began at `from` (ms since start) must be complete. Bytes read a
    /// moment ago move it to [`READ_GRACE`] after them: a server that comes to a connection late
    /// (a flood on few cores) reads everything waiting, and its last read finds nothing before
    /// the request it has just read is dispatched; that connection is not the client's fault.
    /// Never past three header-read timeouts, so a client dripping bytes cannot hold it longer.
    fn head_deadline(&self, from: u64, header: u64) -> u64 {
        let at = from + header;
        match self.last_read.load(Ordering::Acquire) {
            0 => at,
            read => at.max((read - 1 + READ_GRACE.as_millis() as u64).min(from + 3 * header)),
        }
    }

    /// The next deadline (ms since start), or why the connection must close now.
    fn check(&self) -> Result<u64, Closed> {
        let now = self.now();
        let header = self.limits.read_header_timeout.as_millis() as u64;
        // Both clocks run from the start: a connection that sends nothing is idle, and an
        // `idle_timeout` shorter than `read_header_timeout` closes it first (it was held for the
        // header-read time whatever the idle timeout said).
        let idle_at = self.last_active.load(Ordering::Acquire) + self.limits.idle_timeout.as_millis() as u64;
        if self.requests.load(Ordering::Acquire) == 0 {
            let header = self.head_deadline(0, header);
            return if now >= header {
                Err(Closed::ReadHeader)
            } else if now >= idle_at {
                Err(Closed::Idle)
            } else {
                Ok(header.min(idle_at))
            };
        }
        if now >= idle_at {
            return Err(Closed::Idle);
        }
        let started = self.head_started.load(Ordering::Acquire);
        if started != 0 && self.in_flight.load(Ordering::Acquire) == 0 {
            let at = self.head_deadline(started - 1, header);
            if now >= at {
                return Err(Closed::ReadHeader);
            }
            return Ok(idle_at.min(at));
        }
        Ok(idle_at)
    }

    fn on_read(&self) {
        let now = self.now();
        self.last_active.store(now, Ordering::Release);
        self.last_read.store(now + 1, Ordering::Release);
        if self.protocol == Protocol::Http1
            && self.requests.load(Ordering::Acquire) > 0
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Acquire) == 0
        {
            self.head_started.store(now + 1, Ordering::Release);
        }
    }
}

/// A request in flight on a connection; dropped when its response is ready (or it is cancelled).
pub(crate) struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_active.store(self.0.now(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection a request came on (tonic puts it in the request's extensions).
#[derive(Clone)]
pub(crate) struct ConnInfo {
    state: Arc<ConnState>,
}

impl ConnInfo {
    /// A request head arrived: the header-read clock stops and the idle clock waits for it.
    pub(crate) fn request_started(&self) -> InFlight {
        let s = &self.state;
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        s.head_started.store(0, Ordering::Release);
        s.last_active.store(s.now(), Ordering::Release);
        s.requests.fetch_add(1, Ordering::AcqRel);
        InFlight(s.clone())
    }
}

/// A TCP connection with its listener's deadlines: when one passes, reads and writes fail (and
/// the reason is counted once). Holds the connection's place under `max_connections`.
pub(crate) struct Guarded {
    inner: TcpStream,
    state: Arc<ConnState>,
    listener: ListenerName,
    remote: Option<SocketAddr>,
    timer: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Guarded {
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            if self.state.expired.load(Ordering::Acquire) {
                return Err(expired());
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            match self.state.check() {
                Ok(next) => {
                    let at = self.state.start + Duration::from_millis(next);
                    self.timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                Err(why) => {
                    if !self.state.expired.swap(true, Ordering::AcqRel) {
                        count(self.listener, why);
                        tracing::debug!(listener = self.listener.as_str(), remote = ?self.remote, reason = why.as_str(), "connection closed");
                    }
                }
            }
        }
    }
}

/// The error every read and write of a connection gets once a deadline closed it.
fn expired() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection closed by its listener's timeout")
}

impl Drop for Guarded {
    fn drop(&mut self) {
        OPEN[self.listener as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsyncRead for Guarded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bytes the client sent before a deadline are read even when the server comes to them
        // after it: the clocks measure the client, and a server too busy to poll (a flood of
        // large requests on two cores) must not turn its own delay into a reset connection. A
        // connection that has nothing waiting meets its deadline; a slow client gains at most
        // what it had already sent (a request head is bounded in size).
        if this.state.expired.load(Ordering::Acquire) {
            return Poll::Ready(Err(expired()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
            return r;
        }
        if let Err(e) = this.poll_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        r
    }
}

impl Guarded {
    /// A write that can proceed proceeds (the server answering is not the client being slow);
    /// one that cannot (a client that does not read) meets the deadlines, like a read with
    /// nothing waiting.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if self.state.expired.load(Ordering::Acquire) {
            return Poll::Ready(Err(expired()));
        }
        let r = write(Pin::new(&mut self.inner), cx);
        if r.is_pending() {
            if let Err(e) = self.poll_deadline(cx) {
                return Poll::Ready(Err(e));
            }
        }
        r
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |io, cx| io.poll_write(cx, buf))
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An accepted connection, plaintext or with its TLS handshake done.
pub(crate) enum Conn {
    Plain(Guarded),
    Tls(Box<TlsStream<Guarded>>),
}

impl Conn {
    fn guarded(&self) -> &Guarded {
        match self {
            Conn::Plain(g) => g,
            Conn::Tls(t) => t.get_ref().0,
        }
    }

    pub(crate) fn info(&self) -> ConnInfo {
        let g = self.guarded();
        ConnInfo { state: g.state.clone() }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(g) => Pin::new(g).poll_read(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(g) => Pin::new(g).poll_write(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(g) => Pin::new(g).poll_write_vectored(cx, bufs),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(g) => g.is_write_vectored(),
            Conn::Tls(t) => t.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(g) => Pin::new(g).poll_flush(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(g) => Pin::new(g).poll_shutdown(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A bound listener with its limits and, optionally, TLS.
pub(crate) struct Listener {
    tcp: TcpListener,
    name: ListenerName,
    limits: ConnectionLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    protocol: Protocol,
}

/// At most one log line per this long about refusals on one listener.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Connections handed from the accept loop to the server, at most this many waiting.
const HANDOFF: usize = 64;

impl Listener {
    pub(crate) fn new(
        tcp: TcpListener,
        name: ListenerName,
        limits: ConnectionLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
        protocol: Protocol,
    ) -> Listener {
        Listener { tcp, name, limits, tls: tls.map(tokio_rustls::TlsAcceptor::from), protocol }
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accept connections (and finish their TLS handshakes) until the stream is dropped. The
    /// handle ends once the accept task has let go of the socket: a server awaits it after it
    /// stops, so that the port is free when it returns (a SIGHUP reload binds it again at once).
    pub(crate) fn incoming(self) -> (ReceiverStream<Result<Conn, io::Error>>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(HANDOFF);
        let accepting = tokio::spawn(self.accept_loop(tx));
        (ReceiverStream::new(rx), accepting)
    }

    async fn accept_loop(self, tx: mpsc::Sender<Result<Conn, io::Error>>) {
        let permits = Arc::new(Semaphore::new(self.limits.max_connections));
        let name = self.name;
        let mut last_warning: Option<Instant> = None;
        let mut refused_since = 0u64;
        loop {
            // Closed first: once the server stops taking connections, none is accepted only to
            // be dropped (a reload hands the socket to the next server).
            let accepted = tokio::select! {
                biased;
                _ = tx.closed() => return,
                a = self.tcp.accept() => a,
            };
            let (stream, remote) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and the like: say so and back off instead of spinning.
                    if last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        tracing::warn!(listener = name.as_str(), error = %e, "cannot accept a connection (open-file limit?)");
                        last_warning = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                // Accept and close at once: the descriptor is freed now, and the client sees its
                // connection end rather than wait in the backlog.
                count(name, Closed::MaxConnections);
                refused_since += 1;
                if last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    tracing::warn!(
                        listener = name.as_str(),
                        max_connections = self.limits.max_connections,
                        refused = refused_since,
                        "connection limit reached: closing new connections"
                    );
                    last_warning = Some(Instant::now());
                    refused_since = 0;
                }
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let state = Arc::new(ConnState {
                start: Instant::now(),
                limits: self.limits,
                protocol: self.protocol,
                last_active: AtomicU64::new(0),
                last_read: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                in_flight: AtomicU32::new(0),
                head_started: AtomicU64::new(0),
                expired: AtomicBool::new(false),
            });
            OPEN[name as usize].fetch_add(1, Ordering::Relaxed);
            // The first deadline: whichever of the two clocks ends first (see `ConnState::check`).
            let timer = Box::pin(tokio::time::sleep(self.limits.read_header_timeout.min(self.limits.idle_timeout)));
            let io = Guarded { inner: stream, state: state.clone(), listener: name, remote: Some(remote), timer, _permit: permit };
            match &self.tls {
                None => {
                    if tx.send(Ok(Conn::Plain(io))).await.is_err() {
                        return;
                    }
                }
                Some(acceptor) => {
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        match acceptor.accept(io).await {
                            Ok(s) => {
                                let _ = tx.send(Ok(Conn::Tls(Box::new(s)))).await;
                            }
                            // A handshake cut by the header-read timeout was counted as such.
                            Err(e) if !state.expired.load(Ordering::Acquire) => {
                                count(name, Closed::TlsHandshake);
                                tracing::debug!(listener = name.as_str(), %remote, error = %e, "TLS handshake failed");
                            }
                            Err(_) => {}
                        }
                    });
                }
            }
        }
    }
}

/// Serve an axum router over HTTP/1.1 on `listener` until `shutdown` resolves; then stop
/// accepting, let requests in flight finish, and close idle connections.
pub(crate) async fn serve_http(listener: Listener, app: axum::Router, shutdown: impl Future<Output = ()>) {
    let (mut incoming, accepting) = listener.incoming();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            c = incoming.next() => match c {
                Some(Ok(conn)) => {
                    conns.spawn(serve_http_conn(conn, app.clone(), stop_rx.clone()));
                }
                Some(Err(_)) => continue,
                None => break,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Stop accepting, but serve what was accepted already: a connection is never accepted and
    // then dropped unanswered (on a reload the next server takes over the same socket, and its
    // backlog, at once). Each such connection gets one request answered, then is closed.
    incoming.close();
    while let Some(c) = incoming.next().await {
        if let Ok(conn) = c {
            conns.spawn(serve_http_conn(conn, app.clone(), stop_rx.clone()));
        }
    }
    drop(incoming);
    let _ = accepting.await;
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
}

/// How long a connection accepted just before its server stops may take to send its first
/// request: it was accepted, so it is answered, not closed idle (a client that connected during a
/// reload's handover would otherwise read an empty response).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

async fn serve_http_conn(conn: Conn, app: axum::Router, mut stop: watch::Receiver<bool>) {
    let info = conn.info();
    let first_request = Arc::new(tokio::sync::Notify::new());
    let asked = Arc::new(AtomicBool::new(false));
    let (first, seen) = (Arc::clone(&first_request), Arc::clone(&asked));
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        if !seen.swap(true, Ordering::Relaxed) {
            // Stores a permit when nobody waits yet.
            first.notify_one();
        }
        let in_flight = info.request_started();
        let fut = tower::Service::call(&mut app.clone(), req);
        async move {
            let r = fut.await;
            drop(in_flight);
            r
        }
    });
    let c = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(hyper_util::rt::TokioIo::new(conn), svc);
    tokio::pin!(c);
    tokio::select! {
        _ = c.as_mut() => return,
        _ = stop.wait_for(|s| *s) => {}
    }
    // Graceful shutdown closes a connection with no request in flight at once, and one whose
    // first request has not arrived yet counts as such: wait for that request (bounded) first.
    if !asked.load(Ordering::Relaxed) {
        tokio::select! {
            _ = c.as_mut() => return,
            _ = first_request.notified() => {}
            _ = tokio::time::sleep(FIRST_REQUEST_GRACE) => {}
        }
    }
    c.as_mut().graceful_shutdown();
    let _ = c.await;
}

/// The tower layer that tells a tonic server's connections when their requests start and end.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TrackLayer;

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;
    fn layer(&self, inner: S) -> Track<S> {
        Track(inner)
    }
}

/// See [`TrackLayer`].
#[derive(Clone, Debug)]
pub(crate) struct Track<S>(S);

impl<S, B> tower::Service<hyper::Request<B>> for Track<S>
where
    S: tower::Service<hyper::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: hyper::Request<B>) -> Self::Future {
        let in_flight = req.extensions().get::<ConnInfo>().map(ConnInfo::request_started);
        let fut = self.0.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(in_flight);
            r
        })
    }
}

/// Raise the soft open-file limit to the hard limit, as Go programs (the collector) do at start,
/// and return the limit in force: a low default soft limit (1024) is what let held connections
/// starve every listener. `None` where it cannot be read.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return None;
            }
            if lim.rlim_cur < lim.rlim_max {
                let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    lim.rlim_cur = lim.rlim_max;
                }
            }
        }
        // rlim_t is not u64 on every unix.
        #[allow(clippy::unnecessary_cast)]
        Some(lim.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// Issue 11: with Nagle's algorithm on, one request in flight waited for the peer's delayed
    /// ACK (52 k spans/s instead of 376 k). Every accepted connection has TCP_NODELAY.
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let (mut incoming, _accepting) =
            Listener::new(tcp, ListenerName::OtlpGrpc, ConnectionLimits::default(), None, Protocol::Http2).incoming();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let conn = incoming.next().await.expect("a connection").expect("accepted");
        let Conn::Plain(g) = conn else { panic!("plaintext listener") };
        assert!(g.inner.nodelay().unwrap(), "TCP_NODELAY set on the accepted socket");
    }

    /// A SIGHUP reload binds the same ports at once: once the stream is dropped and the accept
    /// task's handle awaited, the port is free (the reload failed with EADDRINUSE before).
    #[tokio::test]
    async fn the_port_is_free_once_the_accept_task_has_ended() {
        for _ in 0..20 {
            let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = tcp.local_addr().unwrap();
            let (incoming, accepting) =
                Listener::new(tcp, ListenerName::HealthCheck, ConnectionLimits::default(), None, Protocol::Http1).incoming();
            drop(incoming);
            accepting.await.unwrap();
            TcpListener::bind(addr).await.expect("the port is free");
        }
    }

    fn closed(l: ListenerName, why: Closed) -> u64 {
        closed_counts().find(|(n, c, _)| *n == l && *c == why).map_or(0, |(_, _, v)| v)
    }

    /// A plaintext HTTP/2 listener on a loopback port with these deadlines: its connections, its
    /// address, and its accept task.
    async fn listening(
        read_header_timeout: Duration,
        idle_timeout: Duration,
    ) -> (ReceiverStream<Result<Conn, io::Error>>, SocketAddr, tokio::task::JoinHandle<()>) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let limits = ConnectionLimits { read_header_timeout, idle_timeout, max_connections: 8 };
        let (incoming, accepting) = Listener::new(tcp, ListenerName::Gate, limits, None, Protocol::Http2).incoming();
        (incoming, addr, accepting)
    }

    /// The next connection, as the server holds it.
    async fn next_plain(incoming: &mut ReceiverStream<Result<Conn, io::Error>>) -> Guarded {
        let Conn::Plain(g) = incoming.next().await.unwrap().unwrap() else { panic!("plaintext listener") };
        g
    }

    /// A server too busy to poll a connection until after its header-read deadline (a flood of
    /// large requests on two cores) still reads what the client sent in time, instead of
    /// resetting a connection whose client was prompt (a sender saw `ConnectionReset`, not a
    /// retryable refusal). An HTTP/2 server reads everything waiting before it dispatches the
    /// request it read, so its last read, which finds nothing, must not close the connection
    /// either: a dispatched request keeps it; one never dispatched meets the deadline a little
    /// later (at most three header-read timeouts); a connection that sent nothing is closed at
    /// once.
    #[tokio::test]
    async fn bytes_sent_before_the_deadline_are_read_by_a_late_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut incoming, addr, _accepting) = listening(Duration::from_millis(100), Duration::from_secs(3600)).await;
        let mut prompt = tokio::net::TcpStream::connect(addr).await.unwrap();
        prompt.write_all(b"PRI * HTTP/2.0").await.unwrap();
        let mut late = next_plain(&mut incoming).await;
        let mut dispatched_client = tokio::net::TcpStream::connect(addr).await.unwrap();
        dispatched_client.write_all(b"PRI * HTTP/2.0").await.unwrap();
        let mut dispatched = next_plain(&mut incoming).await;
        let _silent_client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut silent = next_plain(&mut incoming).await;
        // The server comes to the connections after their deadline (within three of them).
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut buf = [0u8; 64];
        for conn in [&mut late, &mut dispatched] {
            // An HTTP/2 server's first act is its SETTINGS frame: a write that can proceed proceeds.
            conn.write_all(b"server settings").await.expect("the late server's own write goes out");
            let n = conn.read(&mut buf).await.expect("what the client sent in time is read");
            assert_eq!(&buf[..n], b"PRI * HTTP/2.0");
            let last = tokio::time::timeout(Duration::from_millis(50), conn.read(&mut buf)).await;
            assert!(last.is_err(), "the read that finds nothing waits; it does not close the connection: {last:?}");
        }
        let _request = ConnInfo { state: dispatched.state.clone() }.request_started();
        let next = tokio::time::timeout(Duration::from_secs(10), late.read(&mut buf)).await.expect("not held open");
        assert_eq!(next.expect_err("nothing more came and no request: the deadline holds").kind(), io::ErrorKind::TimedOut);
        let kept = tokio::time::timeout(Duration::from_millis(500), dispatched.read(&mut buf)).await;
        assert!(kept.is_err(), "a dispatched request keeps its connection past the header-read deadline: {kept:?}");
        let silent_read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await.expect("not held open");
        assert_eq!(silent_read.expect_err("a connection that sent nothing is closed").kind(), io::ErrorKind::TimedOut);
    }

    /// A client that never reads what the server writes cannot hold the connection: once the
    /// writes block, the deadlines apply (here the idle timeout), as for a read with nothing
    /// waiting.
    #[tokio::test]
    async fn a_client_that_does_not_read_is_closed_when_the_writes_block() {
        use tokio::io::AsyncWriteExt;
        let (mut incoming, addr, _accepting) = listening(Duration::from_secs(3600), Duration::from_millis(200)).await;
        let _deaf_client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut server = next_plain(&mut incoming).await;
        let big = vec![0u8; 64 << 20];
        let written = tokio::time::timeout(Duration::from_secs(30), server.write_all(&big)).await.expect("not held open");
        assert_eq!(written.expect_err("64 MiB do not fit in the socket buffers").kind(), io::ErrorKind::TimedOut);
    }

    /// `idle_timeout` shorter than `read_header_timeout`: a connection that sends nothing is
    /// closed at the idle timeout (it was held for the header-read time), and so is one that is
    /// idle after a request.
    #[tokio::test]
    async fn idle_timeout_shorter_than_read_header_timeout_closes_at_idle() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        // The header-read time is far beyond what the test waits: only the idle timeout can close.
        let limits = ConnectionLimits {
            read_header_timeout: Duration::from_secs(3600),
            idle_timeout: Duration::from_millis(300),
            max_connections: 8,
        };
        let before = closed(ListenerName::Gate, Closed::Idle);
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(Listener::new(tcp, ListenerName::Gate, limits, None, Protocol::Http1), app, async {
            let _ = stopped.await;
        }));
        let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut after_request = tokio::net::TcpStream::connect(addr).await.unwrap();
        after_request.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut head = [0u8; 12];
        after_request.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        // Closed by the server: the read ends (EOF or reset) instead of waiting for an hour.
        for (what, mut s) in [("a silent connection", silent), ("a connection idle after a request", after_request)] {
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => continue,
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "{what} was not closed at the idle timeout");
        }
        assert!(closed(ListenerName::Gate, Closed::Idle) >= before + 2, "both counted as idle");
        let _ = stop.send(());
        server.await.unwrap();
    }

    /// A connection accepted before its server is told to stop, whose request comes after: it
    /// is answered, not closed idle (a health probe that connected during a reload's handover
    /// read an empty response).
    #[tokio::test]
    async fn a_connection_accepted_before_a_stop_is_answered_when_its_request_comes_after() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let limits =
            ConnectionLimits { read_header_timeout: Duration::from_secs(10), idle_timeout: Duration::from_secs(10), max_connections: 8 };
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(Listener::new(tcp, ListenerName::Gate, limits, None, Protocol::Http1), app, async {
            let _ = stopped.await;
        }));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = stop.send(());
        // The request comes after the stop (well within the grace for a first request).
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer)).await;
        assert!(answer.starts_with(b"HTTP/1.1 200"), "answered: {:?}", String::from_utf8_lossy(&answer));
        server.await.unwrap();
    }
}
