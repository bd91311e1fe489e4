//! The evidence tap: a transparent MCP proxy that emits full evidence over OTLP for any client and
//! server, with no code change on either side (issue 5).
//!
//! Two modes share one observer:
//!
//! - [`stdio`]: wraps a stdio server command; the client's stdin goes to the server's stdin and the
//!   server's stdout to our stdout byte for byte (newline-delimited JSON-RPC), stderr is inherited.
//! - [`http`]: a reverse proxy in front of a streamable-HTTP server; every request and response goes
//!   through unchanged (headers, bodies, `text/event-stream` streams teed, never buffered).
//!
//! Forwarding never waits for parsing: the pumps hand a copy of each chunk to the observer task
//! through a bounded queue (full → the copy is dropped and counted, the bytes still flow). The
//! [`jsonrpc::Observer`] turns the JSON-RPC traffic into OTLP spans (OpenTelemetry MCP conventions
//! plus this project's `mcp_health.*` evidence attributes) and [`export`] batches them to an OTLP
//! endpoint through another bounded queue.
//!
//! What leaves: typed facts only — method, request id, tool name, session id, versions, capability,
//! cursors and digests of `tools/list` pages, progress token/value/total, error codes, HTTP status,
//! the sanitized `WWW-Authenticate` error word and scope. Never arguments, results, messages,
//! tokens, raw headers or bodies.

pub(crate) mod export;
pub(crate) mod http;
pub(crate) mod jsonrpc;
pub(crate) mod reader;
pub(crate) mod stdio;
pub(crate) mod upstream_tls;
pub(crate) mod verify;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Unix time in nanoseconds.
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

static ID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A random non-zero 64-bit value (ids only need uniqueness, not cryptographic strength).
fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(ID_COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u64(now_ns());
    h.finish() | 1
}

/// A fresh W3C trace id.
pub fn new_trace_id() -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&random_u64().to_be_bytes());
    t[8..].copy_from_slice(&random_u64().to_be_bytes());
    t
}

/// A fresh span id.
pub fn new_span_id() -> [u8; 8] {
    random_u64().to_be_bytes()
}

/// Splits a byte stream into lines (`\n`-terminated, a trailing `\r` dropped), bounded: a line
/// longer than `max` is skipped whole and counted, so a runaway message cannot grow memory.
pub(crate) struct LineSplitter {
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
    pub oversize: u64,
}

impl LineSplitter {
    pub(crate) fn new(max: usize) -> Self {
        LineSplitter { buf: Vec::new(), max, skipping: false, oversize: 0 }
    }

    /// Feed a chunk; `f` is called with each complete line.
    pub(crate) fn feed(&mut self, mut chunk: &[u8], mut f: impl FnMut(&[u8])) {
        while let Some(p) = chunk.iter().position(|b| *b == b'\n') {
            let (head, rest) = (&chunk[..p], &chunk[p + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.buf.len() + head.len() > self.max {
                self.oversize += 1;
            } else if self.buf.is_empty() {
                f(trim_cr(head));
            } else {
                self.buf.extend_from_slice(head);
                let line = std::mem::take(&mut self.buf);
                f(trim_cr(&line));
            }
            self.buf.clear();
            chunk = rest;
        }
        if self.skipping {
            return;
        }
        if self.buf.len() + chunk.len() > self.max {
            self.oversize += 1;
            self.buf.clear();
            self.skipping = true;
        } else {
            self.buf.extend_from_slice(chunk);
        }
    }

    /// Bytes were lost before the next chunk (not handed to the observer): the line they were
    /// part of is dropped whole, up to the next newline, never read as the bytes around the gap
    /// joined (which could be JSON, and say something the message did not).
    pub(crate) fn gap(&mut self) {
        self.buf = Vec::new();
        self.skipping = true;
    }

    /// What is left without a newline at end of stream (a last message without `\n`).
    pub(crate) fn finish(&mut self, mut f: impl FnMut(&[u8])) {
        if !self.skipping && !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            f(trim_cr(&line));
        }
        self.skipping = false;
    }
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// An incremental `text/event-stream` parser (the WHATWG event-stream format): `data:` lines are
/// joined with `\n` and an event is dispatched at a blank line. Only the data is kept; `id:`,
/// `event:` and `retry:` fields are not evidence. Bounded like [`LineSplitter`].
pub(crate) struct SseParser {
    lines: LineSplitter,
    data: Vec<u8>,
    has_data: bool,
    /// The current event passed `max` (its data, newlines included): it is dropped whole.
    too_big: bool,
    /// Events dropped for their size.
    pub oversize_events: u64,
    max: usize,
    /// A leading `\r` that may be the first half of a `\r\n` split across chunks.
    pending_cr: bool,
    /// Bytes were lost in the current event ([`Self::gap`]): it is dropped at its end.
    damaged: bool,
}

impl SseParser {
    pub(crate) fn new(max: usize) -> Self {
        SseParser {
            lines: LineSplitter::new(max),
            data: Vec::new(),
            has_data: false,
            too_big: false,
            oversize_events: 0,
            max,
            pending_cr: false,
            damaged: false,
        }
    }

    /// Bytes were lost before the next chunk: the event they were part of is dropped (up to the
    /// next blank line: when the lost bytes held an event's end, what follows is the tail of
    /// another event, dropped with it), never dispatched with the gap joined.
    pub(crate) fn gap(&mut self) {
        self.lines.gap();
        self.pending_cr = false;
        self.damaged = true;
    }

    /// Feed a chunk; `f` is called with the data of each complete event.
    pub(crate) fn feed(&mut self, chunk: &[u8], mut f: impl FnMut(&[u8])) {
        // The format allows CR, LF or CRLF line ends: normalize a lone CR to LF.
        let normalized;
        let chunk = if chunk.contains(&b'\r') || self.pending_cr {
            let mut v = Vec::with_capacity(chunk.len());
            let mut i = 0;
            if self.pending_cr {
                self.pending_cr = false;
                if chunk.first() == Some(&b'\n') {
                    i = 1; // the LF of a CRLF whose CR ended the previous chunk
                }
            }
            while i < chunk.len() {
                let b = chunk[i];
                if b == b'\r' {
                    v.push(b'\n');
                    if i + 1 == chunk.len() {
                        self.pending_cr = true;
                    } else if chunk[i + 1] == b'\n' {
                        i += 1;
                    }
                } else {
                    v.push(b);
                }
                i += 1;
            }
            normalized = v;
            &normalized[..]
        } else {
            chunk
        };
        let (data, has_data, too_big, oversize, max, damaged) =
            (&mut self.data, &mut self.has_data, &mut self.too_big, &mut self.oversize_events, self.max, &mut self.damaged);
        self.lines.feed(chunk, |line| {
            if line.is_empty() {
                if *damaged {
                    // Counted where the bytes were lost.
                } else if *too_big {
                    *oversize += 1;
                } else if *has_data {
                    f(data);
                }
                data.clear();
                *has_data = false;
                *too_big = false;
                *damaged = false;
                return;
            }
            let (field, value) = match line.iter().position(|b| *b == b':') {
                Some(0) => return, // a comment
                Some(p) => {
                    let v = &line[p + 1..];
                    (&line[..p], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &b""[..]),
            };
            if field == b"data" {
                // The limit counts the joining newline too: a stream of empty `data:` lines is
                // bytes like any other.
                let sep = usize::from(*has_data);
                if *too_big || data.len() + sep + value.len() > max {
                    // An event past the limit is dropped whole (never half of a message).
                    *too_big = true;
                    data.clear();
                    data.shrink_to(4096);
                } else {
                    if sep == 1 {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(value);
                }
                *has_data = true;
            }
        });
    }
}

/// The sanitized content of a `WWW-Authenticate` challenge: the `error` code word (a fixed
/// vocabulary) and the `scope` (RFC 6749 scope tokens only, through `redact::scope`). Nothing else
/// of the header — realm, `error_description`, `resource_metadata` — is kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub error: Option<&'static str>,
    pub scope: Option<Box<str>>,
}

/// Parse the Bearer challenge of a `WWW-Authenticate` value (RFC 6750 §3, RFC 9110 §11.6.1).
/// Tolerates several challenges in one value; the first `Bearer` one is read.
pub(crate) fn parse_www_authenticate(h: &str) -> Challenge {
    let mut out = Challenge::default();
    let params = auth_params(h);
    let mut description: Option<String> = None;
    for (k, v) in params {
        match k.to_ascii_lowercase().as_str() {
            "error" if out.error.is_none() => {
                out.error = Some(match v.as_str() {
                    "invalid_token" => "invalid_token",
                    "insufficient_scope" => "insufficient_scope",
                    "invalid_request" => "invalid_request",
                    _ => "other",
                })
            }
            "scope" if out.scope.is_none() => out.scope = crate::normalize::redact::scope(&v),
            "error_description" => description = Some(v),
            _ => {}
        }
    }
    // Some servers (the `mcp` Python SDK's bearer middleware) name the missing scope only in the
    // description ("Required scope: tools:call"). Read the scope tokens after `scope:` /
    // `scopes:`, through `redact::scope`; nothing else of the description is kept.
    if out.scope.is_none() && out.error == Some("insufficient_scope") {
        if let Some(d) = description {
            let lower = d.to_ascii_lowercase();
            let at = lower.find("scopes:").map(|i| i + 7).or_else(|| lower.find("scope:").map(|i| i + 6));
            if let Some(i) = at {
                // The first token, and the next ones only while the list goes on with commas:
                // "Required scope: tools:call for …" → `tools:call`; "scopes: a, b." → `a b`.
                let mut kept: Vec<&str> = Vec::new();
                for w in d[i..].split_whitespace() {
                    let more = w.ends_with(',');
                    let t = w.trim_end_matches([',', '.', ';', ')']);
                    if !t.is_empty() {
                        kept.push(t);
                    }
                    if !more {
                        break;
                    }
                }
                out.scope = crate::normalize::redact::scope(&kept.join(" "));
            }
        }
    }
    out
}

/// The auth-params of the first Bearer challenge, `(name, value)` with quoted strings unescaped.
fn auth_params(h: &str) -> Vec<(String, String)> {
    let b = h.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let mut in_bearer = false;
    let mut seen_bearer = false;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t' || b[*i] == b',') {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            break;
        }
        // A token: an auth-scheme or a param name.
        let start = i;
        while i < b.len() && !matches!(b[i], b' ' | b'\t' | b',' | b'=') {
            i += 1;
        }
        let token = &h[start..i];
        let mut j = i;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        if j < b.len() && b[j] == b'=' && !token.is_empty() {
            // name = value
            i = j + 1;
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            let mut value = String::new();
            if i < b.len() && b[i] == b'"' {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    // Push whole UTF-8 characters.
                    let ch_len = utf8_len(b[i]);
                    value.push_str(h.get(i..i + ch_len).unwrap_or(""));
                    i += ch_len;
                }
                i += 1; // closing quote
            } else {
                let vs = i;
                while i < b.len() && b[i] != b',' && b[i] != b' ' && b[i] != b'\t' {
                    i += 1;
                }
                value.push_str(&h[vs..i]);
            }
            if in_bearer {
                out.push((token.to_string(), value));
            }
        } else {
            // A new challenge's scheme (token68 values after a scheme are skipped as params
            // without `=`).
            if token.eq_ignore_ascii_case("bearer") && !seen_bearer {
                in_bearer = true;
                seen_bearer = true;
            } else if !token.is_empty() && token.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
                in_bearer = false;
            }
            if token.is_empty() {
                i += 1;
            }
        }
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_and_bounded() {
        let mut s = LineSplitter::new(16);
        let mut got: Vec<Vec<u8>> = Vec::new();
        s.feed(b"ab", |l| got.push(l.to_vec()));
        s.feed(b"c\r\nde\n", |l| got.push(l.to_vec()));
        s.feed(b"0123456789abcdefXYZ", |l| got.push(l.to_vec()));
        s.feed(b"more\nok\n", |l| got.push(l.to_vec()));
        s.feed(b"tail", |l| got.push(l.to_vec()));
        s.finish(|l| got.push(l.to_vec()));
        assert_eq!(got, vec![b"abc".to_vec(), b"de".to_vec(), b"ok".to_vec(), b"tail".to_vec()]);
        assert_eq!(s.oversize, 1);
    }

    #[test]
    fn sse_events_with_multiline_data_and_crlf_split() {
        let mut p = SseParser::new(1 << 20);
        let mut got: Vec<String> = Vec::new();
        let stream = b": comment\r\nevent: message\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata:x\n\nretry: 5\n\n";
        for part in stream.chunks(3) {
            p.feed(part, |d| got.push(String::from_utf8_lossy(d).into_owned()));
        }
        assert_eq!(got, vec!["{\"a\":\n1}".to_string(), "x".to_string()]);
    }

    /// Issue 22: 600 MB of `data:` lines once stayed in memory: the limit counts the newlines
    /// that join them, and an event past it is dropped whole and counted.
    #[test]
    fn an_oversize_event_is_dropped_whole_and_counted() {
        let mut p = SseParser::new(1024);
        let mut got = Vec::new();
        let flood = "data:\n".repeat(100_000);
        p.feed(flood.as_bytes(), |d| got.push(d.to_vec()));
        assert!(p.data.len() <= 1024 && p.data.capacity() <= 64 * 1024, "held {} bytes", p.data.capacity());
        p.feed(b"\ndata: {\"ok\":1}\n\n", |d| got.push(d.to_vec()));
        assert_eq!(got, vec![b"{\"ok\":1}".to_vec()], "the flood is no event; the next one is whole");
        assert_eq!(p.oversize_events, 1);
    }

    /// Bytes lost on the way to the observer: the line or event they were part of is dropped
    /// whole; spliced, `{"isError":true,…}` minus a chunk could read as a success.
    #[test]
    fn a_gap_drops_the_line_or_event_it_was_in() {
        let mut s = LineSplitter::new(1024);
        let mut got: Vec<Vec<u8>> = Vec::new();
        s.feed(b"{\"id\":1,\"result\":{\"a\":\"", |l| got.push(l.to_vec()));
        s.gap(); // lost: `x","isError":true}}\n{"id":2,"result":{"a":"`
        s.feed(b"y\"}}\n{\"id\":3}\n", |l| got.push(l.to_vec()));
        assert_eq!(got, vec![b"{\"id\":3}".to_vec()]);

        let mut p = SseParser::new(1024);
        let mut got: Vec<Vec<u8>> = Vec::new();
        p.feed(b"data: {\"id\":1,\"result\":{\"a\":\"", |d| got.push(d.to_vec()));
        p.gap(); // lost: an event's end and the next one's beginning
        p.feed(b"y\"}}\n\ndata: {\"id\":3}\n\n", |d| got.push(d.to_vec()));
        assert_eq!(got, vec![b"{\"id\":3}".to_vec()]);
        p.feed(b"data: x\n", |d| got.push(d.to_vec()));
        p.gap(); // lost inside one event, then the rest of it
        p.feed(b"data: y\n\ndata: z\n\n", |d| got.push(d.to_vec()));
        assert_eq!(got, vec![b"{\"id\":3}".to_vec(), b"z".to_vec()]);
        assert_eq!(p.oversize_events, 0, "counted where the bytes were lost, not as oversize");
    }

    #[test]
    fn www_authenticate_keeps_the_error_word_and_scope_only() {
        let c = parse_www_authenticate(
            r#"Bearer realm="mcp", error="insufficient_scope", error_description="needs SECRET-DESC", scope="tools:write files:read", resource_metadata="https://auth.example.test/.well-known/x""#,
        );
        assert_eq!(c, Challenge { error: Some("insufficient_scope"), scope: Some("tools:write files:read".into()) });
        let c = parse_www_authenticate(r#"Basic realm="x", Bearer error=invalid_token"#);
        assert_eq!(c.error, Some("invalid_token"));
        assert_eq!(c.scope, None);
        let c = parse_www_authenticate(r#"Bearer error="made_up_<script>", scope="ok bad\"quote""#);
        assert_eq!(c.error, Some("other"));
        assert_eq!(c.scope.as_deref(), Some("ok"));
        assert_eq!(parse_www_authenticate("Bearer"), Challenge::default());
        assert_eq!(
            parse_www_authenticate(r#"Basic realm="x", error="invalid_token""#),
            Challenge::default(),
            "only the Bearer challenge counts"
        );
        assert_eq!(parse_www_authenticate(""), Challenge::default());
        // The scope named only in the description (the `mcp` SDK's bearer middleware).
        let c = parse_www_authenticate(
            r#"Bearer error="insufficient_scope", error_description="Required scope: tools:call", resource_metadata="http://x/""#,
        );
        assert_eq!(c.scope.as_deref(), Some("tools:call"));
        let c =
            parse_www_authenticate(r#"Bearer error="insufficient_scope", error_description="Missing scopes: a:b, c. Ask SECRET-ADMIN""#);
        assert_eq!(c.scope.as_deref(), Some("a:b c"), "the listed scope tokens only");
        let c =
            parse_www_authenticate(r#"Bearer error="insufficient_scope", error_description="Required scope: files:write for SECRET-PATH""#);
        assert_eq!(c.scope.as_deref(), Some("files:write"));
        let c = parse_www_authenticate(r#"Bearer error="invalid_token", error_description="scope: not-read-for-401""#);
        assert_eq!(c.scope, None, "only an insufficient_scope challenge names a scope");
    }
}
