//! stdio mode: `mcp-health tap -- <server command…>`.
//!
//! The server is spawned with piped stdin/stdout and inherited stderr. Two plain threads pump the
//! bytes (client stdin → server stdin, server stdout → our stdout, flushed per chunk) and hand a
//! copy of each chunk to the observer task with a non-blocking `try_send`: parsing, span building
//! and export can neither delay nor alter what is forwarded. EOF on our stdin closes the server's
//! stdin; SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to the server; the
//! tap exits with the server's exit code (128 + signal when it was killed by one).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::export::SpanSink;
use super::jsonrpc::{Ctx, Observer, Oversize, ServerIdentity, Transport};
use super::{now_ns, LineSplitter};

/// Longest JSON-RPC line the observer parses (longer lines are forwarded, not parsed).
pub(crate) const MAX_LINE: usize = 16 << 20;
const CHUNK: usize = 64 << 10;
/// Most bytes of chunks waiting for the observer (as the HTTP tap's `OBSERVER_BYTES`); past it a
/// copy is not handed over (the bytes still flow) and is counted as unobserved, and the line it
/// was part of is not read.
const OBSERVER_BYTES: usize = 64 << 20;

enum Chunk {
    /// `gap`: bytes of this direction were not handed over before this chunk.
    Data {
        from_client: bool,
        at_ns: u64,
        bytes: Vec<u8>,
        gap: bool,
    },
    Stop,
}

/// One direction's hand-over of copies to the observer: never blocks, never holds more than
/// [`OBSERVER_BYTES`] of both directions' copies, and says when bytes were not handed over.
struct HandOver {
    tx: mpsc::Sender<Chunk>,
    from_client: bool,
    held: Arc<AtomicUsize>,
    unobserved: Arc<AtomicU64>,
    /// A copy was not handed over since the last one that was.
    lost: bool,
}

impl HandOver {
    fn send(&mut self, at_ns: u64, bytes: &[u8]) {
        let n = bytes.len();
        if self.held.fetch_add(n, Ordering::Relaxed) + n > OBSERVER_BYTES {
            self.held.fetch_sub(n, Ordering::Relaxed);
            self.unobserved.fetch_add(1, Ordering::Relaxed);
            self.lost = true;
            return;
        }
        let chunk = Chunk::Data { from_client: self.from_client, at_ns, bytes: bytes.to_vec(), gap: self.lost };
        match self.tx.try_send(chunk) {
            Ok(()) => self.lost = false,
            Err(_) => {
                self.held.fetch_sub(n, Ordering::Relaxed);
                self.unobserved.fetch_add(1, Ordering::Relaxed);
                self.lost = true;
            }
        }
    }
}

/// What the stdio tap did, for the exit summary.
#[derive(Debug, Default)]
pub(crate) struct StdioReport {
    /// The exit code to exit with (the server's).
    pub exit_code: i32,
    /// Chunks not observed because the observer queue was full (they were still forwarded).
    pub unobserved_chunks: u64,
}

/// The `server.address` of a command: its file name.
pub(crate) fn command_name(cmd: &OsString) -> String {
    std::path::Path::new(cmd).file_name().map_or_else(|| cmd.to_string_lossy().into_owned(), |n| n.to_string_lossy().into_owned())
}

/// Run the server command behind the tap until it exits. Must be called inside a Tokio runtime.
pub(crate) async fn run(
    command: Vec<OsString>,
    server_address: Option<String>,
    sink: SpanSink,
    verifiers: Option<super::verify::VerifierPool>,
) -> Result<StdioReport, String> {
    let (program, args) = command.split_first().ok_or("no server command given (mcp-health tap -- <command> [args…])")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", program))?;
    let pid = child.id() as libc::pid_t;
    let mut child_in = child.stdin.take().ok_or("no stdin pipe")?;
    let mut child_out = child.stdout.take().ok_or("no stdout pipe")?;

    let (tx, mut rx) = mpsc::channel::<Chunk>(4096);
    let unobserved = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let hand_over =
        |from_client: bool| HandOver { tx: tx.clone(), from_client, held: held.clone(), unobserved: unobserved.clone(), lost: false };

    // Client → server.
    {
        let mut to_observer = hand_over(true);
        std::thread::Builder::new()
            .name("tap-stdin".into())
            .spawn(move || {
                let stdin = std::io::stdin();
                let mut input = stdin.lock();
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = match input.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    };
                    // The observer's copy is queued before the bytes reach the server, so the
                    // observer always sees a request before its response (a non-blocking send).
                    to_observer.send(now_ns(), &buf[..n]);
                    if child_in.write_all(&buf[..n]).is_err() {
                        break; // the server closed its stdin or exited
                    }
                }
                drop(child_in); // EOF to the server
            })
            .map_err(|e| format!("cannot start the stdin pump: {e}"))?;
    }

    // Server → client.
    let stdout_pump = {
        let mut to_observer = hand_over(false);
        std::thread::Builder::new()
            .name("tap-stdout".into())
            .spawn(move || {
                let stdout = std::io::stdout();
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = match child_out.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    };
                    let at_ns = now_ns();
                    let mut out = stdout.lock();
                    if out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                        break; // the client closed our stdout: close the server's too
                    }
                    drop(out);
                    to_observer.send(at_ns, &buf[..n]);
                }
            })
            .map_err(|e| format!("cannot start the stdout pump: {e}"))?
    };

    // The observer, beside the stream.
    let identity =
        ServerIdentity { address: server_address.unwrap_or_else(|| command_name(program)), port: None, transport: Transport::Pipe };
    let observer = tokio::spawn(async move {
        let mut obs = Observer::new(identity).with_verifiers(verifiers.as_ref().map(|v| v.rules().clone()));
        let mut from_client = LineSplitter::new(MAX_LINE);
        let mut from_server = LineSplitter::new(MAX_LINE);
        while let Some(c) = rx.recv().await {
            let Chunk::Data { from_client: fc, at_ns, bytes, gap } = c else { break };
            held.fetch_sub(bytes.len(), Ordering::Relaxed);
            let ctx = Ctx { at_ns, ..Default::default() };
            let lines = if fc { &mut from_client } else { &mut from_server };
            if gap {
                lines.gap();
            }
            if fc {
                lines.feed(&bytes, |l| obs.client_bytes(l, &ctx));
            } else {
                lines.feed(&bytes, |l| obs.server_bytes(l, &ctx));
            }
            for s in obs.take_spans() {
                sink.emit(s);
            }
            if let Some(v) = &verifiers {
                obs.take_jobs().into_iter().for_each(|j| v.submit(j));
            }
        }
        let ctx = Ctx { at_ns: now_ns(), ..Default::default() };
        from_client.finish(|l| obs.client_bytes(l, &ctx));
        from_server.finish(|l| obs.server_bytes(l, &ctx));
        // Lines past the parse limit: forwarded, not read.
        (0..from_client.oversize + from_server.oversize).for_each(|_| obs.stats.count(Oversize::Message));
        for s in obs.take_spans() {
            sink.emit(s);
        }
        if let Some(v) = &verifiers {
            obs.take_jobs().into_iter().for_each(|j| v.submit(j));
        }
        obs.stats
    });

    // Wait for the server, forwarding signals to it.
    let mut wait = tokio::task::spawn_blocking(move || child.wait());
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::interrupt(), libc::SIGINT),
        (SignalKind::terminate(), libc::SIGTERM),
        (SignalKind::hangup(), libc::SIGHUP),
        (SignalKind::quit(), libc::SIGQUIT),
        (SignalKind::user_defined1(), libc::SIGUSR1),
        (SignalKind::user_defined2(), libc::SIGUSR2),
    ];
    let (sig_tx, mut sig_rx) = mpsc::unbounded_channel::<i32>();
    let mut sig_tasks = Vec::new();
    for (kind, num) in kinds {
        if let Ok(mut s) = signal(kind) {
            let sig_tx = sig_tx.clone();
            sig_tasks.push(tokio::spawn(async move {
                while s.recv().await.is_some() {
                    if sig_tx.send(num).is_err() {
                        break;
                    }
                }
            }));
        }
    }
    let status = loop {
        tokio::select! {
            st = &mut wait => break st.map_err(|e| e.to_string())?.map_err(|e| format!("waiting for the server: {e}"))?,
            Some(num) = sig_rx.recv() => {
                // SAFETY: kill(2) with the pid of our own child and a valid signal number.
                unsafe { libc::kill(pid, num) };
            }
        }
    };
    for t in sig_tasks {
        t.abort();
    }

    // The server's last output: its stdout closes when it exits (bounded, in case a grandchild
    // keeps the pipe open).
    let _ = tokio::time::timeout(Duration::from_secs(2), tokio::task::spawn_blocking(move || stdout_pump.join())).await;
    let _ = tx.send(Chunk::Stop).await;
    drop(tx);
    let stats = observer.await.unwrap_or_default();
    if let Some(line) = stats.unread_summary() {
        eprintln!("{line}");
    }

    use std::os::unix::process::ExitStatusExt;
    let exit_code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Ok(StdioReport { exit_code, unobserved_chunks: unobserved.load(Ordering::Relaxed) })
}
