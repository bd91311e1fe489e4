//! A minimal protobuf writer for what mcp-health sends most: health spans.
//!
//! Building a generated `Span` per verdict costs two dozen `String`s (every attribute key and
//! value its own allocation) that are encoded once and freed; with pass-through on this was the
//! largest cost of the service (issue 11: `encode_to_vec` of health spans and the memory faults of
//! its buffers, about half its CPU). Attributes here are written straight into one reused buffer,
//! with their lengths computed up front; a span is written into a scratch buffer and then copied
//! behind its length. `emit::health_spans` tests hold the bytes to what prost decodes as the
//! generated span of the same verdict.

/// A value of one attribute.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
}

pub(crate) fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Bytes being written.
#[derive(Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    pub(crate) fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire)));
    }

    pub(crate) fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn fixed64(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, 1);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub(crate) fn int(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v);
        }
    }

    /// A `KeyValue` as field `field` of the message being written (attributes are field 9 of a
    /// span, 1 of a resource, 3 of a scope).
    pub(crate) fn attribute(&mut self, field: u32, key: &str, v: Val<'_>) {
        let any = match v {
            Val::Str(s) => 1 + varint_len(s.len() as u64) + s.len(),
            Val::Int(i) => 1 + varint_len(i as u64),
            Val::Bool(_) => 2,
        };
        self.key_value_head(field, key, any);
        match v {
            Val::Str(s) => self.bytes(1, s.as_bytes()),
            Val::Int(i) => {
                self.key(3, 0);
                self.varint(i as u64);
            }
            Val::Bool(b) => {
                self.key(2, 0);
                self.buf.push(u8::from(b));
            }
        }
    }

    /// A `KeyValue` whose value is an array of strings.
    pub(crate) fn attribute_strs(&mut self, field: u32, key: &str, items: &[&str]) {
        let item = |s: &str| 1 + varint_len((1 + varint_len(s.len() as u64) + s.len()) as u64) + 1 + varint_len(s.len() as u64) + s.len();
        let array: usize = items.iter().map(|s| item(s)).sum();
        let any = 1 + varint_len(array as u64) + array;
        self.key_value_head(field, key, any);
        self.key(5, 2);
        self.varint(array as u64);
        for s in items {
            self.key(1, 2);
            self.varint((1 + varint_len(s.len() as u64) + s.len()) as u64);
            self.bytes(1, s.as_bytes());
        }
    }

    /// A `KeyValue` field's key, its length and its key string, up to the `AnyValue` of `any`
    /// bytes the caller writes next.
    fn key_value_head(&mut self, field: u32, key: &str, any: usize) {
        let kv = 1 + varint_len(key.len() as u64) + key.len() + 1 + varint_len(any as u64) + any;
        self.key(field, 2);
        self.varint(kv as u64);
        self.bytes(1, key.as_bytes());
        self.key(2, 2);
        self.varint(any as u64);
    }

    /// Field `field` holding `content` (an encoded message).
    pub(crate) fn message(&mut self, field: u32, content: &[u8]) {
        self.bytes(field, content);
    }
}

/// Items (spans or log records, each an encoded message) packed into export requests of at
/// most `max_bytes`: `ExportTraceServiceRequest` and `ExportLogsServiceRequest` have the same
/// shape and field numbers — request { 1: resource_x { 1: resource, 2: scope_x { 1: scope,
/// 2: item… } } } — so one packer writes both. An item larger than `max_bytes` alone is one
/// request.
pub(crate) struct Packer {
    resource: Vec<u8>,
    scope: Vec<u8>,
    max_bytes: usize,
    /// Sizes the next request's buffer.
    expected: usize,
    /// Room left at the front of `items` for the request's head (written last, in place), so a
    /// request is never copied behind its head (issue 11: that copy and the page faults of its
    /// fresh buffer were 4–5 % of the inline service's CPU).
    room: usize,
    items: Writer,
    n: u64,
    done: Vec<(bytes::Bytes, u64)>,
}

impl Packer {
    /// `resource` and `scope`: the encoded `Resource` and `InstrumentationScope`; `expected`:
    /// about how many bytes will be pushed (the buffer is sized once, not grown by copying).
    pub(crate) fn new(resource: Vec<u8>, scope: Vec<u8>, max_bytes: usize, expected: usize) -> Self {
        // The head: two keys and two lengths (at most 5 bytes each) around each of the resource
        // and the scope, themselves behind a key and a length.
        let room = resource.len() + scope.len() + 4 * (1 + 5);
        let expected = expected.min(max_bytes.saturating_add(4096));
        Packer { resource, scope, max_bytes, expected, room, items: Writer::default(), n: 0, done: Vec::new() }
    }

    fn fresh(&mut self) {
        self.items.buf = Vec::with_capacity(self.room + self.expected);
        self.items.buf.resize(self.room, 0);
    }

    /// Add one item (its message content).
    pub(crate) fn push(&mut self, item: &[u8]) {
        let add = item.len() + 1 + varint_len(item.len() as u64);
        // With items written (n > 0) the buffer holds the room and them.
        if self.n > 0 && self.items.buf.len() - self.room + add + self.resource.len() + self.scope.len() + 32 > self.max_bytes {
            self.flush();
        }
        // The first item, or the first after a flush took the buffer.
        if self.items.buf.is_empty() {
            self.fresh();
        }
        self.items.message(2, item);
        self.n += 1;
    }

    fn flush(&mut self) {
        if self.n == 0 {
            return;
        }
        // The head, then written into the room before the items: one buffer, no copy of them.
        let field = |len: usize| 1 + varint_len(len as u64) + len;
        let items = self.items.buf.len() - self.room;
        let scoped = field(self.scope.len()) + items;
        let resourced = field(self.resource.len()) + field(scoped);
        let mut head = Writer { buf: Vec::with_capacity(self.room) };
        head.key(1, 2);
        head.varint(resourced as u64);
        head.message(1, &self.resource);
        head.key(2, 2);
        head.varint(scoped as u64);
        head.message(1, &self.scope);
        let start = self.room - head.buf.len();
        let mut buf = std::mem::take(&mut self.items.buf);
        buf[start..self.room].copy_from_slice(&head.buf);
        self.done.push((bytes::Bytes::from(buf).slice(start..), self.n));
        self.n = 0;
    }

    /// Every request's bytes and item count.
    pub(crate) fn finish(mut self) -> Vec<(bytes::Bytes, u64)> {
        self.flush();
        self.done
    }
}
