//! Decided records as JSON lines (stdout or a file): the embedded default's output, readable with
//! `jq`. The same line shapes as `replay --format json` (see [`crate::engine::Decided::write_line`]).

use std::io::Write;

use super::sink::Sink;
use crate::engine::Decided;
use crate::evidence::time::Moment;

/// Where verdict lines go.
pub struct VerdictLog {
    out: Box<dyn Write + Send>,
    /// Lines of one engine step, written with one call (no scan for newlines, no small writes).
    buf: Vec<u8>,
    /// Records that could not be serialized or written.
    pub write_errors: u64,
}

impl VerdictLog {
    pub fn open(path: &str) -> std::io::Result<VerdictLog> {
        let out: Box<dyn Write + Send> = if path == "stdout" {
            Box::new(std::io::stdout())
        } else {
            Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?)
        };
        Ok(VerdictLog { out, buf: Vec::with_capacity(64 << 10), write_errors: 0 })
    }

    /// A log writing into any writer (tests).
    pub fn to_writer(out: Box<dyn Write + Send>) -> VerdictLog {
        VerdictLog { out, buf: Vec::new(), write_errors: 0 }
    }
}

impl Sink for VerdictLog {
    fn accept(&mut self, records: &[Decided], _now: Moment) {
        for r in records {
            if r.write_line(&mut self.buf).is_err() {
                self.write_errors += 1;
            }
        }
        self.flush();
    }

    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if self.out.write_all(&self.buf).and_then(|_| self.out.flush()).is_err() {
            self.write_errors += 1;
            tracing::warn!("verdict log write failed");
        }
        self.buf.clear();
    }
}
