//! A minimal protobuf writer for what mcp-health sends most: health spans.
//!
//! Building a generated `Span` per verdict costs two dozen `String`s (every attribute key and
//! value its own allocation) that are encoded once and freed; with pass-through on this was the
//! largest cost of the service (issue 11: `encode_to_vec` of health spans and the memory faults of
//! its buffers, about half its CPU). Attributes here are written straight into one reused buffer,
//! with their lengths computed up front; a span is written straight into its request, and its
//! own length patched in before it ([`Packer::push_with`]). `emit::health_spans` tests hold the
//! bytes to what prost decodes as the generated span of the same verdict.

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
    /// Where a request's buffer comes from and goes back to once every copy of its bytes is
    /// dropped (after its export), when the caller keeps some.
    buffers: Option<Buffers>,
    resource: Vec<u8>,
    scope: Vec<u8>,
    max_bytes: usize,
    /// About how many bytes are still to be pushed: sizes the next request's buffer.
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
        Packer { buffers: None, resource, scope, max_bytes, expected, room, items: Writer::default(), n: 0, done: Vec::new() }
    }

    /// Requests' buffers taken from `buffers` and given back to it after their export; then
    /// requests are at most [`Buffers::REQUEST_BYTES`] (below `max_bytes`, it is the limit).
    pub(crate) fn with_buffers(mut self, buffers: &Buffers) -> Self {
        self.buffers = Some(buffers.clone());
        self.max_bytes = self.max_bytes.min(Buffers::REQUEST_BYTES);
        self
    }

    fn fresh(&mut self) {
        let want = self.room + self.expected.min(self.max_bytes.saturating_add(4096));
        self.items.buf = match &self.buffers {
            Some(b) => b.take(want),
            None => Vec::with_capacity(want),
        };
        self.items.buf.resize(self.room, 0);
    }

    /// Whether the request being packed, with `add` more bytes, would pass `max_bytes`.
    fn past_limit(&self, add: usize) -> bool {
        self.items.buf.len() - self.room + add + self.resource.len() + self.scope.len() + 32 > self.max_bytes
    }

    /// Add one item (its message content), copied behind its length: the plain way, which
    /// [`Self::push_with`] is held to byte for byte in the tests.
    #[cfg(test)]
    fn push(&mut self, item: &[u8]) {
        let add = item.len() + 1 + varint_len(item.len() as u64);
        // With items written (n > 0) the buffer holds the room and them.
        if self.n > 0 && self.past_limit(add) {
            self.flush();
        }
        // The first item, or the first after a flush took the buffer.
        if self.items.buf.is_empty() {
            self.fresh();
        }
        self.items.message(2, item);
        self.n += 1;
    }

    /// Add one item that `write` appends (its message content) straight into the request, not
    /// into a buffer of its own that is then copied: its length is written after it, in the two
    /// bytes kept for it before it (a varint of up to 16 383; an item of another size moves by a
    /// byte or more to fit its length). An item that takes the request past `max_bytes` moves to
    /// the next one, as [`Self::push`] would have put it.
    pub(crate) fn push_with(&mut self, write: impl FnOnce(&mut Writer)) {
        if self.items.buf.is_empty() {
            self.fresh();
        }
        let at = self.items.buf.len();
        self.items.key(2, 2);
        self.items.buf.extend_from_slice(&[0, 0]);
        let body = self.items.buf.len();
        write(&mut self.items);
        let len = self.items.buf.len() - body;
        if (0x80..0x4000).contains(&len) {
            self.items.buf[body - 2] = (len as u8) | 0x80;
            self.items.buf[body - 1] = (len >> 7) as u8;
        } else {
            let mut head = Writer::default();
            head.varint(len as u64);
            self.items.buf.splice(body - 2..body, head.buf);
        }
        if self.n > 0 && self.past_limit(0) {
            let item = self.items.buf.split_off(at);
            self.flush();
            self.fresh();
            self.items.buf.extend_from_slice(&item);
        }
        self.n += 1;
    }

    fn flush(&mut self) {
        if self.n == 0 {
            return;
        }
        // The head, then written into the room before the items: one buffer, no copy of them.
        let field = |len: usize| 1 + varint_len(len as u64) + len;
        let items = self.items.buf.len() - self.room;
        self.expected = self.expected.saturating_sub(items);
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
        let bytes = match &self.buffers {
            Some(b) => b.lend(buf, start),
            None => bytes::Bytes::from(buf).slice(start..),
        };
        self.done.push((bytes, self.n));
        self.n = 0;
    }

    /// Every request's bytes and item count.
    pub(crate) fn finish(mut self) -> Vec<(bytes::Bytes, u64)> {
        self.flush();
        self.done
    }
}

/// Request buffers that come back: a buffer a request was packed in returns here when the last
/// copy of the request's bytes is dropped (its export done), and a later request is packed in
/// it. A buffer of a quarter MiB or more is past what the allocator keeps on its free lists:
/// each was fresh pages from the OS, and their page faults (2 MiB requests zeroing 2 MiB
/// pages) were the largest part of encoding health spans for export. With these buffers,
/// requests are at most [`Buffers::REQUEST_BYTES`], all in buffers of one size,
/// [`Buffers::CAPACITY`]; a request expected under half of that gets a buffer of its own size,
/// so that no buffer is more than twice what its request holds while it waits for the backend
/// (the memory limiter counts the request's bytes). At most [`Buffers::KEEP`] wait here,
/// outside any reservation: the memory limiter sees them only in its resident-set sample.
#[derive(Clone, Default)]
pub(crate) struct Buffers(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl Buffers {
    /// Requests packed in these buffers are this large at most: a few hundred health spans.
    /// Smaller than the exporters' default limit (2 MiB), for one size of buffer that is used
    /// again and again: a request more costs a few microseconds, a fresh 2 MiB buffer some
    /// hundreds.
    pub(crate) const REQUEST_BYTES: usize = 512 << 10;
    /// The size of every kept buffer: a request of `REQUEST_BYTES`, its head and an item's margin.
    pub(crate) const CAPACITY: usize = Self::REQUEST_BYTES + (8 << 10);
    /// Buffers kept at most (8 MiB).
    pub(crate) const KEEP: usize = 16;

    /// A buffer with room for `want` bytes: a kept one when `want` is between half of
    /// `CAPACITY` and all of it, else a new one of `want` bytes.
    fn take(&self, want: usize) -> Vec<u8> {
        if !(Self::CAPACITY / 2..=Self::CAPACITY).contains(&want) {
            return Vec::with_capacity(want);
        }
        let kept = self.0.lock().ok().and_then(|mut kept| kept.pop());
        kept.unwrap_or_else(|| Vec::with_capacity(Self::CAPACITY))
    }

    /// A buffer back from its request: kept if it is of the kept size and there is room.
    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() != Self::CAPACITY {
            return;
        }
        buf.clear();
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() < Self::KEEP {
                kept.push(buf);
            }
        }
    }

    /// `buf[start..]` as bytes whose buffer comes back here when they are dropped.
    fn lend(&self, buf: Vec<u8>, start: usize) -> bytes::Bytes {
        bytes::Bytes::from_owner(Lent { buf, start, home: self.clone() })
    }

    /// How many buffers wait to be used again.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.0.lock().map(|k| k.len()).unwrap_or(0)
    }
}

/// A request's buffer lent out with its bytes (see [`Buffers`]).
struct Lent {
    buf: Vec<u8>,
    start: usize,
    home: Buffers,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packer(max: usize) -> Packer {
        Packer::new(b"resource".to_vec(), b"scope".to_vec(), max, 64 * 1024)
    }

    /// Items of every length class of their varint (1, 2 and 3 bytes), written in place and
    /// pushed as copies: the same requests, byte for byte, split at the same items.
    #[test]
    fn items_written_in_place_are_the_items_pushed() {
        let items: Vec<Vec<u8>> = [0usize, 5, 127, 128, 1000, 16_383, 16_384, 40_000, 3, 700]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b + i) as u8).collect())
            .collect();
        for max in [1 << 20, 20_000, 3000, 10] {
            let (mut pushed, mut written) = (packer(max), packer(max).with_buffers(&Buffers::default()));
            for item in &items {
                pushed.push(item);
                written.push_with(|w| w.buf.extend_from_slice(item));
            }
            let (a, b) = (pushed.finish(), written.finish());
            assert!(a.len() > 1 || max == 1 << 20, "max {max}: {} requests", a.len());
            assert_eq!(a, b, "max {max}");
        }
    }

    /// A request's buffer comes back when the last copy of its bytes goes and is used again for
    /// the next request of about its size, not for a much smaller one; no more than `KEEP` wait,
    /// and a tick's last, small request is not packed in a large buffer.
    #[test]
    fn a_request_buffer_returns_after_its_bytes_are_dropped() {
        let buffers = Buffers::default();
        let one = |n: usize| {
            let mut p = Packer::new(Vec::new(), Vec::new(), 4 << 20, n).with_buffers(&buffers);
            p.push_with(|w| w.buf.resize(n, 7));
            p.finish().pop().expect("a request").0
        };
        let first = one(400_000);
        let at = first.as_ptr();
        let copy = first.clone();
        drop(first);
        assert_eq!(buffers.kept(), 0, "a copy of the bytes still holds the buffer");
        drop(copy);
        assert_eq!(buffers.kept(), 1);
        let small = one(100_000);
        assert_eq!(buffers.kept(), 1, "a much smaller request is not packed in it");
        let second = one(300_000);
        assert_eq!(buffers.kept(), 0);
        assert_eq!(second.as_ptr(), at, "the same buffer, used again");
        assert_eq!(&second[second.len() - 10..], &[7; 10]);
        let many: Vec<_> = (0..Buffers::KEEP + 4).map(|_| one(400_000)).collect();
        drop((many, small, second));
        assert_eq!(buffers.kept(), Buffers::KEEP, "no more than KEEP wait");

        // 1.2 requests' worth, expected: two requests, the second in a buffer of its own size.
        let item = vec![1u8; 1000];
        let n = Buffers::REQUEST_BYTES * 12 / 10 / 1003;
        let mut p = Packer::new(Vec::new(), Vec::new(), 4 << 20, n * 1003).with_buffers(&buffers);
        for _ in 0..n {
            p.push_with(|w| w.buf.extend_from_slice(&item));
        }
        let done = p.finish();
        assert_eq!(done.len(), 2, "split at REQUEST_BYTES, below the caller's limit");
        assert!(done.iter().all(|(b, _)| b.len() <= Buffers::REQUEST_BYTES));
        assert_eq!(buffers.kept(), Buffers::KEEP - 1, "the first request's buffer was a kept one");
        drop(done);
        assert_eq!(buffers.kept(), Buffers::KEEP, "the second's was not: only the first came back");
    }
}
