//! Verdicts as JSON lines (stdout or a file): the embedded default's output, readable with `jq`.

use std::io::Write;

use crate::verdict::Verdict;

/// Where verdict lines go.
pub struct VerdictLog {
    out: Box<dyn Write + Send>,
}

impl VerdictLog {
    pub fn open(path: &str) -> std::io::Result<VerdictLog> {
        let out: Box<dyn Write + Send> = if path == "stdout" {
            Box::new(std::io::LineWriter::new(std::io::stdout()))
        } else {
            Box::new(std::io::BufWriter::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?))
        };
        Ok(VerdictLog { out })
    }

    pub fn write(&mut self, v: &Verdict) {
        if serde_json::to_writer(&mut self.out, v).is_ok() {
            let _ = self.out.write_all(b"\n");
        }
    }

    /// A catalog verdict change, as one JSON line with `"catalog": true`.
    pub fn write_catalog(&mut self, c: &crate::correlate::CatalogChange) {
        let line = serde_json::json!({
            "catalog": true,
            "session_hash": crate::normalize::redact::hash_hex(c.session_key.as_bytes()),
            "server": c.server.as_deref(),
            "verdict": c.verdict,
        });
        if serde_json::to_writer(&mut self.out, &line).is_ok() {
            let _ = self.out.write_all(b"\n");
        }
    }

    /// Any other serializable record (drift events).
    pub fn write_json<T: serde::Serialize>(&mut self, v: &T) {
        if serde_json::to_writer(&mut self.out, v).is_ok() {
            let _ = self.out.write_all(b"\n");
        }
    }

    pub fn flush(&mut self) {
        let _ = self.out.flush();
    }
}
