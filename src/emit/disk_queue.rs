//! The persistent sending queue: mcp-health's own output (health spans, incident records, own
//! metrics) waiting for the backend, kept in files so that it outlives the process.
//!
//! Modelled on the collector's exporterhelper persistent queue: a request is written to disk
//! before the exporter takes it as queued, it stays there while a worker sends it (a request being
//! sent when the process dies is sent again after the restart: at-least-once), and it is removed
//! once the send is over (accepted, or given up on as the retry settings say). What finds the
//! queue at its byte bound is dropped and counted, as a full in-memory queue drops.
//!
//! Layout: one file per request, `<sequence>.req`, in the queue's directory. A file is written as
//! `<sequence>.tmp` and renamed, so a crash mid-write leaves a `.tmp` (removed at the next open),
//! never a half `.req`. Each file has a small header (magic, kind, item count, payload length,
//! CRC-32 of the payload) before the encoded OTLP export request, so a truncated or damaged file
//! is recognised when it is read: skipped, removed, counted and logged, never a crash. One file
//! per request (rather than one log with read and write offsets) keeps removal a single `unlink`
//! and lets any file be lost or damaged without touching the others.
//!
//! Files are not `fsync`ed: a killed process loses nothing (the kernel keeps what was written), a
//! power cut may lose the last requests, as with the collector's `file_storage` default
//! (`fsync: false`).

use std::collections::VecDeque;
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

const MAGIC: &[u8; 4] = b"MHQ1";
/// magic, kind, items (u64), payload length (u32), CRC-32 (u32).
const HEADER: usize = 4 + 1 + 8 + 4 + 4;
const SUFFIX: &str = "req";

/// What a queued request is, so it goes back out as the same signal after a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// An encoded `ExportTraceServiceRequest` (health spans).
    Spans = 1,
    /// An encoded `ExportLogsServiceRequest` (incident records).
    Logs = 2,
    /// An encoded `ExportMetricsServiceRequest` (own metrics).
    Metrics = 3,
    /// Spans received and passed on (an encoded `ExportTraceServiceRequest`).
    PassedSpans = 4,
    /// Log records received and passed on.
    PassedLogs = 5,
    /// Metric points received and passed on.
    PassedMetrics = 6,
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<RecordKind> {
        match b {
            1 => Some(RecordKind::Spans),
            2 => Some(RecordKind::Logs),
            3 => Some(RecordKind::Metrics),
            4 => Some(RecordKind::PassedSpans),
            5 => Some(RecordKind::PassedLogs),
            6 => Some(RecordKind::PassedMetrics),
            _ => None,
        }
    }

    /// Which item count it adds to: spans, log records, metric points.
    fn items_slot(self) -> usize {
        match self {
            RecordKind::Spans | RecordKind::PassedSpans => 0,
            RecordKind::Logs | RecordKind::PassedLogs => 1,
            RecordKind::Metrics | RecordKind::PassedMetrics => 2,
        }
    }
}

/// One queued request as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: RecordKind,
    /// Spans, log records or metric points it carries (for the exporter's counters).
    pub items: u64,
    pub payload: Bytes,
}

/// A request taken out of the queue for sending; [`DiskQueue::ack`] removes it.
#[derive(Debug)]
pub(crate) struct Taken {
    entry: Entry,
    pub record: Record,
}

/// Why a request was not queued, or the queue not opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueueError {
    #[error("the sending queue is full ({held} of {limit} bytes held; the request needs {need})")]
    Full { held: u64, limit: u64, need: u64 },
    #[error("sending queue {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// One request file as the queue tracks it.
#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: u64,
    size: u64,
    /// From the header (`None` when it could not be read: found out when the file is taken).
    kind: Option<RecordKind>,
    items: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Written, not yet taken, oldest first.
    pending: VecDeque<Entry>,
    /// Taken by a worker, not yet acknowledged.
    in_flight: u64,
    /// Bytes of every `.req` file (pending and in flight).
    bytes: u64,
    /// Items of every `.req` file, by [`RecordKind`] (spans, log records, metric points).
    items: [u64; 3],
    next_seq: u64,
}

impl Inner {
    fn count(&mut self, e: &Entry, add: bool) {
        if let Some(k) = e.kind {
            let slot = &mut self.items[k.items_slot()];
            *slot = if add { *slot + e.items } else { slot.saturating_sub(e.items) };
        }
    }
}

/// The on-disk queue (synchronous file I/O; the exporter calls it from blocking tasks).
#[derive(Debug)]
pub(crate) struct DiskQueue {
    dir: PathBuf,
    limit: u64,
    inner: Mutex<Inner>,
    /// Files found damaged or unreadable (skipped and removed).
    corrupt: AtomicU64,
    /// When a request was last refused for lack of room (wall-clock nanoseconds; 0: never).
    last_full_ns: AtomicU64,
}

/// What the queue holds: requests (pending and in flight) and their bytes on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub requests: u64,
    pub bytes: u64,
    /// Spans, log records, metric points.
    pub items: [u64; 3],
}

impl DiskQueue {
    /// Open (creating) the queue in `dir`, bounded at `limit` bytes. Requests left by an earlier
    /// run are queued again, oldest first; `.tmp` files (a write cut short) are removed. The
    /// bound applies to new requests: what an earlier run left is kept even past it.
    pub(crate) fn open(dir: &Path, limit: u64) -> Result<DiskQueue, QueueError> {
        let io = |e| QueueError::Io(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(seq) = name.strip_suffix(&format!(".{SUFFIX}")).and_then(|s| s.parse::<u64>().ok()) else { continue };
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let (kind, items) = read_header(&path).unwrap_or((None, 0));
            found.push(Entry { seq, size, kind, items });
        }
        found.sort_unstable_by_key(|e| e.seq);
        let mut inner = Inner { next_seq: found.last().map_or(0, |e| e.seq.saturating_add(1)), ..Inner::default() };
        for e in &found {
            inner.bytes += e.size;
            inner.count(e, true);
        }
        inner.pending = found.into();
        Ok(DiskQueue {
            dir: dir.to_path_buf(),
            limit,
            inner: Mutex::new(inner),
            corrupt: AtomicU64::new(0),
            last_full_ns: AtomicU64::new(0),
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.{SUFFIX}"))
    }

    /// Write a request; once this returns `Ok` it is on disk and will be sent (now or after a
    /// restart). `Full` when it would take the queue past its bound: nothing is written.
    pub(crate) fn push(&self, kind: RecordKind, items: u64, payload: &[u8]) -> Result<(), QueueError> {
        let len = u32::try_from(payload.len()).map_err(|_| QueueError::Full { held: 0, limit: self.limit, need: payload.len() as u64 })?;
        let need = (HEADER + payload.len()) as u64;
        let seq = {
            let mut g = self.lock();
            if g.bytes + need > self.limit {
                self.last_full_ns.store(crate::evidence::time::Moment::wall_now().as_nanos().max(1), Ordering::Relaxed);
                return Err(QueueError::Full { held: g.bytes, limit: self.limit, need });
            }
            // A file named with the last sequence number there is (not one this queue writes)
            // ends the numbering rather than the process.
            let Some(next) = g.next_seq.checked_add(1) else {
                return Err(QueueError::Io(self.dir.clone(), std::io::Error::other("sequence numbers exhausted: empty the directory")));
            };
            // Reserved before the write so concurrent pushes cannot pass the bound together.
            g.bytes += need;
            std::mem::replace(&mut g.next_seq, next)
        };
        let tmp = self.dir.join(format!("{seq:020}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            let mut head = [0u8; HEADER];
            head[..4].copy_from_slice(MAGIC);
            head[4] = kind as u8;
            head[5..13].copy_from_slice(&items.to_le_bytes());
            head[13..17].copy_from_slice(&len.to_le_bytes());
            head[17..21].copy_from_slice(&crc32(payload).to_le_bytes());
            f.write_all(&head)?;
            f.write_all(payload)?;
            drop(f);
            std::fs::rename(&tmp, self.path(seq))
        };
        match write() {
            Ok(()) => {
                let e = Entry { seq, size: need, kind: Some(kind), items };
                let mut g = self.lock();
                g.count(&e, true);
                g.pending.push_back(e);
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                let mut g = self.lock();
                g.bytes = g.bytes.saturating_sub(need);
                Err(QueueError::Io(self.dir.clone(), e))
            }
        }
    }

    /// Take the oldest request for sending, skipping (removing, counting, logging) damaged
    /// files. `None` when nothing is pending.
    pub(crate) fn take(&self) -> Option<Taken> {
        loop {
            let entry = {
                let mut g = self.lock();
                let next = g.pending.pop_front()?;
                g.in_flight += 1;
                next
            };
            let path = self.path(entry.seq);
            match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| decode(&b)) {
                Ok(record) => return Some(Taken { entry, record }),
                Err(why) => {
                    self.corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(file = %path.display(), error = %why, "damaged sending-queue file skipped and removed");
                    self.remove(&entry);
                }
            }
        }
    }

    /// The request was sent (or given up on): its file goes.
    pub(crate) fn ack(&self, t: Taken) {
        self.remove(&t.entry);
    }

    fn remove(&self, e: &Entry) {
        match std::fs::remove_file(self.path(e.seq)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove a sent request from the sending queue"),
        }
        let mut g = self.lock();
        g.in_flight = g.in_flight.saturating_sub(1);
        g.bytes = g.bytes.saturating_sub(e.size);
        g.count(e, false);
    }

    /// Requests on disk (pending and in flight) and their bytes.
    pub(crate) fn held(&self) -> Held {
        let g = self.lock();
        Held { requests: g.pending.len() as u64 + g.in_flight, bytes: g.bytes, items: g.items }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().pending.is_empty()
    }

    /// Damaged files skipped so far.
    pub(crate) fn corrupt(&self) -> u64 {
        self.corrupt.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The last time a request was refused for lack of room (wall clock), if ever.
    pub(crate) fn last_full(&self) -> Option<crate::evidence::time::Moment> {
        let ns = self.last_full_ns.load(Ordering::Relaxed);
        (ns != 0).then(|| crate::evidence::time::Moment::from_nanos(ns))
    }
}

/// Kind and item count from a file's header, without reading the rest.
fn read_header(path: &Path) -> Option<(Option<RecordKind>, u64)> {
    use std::io::Read as _;
    let mut head = [0u8; HEADER];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if &head[..4] != MAGIC {
        return None;
    }
    Some((RecordKind::from_byte(head[4]), u64::from_le_bytes(head[5..13].try_into().ok()?)))
}

fn decode(b: &[u8]) -> Result<Record, String> {
    if b.len() < HEADER {
        return Err(format!("{} bytes, shorter than the header", b.len()));
    }
    if &b[..4] != MAGIC {
        return Err("not a sending-queue file (bad magic)".into());
    }
    let kind = RecordKind::from_byte(b[4]).ok_or_else(|| format!("unknown kind {}", b[4]))?;
    let items = u64::from_le_bytes(b[5..13].try_into().map_err(|_| "header")?);
    let len = u32::from_le_bytes(b[13..17].try_into().map_err(|_| "header")?) as usize;
    let crc = u32::from_le_bytes(b[17..21].try_into().map_err(|_| "header")?);
    let payload = &b[HEADER..];
    if payload.len() != len {
        return Err(format!("payload of {} bytes, the header says {len}", payload.len()));
    }
    if crc32(payload) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(Record { kind, items, payload: Bytes::copy_from_slice(payload) })
}

/// CRC-32 (IEEE, the zlib one), for damaged files only (not an integrity guarantee against
/// tampering). The same sum the evidence journal uses; the files written before keep reading.
fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    /// A queue file as 0.2.0 wrote it (hand-written CRC-32): read back as it was, and the same
    /// request written now gives the same bytes, so queues on disk survive the upgrade.
    #[test]
    fn a_queue_file_written_before_reads_back_and_is_written_the_same() {
        let name = "00000000000000000007.req";
        let before = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/disk_queue").join(name)).unwrap();
        let payload: Vec<u8> = (0..=255u8).chain(*b"MHQ1 payload: every byte value, then text").collect();
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(name), &before).unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        let t = q.take().expect("the file written before");
        assert_eq!(t.record, Record { kind: RecordKind::Spans, items: 3, payload: Bytes::from(payload.clone()) });
        assert_eq!(q.corrupt(), 0);
        q.ack(t);

        let d = tempfile::tempdir().unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        q.push(RecordKind::Spans, 3, &payload).unwrap();
        let written = files(d.path());
        assert_eq!(written.len(), 1);
        assert_eq!(std::fs::read(d.path().join(&written[0])).unwrap(), before, "byte for byte the format written before");
    }

    #[test]
    fn written_requests_come_back_in_order_and_an_ack_removes_the_file() {
        let d = tempfile::tempdir().unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        q.push(RecordKind::Spans, 3, b"first").unwrap();
        q.push(RecordKind::Logs, 1, b"second").unwrap();
        assert_eq!(q.held(), Held { requests: 2, bytes: (2 * HEADER + 11) as u64, items: [3, 1, 0] });
        let a = q.take().unwrap();
        assert_eq!(a.record, Record { kind: RecordKind::Spans, items: 3, payload: Bytes::from_static(b"first") });
        assert_eq!(q.held().requests, 2, "taken but not acknowledged: still held");
        q.ack(a);
        assert_eq!(files(d.path()).len(), 1);
        let b = q.take().unwrap();
        assert_eq!((b.record.kind, b.record.payload.as_ref()), (RecordKind::Logs, &b"second"[..]));
        assert!(q.take().is_none());
        q.ack(b);
        assert_eq!(q.held(), Held::default());
        assert!(files(d.path()).is_empty());
    }

    #[test]
    fn the_bound_is_in_bytes_and_what_passes_it_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let q = DiskQueue::open(d.path(), (2 * (HEADER + 100)) as u64).unwrap();
        q.push(RecordKind::Spans, 1, &[7u8; 100]).unwrap();
        q.push(RecordKind::Spans, 1, &[8u8; 100]).unwrap();
        assert_eq!(q.last_full(), None);
        let e = q.push(RecordKind::Spans, 1, &[9u8; 1]).unwrap_err();
        assert!(matches!(e, QueueError::Full { .. }), "{e}");
        assert!(q.last_full().is_some(), "the refusal is remembered (for /status/health)");
        assert_eq!(files(d.path()).len(), 2, "nothing written for a refused request");
        // Sent and acknowledged: room again.
        let t = q.take().unwrap();
        q.ack(t);
        q.push(RecordKind::Spans, 1, &[9u8; 1]).unwrap();
    }

    #[test]
    fn a_restart_finds_what_was_not_acknowledged_taken_or_not() {
        let d = tempfile::tempdir().unwrap();
        {
            let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
            for i in 0..4u8 {
                q.push(RecordKind::Metrics, i as u64, &[i; 10]).unwrap();
            }
            let t = q.take().unwrap();
            q.ack(t);
            let _in_flight = q.take().unwrap(); // the process dies while sending it
        }
        // A write cut short by a crash.
        std::fs::write(d.path().join(format!("{:020}.tmp", 99)), b"MHQ1partial").unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        assert_eq!(q.held().requests, 3);
        assert_eq!(q.held().items, [0, 0, 1 + 2 + 3], "item counts read back from the headers");
        let got: Vec<u64> = std::iter::from_fn(|| q.take()).map(|t| t.record.items).collect();
        assert_eq!(got, vec![1, 2, 3], "the one in flight is sent again, oldest first");
        assert!(!files(d.path()).iter().any(|f| f.ends_with(".tmp")), "the partial write is removed");
        // New requests go after the old ones.
        q.push(RecordKind::Spans, 9, b"x").unwrap();
        assert!(files(d.path()).last().unwrap().starts_with("00000000000000000004"));
    }

    #[test]
    fn damaged_files_are_skipped_removed_and_counted() {
        let d = tempfile::tempdir().unwrap();
        {
            let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
            for i in 0..5u8 {
                q.push(RecordKind::Spans, i as u64, &[i; 32]).unwrap();
            }
        }
        let f = files(d.path());
        // Truncated, a flipped payload byte, an empty file, and foreign bytes.
        let p = |i: usize| d.path().join(&f[i]);
        let whole = std::fs::read(p(0)).unwrap();
        std::fs::write(p(0), &whole[..whole.len() - 3]).unwrap();
        let mut flipped = std::fs::read(p(1)).unwrap();
        *flipped.last_mut().unwrap() ^= 0xff;
        std::fs::write(p(1), flipped).unwrap();
        std::fs::write(p(2), b"").unwrap();
        std::fs::write(p(3), b"not a queue file at all, longer than a header").unwrap();
        std::fs::write(d.path().join("notes.txt"), b"left alone").unwrap();
        std::fs::write(d.path().join("99999999999999999999.req"), b"a sequence past u64: not ours").unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        let t = q.take().expect("the one good file");
        assert_eq!(t.record.items, 4);
        assert_eq!(q.corrupt(), 4);
        q.ack(t);
        assert!(q.take().is_none());
        assert_eq!(q.held(), Held::default());
        assert_eq!(
            files(d.path()),
            vec!["99999999999999999999.req".to_string(), "notes.txt".to_string()],
            "damaged files removed, other files left alone"
        );
        // The last sequence number there is: the numbering ends, the process does not.
        std::fs::write(d.path().join(format!("{}.req", u64::MAX)), b"x").unwrap();
        let q = DiskQueue::open(d.path(), 1 << 20).unwrap();
        assert!(matches!(q.push(RecordKind::Spans, 1, b"y"), Err(QueueError::Io(..))));
    }
}
