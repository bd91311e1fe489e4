//! The evidence journal: every span the receivers answered OK, on disk before the answer, until
//! the engine no longer needs it.
//!
//! With `storage.directory` the engine's decided chains, sessions and incidents are written to
//! the store every [`PERSIST_EVERY`](super::PERSIST_EVERY); the calls still in flight are not
//! (they change with every span). A process killed (SIGKILL, the OOM killer, a node lost) would
//! lose their evidence although each span was acknowledged: the sender dropped it. So the engine
//! appends each batch it takes in to this journal, and the receiver answers OK only once the
//! append is written (`service::run_engine`); after a restart the journal is replayed into the
//! engine at the engine times the batches were first taken in, so every call in flight at the
//! crash is decided — partial where evidence is missing, never absent.
//!
//! The journal is a directory of segments (`<sequence>.jnl`), each a run of records: length
//! (u32), CRC-32 of the payload, payload — the batch's time and its normalized evidence, framed
//! with the state format version ([`super::format`]) like every stored record. Only normalized
//! evidence is written (what the store holds of a decided chain): never a raw span, attribute,
//! argument or result. A segment is removed as a whole once every batch in it predates what the
//! engine still needs ([`Journal::release_before`]: the oldest call in flight, and the last
//! successful write of the store). Files are not `fsync`ed: a killed process loses nothing (the
//! kernel keeps what was written), a power cut may lose the last batches, as with the sending
//! queue. A record that cannot be read (a write cut short by a power cut, damage) ends its
//! segment's replay: counted and logged, never fatal.
//!
//! Bounded in bytes: a batch that would take the journal past its bound is refused, and the
//! receiver answers a retryable refusal (the sender keeps its data).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read as _, Write as _};
use std::path::{Path, PathBuf};

use crate::evidence::{SpanEvidence, TraceId};
use crate::normalize::Activity;

/// A segment is closed and a new one started past this many bytes (so that whole segments can
/// be removed as the engine lets go of them).
pub(crate) const SEGMENT_BYTES: u64 = 4 << 20;
const SUFFIX: &str = "jnl";
/// length (u32), CRC-32 (u32).
const RECORD_HEADER: usize = 8;

/// What went wrong with the journal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("the evidence journal is full ({held} of {limit} bytes held; the batch needs {need})")]
    Full { held: u64, limit: u64, need: u64 },
    #[error("evidence journal {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("evidence journal: cannot encode a batch: {0}")]
    Encode(String),
}

/// One batch as the engine took it in.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    /// The engine time it was taken in at.
    pub at_ns: u64,
    pub evidence: Vec<SpanEvidence>,
    pub activity: Vec<Activity>,
}

/// The payload of a record (postcard): the batch's time, its evidence, its activity.
type Payload = (u64, Vec<SpanEvidence>, Vec<(TraceId, bool)>);

#[derive(Debug)]
struct Segment {
    seq: u64,
    bytes: u64,
    /// The engine time of its newest batch (0: none).
    last_ns: u64,
}

/// What a replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub batches: u64,
    pub spans: u64,
    /// Records that could not be read (the rest of their segment was skipped).
    pub damaged: u64,
}

/// The journal. Written by the engine's driver only (one thread).
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    limit: u64,
    /// Closed segments and the open one (last), oldest first.
    segments: VecDeque<Segment>,
    /// The open segment's file, and what is appended but not written yet.
    file: Option<std::fs::File>,
    buf: Vec<u8>,
    /// The newest time among the batches in `buf`.
    buf_last_ns: u64,
    next_seq: u64,
    bytes: u64,
}

impl Journal {
    /// Open (creating) the journal in `dir`, bounded at `limit` bytes. What an earlier run left
    /// is kept for [`Self::replay`]; new batches go to a new segment.
    pub(crate) fn open(dir: &Path, limit: u64) -> Result<Journal, JournalError> {
        let io = |e| JournalError::Io(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some(seq) = name.to_string_lossy().strip_suffix(&format!(".{SUFFIX}")).and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            // Its batches' times are learnt by the replay; until then it is kept.
            segments.push(Segment { seq, bytes, last_ns: u64::MAX });
        }
        segments.sort_unstable_by_key(|s| s.seq);
        let next_seq = segments.last().map_or(0, |s| s.seq.saturating_add(1));
        let bytes = segments.iter().map(|s| s.bytes).sum();
        Ok(Journal {
            dir: dir.to_path_buf(),
            limit,
            segments: segments.into(),
            file: None,
            buf: Vec::new(),
            buf_last_ns: 0,
            next_seq,
            bytes,
        })
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.{SUFFIX}"))
    }

    /// Every batch an earlier run left, oldest first, to `take`. Learns each segment's newest
    /// time (so it can be released once the engine is past it). Call once, before appending.
    pub(crate) fn replay(&mut self, mut take: impl FnMut(Entry)) -> Replayed {
        let mut r = Replayed::default();
        for i in 0..self.segments.len() {
            let path = self.path(self.segments[i].seq);
            let mut last_ns = 0;
            let bytes = match std::fs::File::open(&path).and_then(|mut f| {
                let mut b = Vec::new();
                f.read_to_end(&mut b).map(|_| b)
            }) {
                Ok(b) => b,
                Err(e) => {
                    r.damaged += 1;
                    tracing::warn!(file = %path.display(), error = %e, "an evidence journal segment could not be read: skipped");
                    continue;
                }
            };
            let mut at = 0;
            while at < bytes.len() {
                match read_record(&bytes[at..]) {
                    Ok((entry, used)) => {
                        at += used;
                        last_ns = last_ns.max(entry.at_ns);
                        r.batches += 1;
                        r.spans += entry.evidence.len() as u64;
                        take(entry);
                    }
                    Err(why) => {
                        r.damaged += 1;
                        tracing::warn!(file = %path.display(), offset = at, error = %why, "an evidence journal record could not be read: the rest of its segment is skipped");
                        break;
                    }
                }
            }
            self.segments[i].last_ns = last_ns;
        }
        r
    }

    /// Append a batch taken in at `at_ns` (buffered: [`Self::flush`] writes it). `Full` when it
    /// would take the journal past its bound: nothing is appended.
    pub(crate) fn append(&mut self, at_ns: u64, evidence: &[SpanEvidence], activity: &[Activity]) -> Result<(), JournalError> {
        let activity: Vec<(TraceId, bool)> = activity.iter().map(|a| (a.trace_id, a.is_root)).collect();
        let record = postcard::to_extend(&(at_ns, evidence, activity), super::format::frame(&[]))
            .map_err(|e| JournalError::Encode(e.to_string()))?;
        let need = (RECORD_HEADER + record.len()) as u64;
        let held = self.bytes + self.buf.len() as u64;
        if held + need > self.limit {
            return Err(JournalError::Full { held, limit: self.limit, need });
        }
        let len = u32::try_from(record.len()).map_err(|_| JournalError::Full { held, limit: self.limit, need })?;
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&crc32fast::hash(&record).to_le_bytes());
        self.buf.extend_from_slice(&record);
        self.buf_last_ns = self.buf_last_ns.max(at_ns);
        Ok(())
    }

    /// Write what was appended. Once this returns `Ok` the batches survive the process.
    pub(crate) fn flush(&mut self) -> Result<(), JournalError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let at_ns = std::mem::take(&mut self.buf_last_ns);
        let full = self.segments.back().is_some_and(|s| s.bytes >= SEGMENT_BYTES);
        if self.file.is_none() || full {
            let seq = self.next_seq;
            let path = self.path(seq);
            let f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| JournalError::Io(path.clone(), e))?;
            self.next_seq += 1;
            self.file = Some(f);
            self.segments.push_back(Segment { seq, bytes: 0, last_ns: 0 });
        }
        let n = self.buf.len() as u64;
        let dir = self.dir.clone();
        let Some(f) = self.file.as_mut() else { return Ok(()) };
        if let Err(e) = f.write_all(&self.buf) {
            // What went in part is read back as a damaged record: a new segment from here on.
            self.file = None;
            self.buf.clear();
            if let Some(s) = self.segments.back_mut() {
                s.last_ns = s.last_ns.max(at_ns);
            }
            return Err(JournalError::Io(dir, e));
        }
        self.buf.clear();
        self.bytes += n;
        if let Some(s) = self.segments.back_mut() {
            s.bytes += n;
            s.last_ns = s.last_ns.max(at_ns);
        }
        Ok(())
    }

    /// Remove every segment whose batches all predate `horizon_ns` (engine time): the engine
    /// holds nothing of them in flight and its store has what it decided of them. The open
    /// segment is closed first when it qualifies. How many segments went.
    pub(crate) fn release_before(&mut self, horizon_ns: u64) -> usize {
        let mut gone = 0;
        while let Some(s) = self.segments.front() {
            if s.last_ns >= horizon_ns || (self.segments.len() == 1 && !self.buf.is_empty()) {
                break;
            }
            if self.segments.len() == 1 {
                self.file = None;
            }
            let Some(s) = self.segments.pop_front() else { break };
            match std::fs::remove_file(self.path(s.seq)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(directory = %self.dir.display(), error = %e, "cannot remove an evidence journal segment"),
            }
            self.bytes = self.bytes.saturating_sub(s.bytes);
            gone += 1;
        }
        gone
    }

    /// Bytes on disk.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

/// One record from the front of `b`, and its length.
fn read_record(b: &[u8]) -> Result<(Entry, usize), String> {
    if b.len() < RECORD_HEADER {
        return Err(format!("{} bytes, shorter than a record header", b.len()));
    }
    let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let crc = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let Some(payload) = b.get(RECORD_HEADER..RECORD_HEADER + len) else {
        return Err(format!("a record of {len} bytes with {} left", b.len() - RECORD_HEADER));
    };
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    let body = match super::format::framed(payload) {
        super::format::Framed::Version(super::format::CURRENT, body) => body,
        super::format::Framed::Version(v, _) => return Err(format!("written in format version {v}, which this build does not read")),
        super::format::Framed::Bare(_) => return Err("no format version".into()),
    };
    let (at_ns, evidence, activity): Payload = postcard::from_bytes(body).map_err(|e| e.to_string())?;
    let activity = activity.into_iter().map(|(trace_id, is_root)| Activity { trace_id, is_root }).collect();
    Ok((Entry { at_ns, evidence, activity }, RECORD_HEADER + len))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::evidence::Method;

    fn span(n: u8) -> SpanEvidence {
        let mut s = SpanEvidence::new([n; 16], [n; 8]);
        s.method = Some(Method::ToolsCall);
        s.tool = Some(Arc::from("create_ticket"));
        s.request_id = Some("7".into());
        s.start_ns = 10;
        s.end_ns = 20;
        s
    }

    fn entries(j: &mut Journal) -> (Vec<Entry>, Replayed) {
        let mut got = Vec::new();
        let r = j.replay(|e| got.push(e));
        (got, r)
    }

    #[test]
    fn what_was_flushed_is_replayed_by_the_next_open_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), 1 << 20).unwrap();
        j.append(100, &[span(1)], &[Activity { trace_id: [9; 16], is_root: true }]).unwrap();
        j.append(200, &[span(2), span(3)], &[]).unwrap();
        j.flush().unwrap();
        j.append(300, &[span(4)], &[]).unwrap();
        // Not flushed: not written (the receiver of that batch was not answered yet).
        drop(j);
        let mut j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (got, r) = entries(&mut j);
        assert_eq!(r, Replayed { batches: 2, spans: 3, damaged: 0 });
        assert_eq!(got[0], Entry { at_ns: 100, evidence: vec![span(1)], activity: vec![Activity { trace_id: [9; 16], is_root: true }] });
        assert_eq!(got[1].at_ns, 200);
        assert_eq!(got[1].evidence, vec![span(2), span(3)]);
    }

    #[test]
    fn segments_go_once_the_engine_is_past_them_and_the_bound_refuses_what_passes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), 1 << 20).unwrap();
        j.append(100, &[span(1)], &[]).unwrap();
        j.flush().unwrap();
        assert!(j.held() > 0);
        assert_eq!(j.release_before(100), 0, "a batch at the horizon is still needed");
        assert_eq!(j.release_before(101), 1);
        assert_eq!(j.held(), 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // After a release, appends go on in a new segment.
        j.append(200, &[span(2)], &[]).unwrap();
        j.flush().unwrap();
        let mut again = Journal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(entries(&mut again).1.batches, 1);
        // The bound, in bytes.
        let mut small = Journal::open(tempfile::tempdir().unwrap().path(), 64).unwrap();
        let e = small.append(1, &[span(1), span(2)], &[]).unwrap_err();
        assert!(matches!(e, JournalError::Full { limit: 64, .. }), "{e}");
        small.flush().unwrap();
        assert_eq!(small.held(), 0, "nothing of a refused batch is written");
    }

    #[test]
    fn a_damaged_record_ends_its_segment_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), 1 << 20).unwrap();
        j.append(100, &[span(1)], &[]).unwrap();
        j.append(200, &[span(2)], &[]).unwrap();
        j.flush().unwrap();
        drop(j);
        let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
        let mut b = std::fs::read(&file).unwrap();
        let n = b.len();
        b[n - 3] ^= 0xff;
        // And a write cut short after it.
        b.extend_from_slice(&[9, 0, 0]);
        std::fs::write(&file, b).unwrap();
        let mut j = Journal::open(dir.path(), 1 << 20).unwrap();
        let (got, r) = entries(&mut j);
        assert_eq!((got.len(), r.damaged), (1, 1));
        assert_eq!(got[0].at_ns, 100);
    }
}
