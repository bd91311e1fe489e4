//! Decided records as JSON lines (stdout or a file): the embedded default's output, readable with
//! `jq`. The same line shapes as `replay --format json` (see [`crate::engine::Decided::write_line`]).
//!
//! Lines of one engine step are written with one call. A write that fails (a full disk) is
//! counted and logged, and the file is cut back to where it was, so no half-written line stays; a
//! SIGHUP reopens the file (log rotation).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::sink::Sink;
use crate::engine::Decided;
use crate::evidence::time::Moment;
use crate::telemetry::meters::VERDICT_LOG_WRITE_ERRORS;

enum Out {
    Stdout(std::io::Stdout),
    File {
        path: String,
        file: std::fs::File,
    },
    #[cfg(test)]
    Writer(Box<dyn Write + Send>),
}

/// Where verdict lines go.
pub(crate) struct VerdictLog {
    out: Out,
    buf: Vec<u8>,
    /// Records that could not be written (each failed write counts the records it held); also
    /// added to [`VERDICT_LOG_WRITE_ERRORS`], which the metrics read.
    pub write_errors: Arc<AtomicU64>,
    /// Set (by the SIGHUP handler) to reopen the file before the next write.
    pub reopen: Arc<AtomicBool>,
}

fn open_append(path: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

impl VerdictLog {
    pub(crate) fn open(path: &str) -> std::io::Result<VerdictLog> {
        let out =
            if path == "stdout" { Out::Stdout(std::io::stdout()) } else { Out::File { path: path.to_string(), file: open_append(path)? } };
        Ok(VerdictLog { out, buf: Vec::with_capacity(64 << 10), write_errors: Arc::default(), reopen: Arc::default() })
    }

    /// A log writing into any writer (tests).
    #[cfg(test)]
    pub(crate) fn to_writer(out: Box<dyn Write + Send>) -> VerdictLog {
        VerdictLog { out: Out::Writer(out), buf: Vec::new(), write_errors: Arc::default(), reopen: Arc::default() }
    }

    fn write_buf(&mut self) -> std::io::Result<()> {
        match &mut self.out {
            Out::Stdout(s) => {
                let mut l = s.lock();
                l.write_all(&self.buf).and_then(|_| l.flush())
            }
            #[cfg(test)]
            Out::Writer(w) => w.write_all(&self.buf).and_then(|_| w.flush()),
            Out::File { file, .. } => {
                let before = file.metadata().map(|m| m.len()).ok();
                let r = file.write_all(&self.buf);
                if r.is_err() {
                    // No half-written line stays behind: cut the file back.
                    if let Some(len) = before {
                        let _ = file.set_len(len);
                    }
                }
                r
            }
        }
    }
}

impl Sink for VerdictLog {
    fn accept(&mut self, records: &[Decided], _now: Moment) {
        let mut lines = 0u64;
        for r in records.iter().filter(|r| r.is_line()) {
            if r.write_line(&mut self.buf).is_ok() {
                lines += 1;
            } else {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                VERDICT_LOG_WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.reopen.swap(false, Ordering::Relaxed) {
            if let Out::File { path, file } = &mut self.out {
                match open_append(path) {
                    Ok(f) => *file = f,
                    Err(e) => tracing::warn!(error = %e, "verdict log: cannot reopen; writing to the old file"),
                }
            }
        }
        if self.buf.is_empty() {
            return;
        }
        if let Err(e) = crate::flow::blocking::off_the_runtime(|| self.write_buf()) {
            self.write_errors.fetch_add(lines, Ordering::Relaxed);
            VERDICT_LOG_WRITE_ERRORS.fetch_add(lines, Ordering::Relaxed);
            tracing::warn!(error = %e, lines, "verdict log write failed; those lines are lost (counted)");
        }
        self.buf.clear();
    }

    fn flush(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(28)) // ENOSPC
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn record() -> Decided {
        Decided::Drift(Box::new(crate::engine::DriftEvent {
            drift: true,
            server: "s".into(),
            tool: "t".into(),
            pinned_digest: "a".into(),
            digest: "b".into(),
            changes: vec![],
            trace_id: [0; 16],
            span_id: [0; 8],
        }))
    }

    #[test]
    fn a_failed_write_is_counted_not_silent() {
        let mut log = VerdictLog::to_writer(Box::new(Full));
        log.accept(&[record(), record()], Moment::ZERO);
        assert_eq!(log.write_errors.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_file_is_reopened_on_request_for_log_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.log");
        let mut log = VerdictLog::open(path.to_str().unwrap()).unwrap();
        log.accept(&[record()], Moment::ZERO);
        std::fs::rename(&path, dir.path().join("v.log.1")).unwrap();
        log.reopen.store(true, Ordering::Relaxed);
        log.accept(&[record()], Moment::ZERO);
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.path().join("v.log.1")).unwrap();
        assert_eq!((now.lines().count(), old.lines().count()), (1, 1));
        assert!(now.ends_with('\n') && serde_json::from_str::<serde_json::Value>(now.trim()).is_ok());
    }
}
