//! The evidence walk: an `ExportTraceServiceRequest` read straight from its wire bytes.
//!
//! Decoding a request into the generated structs costs an allocation per string, id and
//! attribute, and most of that is thrown away: mcp-health reads a few attributes of its MCP spans
//! and only the trace id of the others. The walk reads the protobuf encoding in place: every span
//! becomes a [`SpanView`] whose strings and ids are slices of the request (the attribute list is
//! a buffer reused from span to span), the dialect reads it, and only the facts it keeps are
//! copied. Spans without MCP evidence cost no allocation at all.
//!
//! It accepts exactly what prost accepts, so that a request it takes can be passed on as it came
//! and a request it refuses is one a decoder would refuse too: the same wire-type checks for
//! every known field, UTF-8 for every string, prost's varint and key rules, merging of repeated
//! occurrences of a singular message, unknown fields (and groups) skipped, and prost's recursion
//! limit (`tests/wire_walk.rs` holds the two to the same answer on mutated requests).
//!
//! Besides the batch it reports what admission needs to pass the bytes on without decoding them
//! ([`WireFacts`]): where each `ResourceSpans` and its resource sit, which resources came back
//! through an export loop, whether raw tool definitions or an earlier `mcp_health.via` are present.

use super::view::{AnyValue, ArrayValue, Event, KeyValue, KeyValueList, SpanView, Status, Value};
use super::NormalizedBatch;

/// prost's recursion limit: a message may sit at most this deep below the request.
pub const RECURSION_LIMIT: u32 = 100;

/// Why a request is not a valid `ExportTraceServiceRequest` (answered INVALID_ARGUMENT).
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum WireError {
    #[error("truncated protobuf message")]
    Truncated,
    #[error("invalid varint")]
    Varint,
    #[error("invalid protobuf key")]
    Key,
    #[error("invalid wire type {wire} for field {field}")]
    WireType { field: u32, wire: u8 },
    #[error("a string field is not UTF-8")]
    Utf8,
    #[error("messages nested deeper than the recursion limit")]
    TooDeep,
    #[error("unexpected end-group tag")]
    Group,
}

type R<T> = Result<T, WireError>;

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const I32: u8 = 5;

/// A cursor over one message's bytes; positions are offsets in the whole request.
#[derive(Clone, Copy)]
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn whole(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0, end: buf.len() }
    }

    fn sub(&self, (start, end): (usize, usize)) -> Self {
        Reader { buf: self.buf, pos: start, end }
    }

    fn more(&self) -> bool {
        self.pos < self.end
    }

    /// prost's `decode_varint`: at most 10 bytes, the tenth at most 1.
    #[inline(always)]
    fn varint(&mut self) -> R<u64> {
        // Keys and most lengths are one byte.
        if self.pos < self.end && self.buf[self.pos] < 0x80 {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(u64::from(b));
        }
        self.varint_slow()
    }

    #[cold]
    #[inline(never)]
    fn varint_slow(&mut self) -> R<u64> {
        let mut v: u64 = 0;
        for i in 0..10 {
            if self.pos >= self.end {
                return Err(WireError::Varint);
            }
            let b = self.buf[self.pos];
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                if i == 9 && b >= 2 {
                    return Err(WireError::Varint);
                }
                return Ok(v);
            }
        }
        Err(WireError::Varint)
    }

    /// prost's `decode_key`: a u32, wire type 0–5, field number at least 1.
    #[inline(always)]
    fn key(&mut self) -> R<(u32, u8)> {
        let k = self.varint()?;
        if k > u64::from(u32::MAX) {
            return Err(WireError::Key);
        }
        let wire = (k & 7) as u8;
        if wire > 5 {
            return Err(WireError::Key);
        }
        let field = (k as u32) >> 3;
        if field < 1 {
            return Err(WireError::Key);
        }
        Ok((field, wire))
    }

    /// A length-delimited field's content: its range.
    #[inline(always)]
    fn len_range(&mut self) -> R<(usize, usize)> {
        let len = self.varint()?;
        if len > (self.end - self.pos) as u64 {
            return Err(WireError::Truncated);
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, self.pos))
    }

    fn bytes(&mut self) -> R<&'a [u8]> {
        let (s, e) = self.len_range()?;
        Ok(&self.buf[s..e])
    }

    /// A string field, validated as UTF-8 as prost validates it. Nearly every string in OTLP is
    /// ASCII (keys, names, ids): checked a word at a time, without the general validator's
    /// set-up per call, which cost 5 % of the service's CPU with attributes of a few bytes each.
    #[inline]
    fn string(&mut self) -> R<&'a str> {
        let b = self.bytes()?;
        if ascii(b) {
            // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(b) });
        }
        std::str::from_utf8(b).map_err(|_| WireError::Utf8)
    }

    fn fixed64(&mut self) -> R<u64> {
        if self.end - self.pos < 8 {
            return Err(WireError::Truncated);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 8]);
        self.pos += 8;
        Ok(u64::from_le_bytes(b))
    }

    fn fixed32(&mut self) -> R<u32> {
        if self.end - self.pos < 4 {
            return Err(WireError::Truncated);
        }
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 4]);
        self.pos += 4;
        Ok(u32::from_le_bytes(b))
    }

    /// prost's `skip_field`, `limit` being the recursion budget of the message it sits in.
    fn skip(&mut self, field: u32, wire: u8, limit: u32) -> R<()> {
        if limit == 0 {
            return Err(WireError::TooDeep);
        }
        match wire {
            VARINT => {
                self.varint()?;
            }
            I64 => {
                self.fixed64()?;
            }
            I32 => {
                self.fixed32()?;
            }
            LEN => {
                self.len_range()?;
            }
            START_GROUP => loop {
                let (f, w) = self.key()?;
                if w == END_GROUP {
                    if f != field {
                        return Err(WireError::Group);
                    }
                    break;
                }
                self.skip(f, w, limit - 1)?;
            },
            _ => return Err(WireError::Group),
        }
        Ok(())
    }
}

/// Every byte below 0x80. OTLP strings are short (keys, names, ids): a word at a time inline, where
/// the library's `is_ascii` is a call with a set-up of its own for every few bytes.
#[inline(always)]
fn ascii(b: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let n = b.len();
    if n >= 8 {
        // Whole words, and the last eight bytes (overlapping) for the tail.
        let (words, _) = b.as_chunks::<8>();
        let last = b.last_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w));
        words.iter().fold(last, |acc, w| acc | u64::from_le_bytes(*w)) & HIGH == 0
    } else if n >= 4 {
        let first = b.first_chunk::<4>().map_or(0, |w| u32::from_le_bytes(*w));
        let last = b.last_chunk::<4>().map_or(0, |w| u32::from_le_bytes(*w));
        (first | last) & 0x8080_8080 == 0
    } else {
        b.iter().fold(0u8, |a, x| a | x) < 0x80
    }
}

fn expect(field: u32, wire: u8, want: u8) -> R<()> {
    if wire == want {
        Ok(())
    } else {
        Err(WireError::WireType { field, wire })
    }
}

/// The content range of a nested message field of a message whose budget is `limit`.
fn nested(r: &mut Reader<'_>, field: u32, wire: u8, limit: u32) -> R<(usize, usize)> {
    expect(field, wire, LEN)?;
    if limit == 0 {
        return Err(WireError::TooDeep);
    }
    r.len_range()
}

/// A `KeyValue` message (its budget `limit`), merged into `kv`.
fn key_value<'a>(mut r: Reader<'a>, limit: u32, kv: &mut KeyValue<'a>) -> R<()> {
    while r.more() {
        let (f, w) = r.key()?;
        match f {
            1 => {
                expect(f, w, LEN)?;
                kv.key = r.string()?;
            }
            2 => {
                let range = nested(&mut r, f, w, limit)?;
                let v = kv.value.get_or_insert(AnyValue { value: None });
                // Most values are one string or one integer, alone in their `AnyValue`: read
                // here, without the general reader's call and loop (the same rules apply).
                if let Some(single) = single_value(r.sub(range))? {
                    v.value = Some(single);
                } else {
                    any_value(r.sub(range), limit - 1, v)?;
                }
            }
            3 => {
                expect(f, w, VARINT)?;
                r.varint()?;
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    Ok(())
}

/// An `AnyValue` that is exactly one string field or one integer field: its value. `None` for
/// anything else (the general reader takes it), an error only where that reader would fail too.
#[inline]
fn single_value<'a>(mut r: Reader<'a>) -> R<Option<Value<'a>>> {
    let Some(&tag) = r.buf.get(r.pos) else { return Ok(None) };
    if r.pos >= r.end {
        return Ok(None);
    }
    match tag {
        0x0a => {
            r.pos += 1;
            let s = r.string()?;
            Ok((!r.more()).then_some(Value::StringValue(s)))
        }
        0x18 => {
            r.pos += 1;
            let n = r.varint()?;
            Ok((!r.more()).then_some(Value::IntValue(n as i64)))
        }
        _ => Ok(None),
    }
}

/// Read a repeated `KeyValue` field's element and push it.
#[inline(always)]
fn push_key_value<'a>(r: &mut Reader<'a>, f: u32, w: u8, limit: u32, out: &mut Vec<KeyValue<'a>>) -> R<()> {
    let range = nested(r, f, w, limit)?;
    push_key_value_at(r.buf, range, limit, out)
}

/// The `KeyValue` message at `range` (its field's budget `limit`), pushed.
#[inline(always)]
fn push_key_value_at<'a>(buf: &'a [u8], range: (usize, usize), limit: u32, out: &mut Vec<KeyValue<'a>>) -> R<()> {
    // The value message sits one level below the `KeyValue`: the fast path needs that budget.
    if limit >= 2 && push_plain_key_value(buf, range, out) {
        return Ok(());
    }
    let mut kv = KeyValue { key: "", value: None };
    key_value(Reader { buf, pos: range.0, end: range.1 }, limit - 1, &mut kv)?;
    out.push(kv);
    Ok(())
}

/// [`plain_key_value`] pushed in one step: built in place, not moved through a result.
#[inline(always)]
fn push_plain_key_value<'a>(buf: &'a [u8], range: (usize, usize), out: &mut Vec<KeyValue<'a>>) -> bool {
    match plain_key_value(buf, range) {
        Some(kv) => {
            out.push(kv);
            true
        }
        None => false,
    }
}

/// The `KeyValue` message at `range` (its field's budget `limit`).
#[inline(always)]
fn read_key_value(buf: &[u8], range: (usize, usize), limit: u32) -> R<KeyValue<'_>> {
    // The value message sits one level below the `KeyValue`: the fast path needs that budget.
    if limit >= 2 {
        if let Some(kv) = plain_key_value(buf, range) {
            return Ok(kv);
        }
    }
    let mut kv = KeyValue { key: "", value: None };
    key_value(Reader { buf, pos: range.0, end: range.1 }, limit - 1, &mut kv)?;
    Ok(kv)
}

/// The attribute as nearly every SDK encodes it — an ASCII key, then a value that is one ASCII
/// string or one integer, every length one byte — read by offsets: `None` for anything else,
/// which the general reader takes, errors included. The general path moved the key and the
/// value through several intermediate results on the stack; with a dozen attributes per span
/// that was the walk's largest cost. The value is read here rather than through
/// [`single_value`], its twin in the general path: calling that cost the walk 17 % more
/// instructions (callgrind, scaling bench).
#[inline(always)]
fn plain_key_value(buf: &[u8], (s, e): (usize, usize)) -> Option<KeyValue<'_>> {
    let b = &buf[s..e];
    let [0x0a, kl, ..] = *b else { return None };
    let kl = usize::from(kl);
    if kl >= 0x80 || b.len() < 2 + kl + 2 {
        return None;
    }
    let key = &b[2..2 + kl];
    let [0x12, vl, ..] = b[2 + kl..] else { return None };
    let vl = usize::from(vl);
    let v = &b[2 + kl + 2..];
    if vl >= 0x80 || v.len() != vl || !ascii(key) {
        return None;
    }
    let value = match *v {
        [0x0a, sl, ..] if usize::from(sl) == v.len() - 2 && ascii(&v[2..]) => {
            // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
            Value::StringValue(unsafe { std::str::from_utf8_unchecked(&v[2..]) })
        }
        [0x18, ..] => {
            let start = e - vl + 1;
            let mut r = Reader { buf, pos: start, end: e };
            match r.varint() {
                Ok(n) if r.pos == e => Value::IntValue(n as i64),
                _ => return None,
            }
        }
        _ => return None,
    };
    // SAFETY: checked ASCII above.
    let key = unsafe { std::str::from_utf8_unchecked(key) };
    Some(KeyValue { key, value: Some(AnyValue { value: Some(value) }) })
}

/// An `AnyValue` message merged into `v` (a oneof: the last field wins; two arrays or two
/// lists in a row merge, as prost merges them).
fn any_value<'a>(mut r: Reader<'a>, limit: u32, v: &mut AnyValue<'a>) -> R<()> {
    while r.more() {
        let (f, w) = r.key()?;
        match f {
            1 => {
                expect(f, w, LEN)?;
                v.value = Some(Value::StringValue(r.string()?));
            }
            2 => {
                expect(f, w, VARINT)?;
                v.value = Some(Value::BoolValue(r.varint()? != 0));
            }
            3 => {
                expect(f, w, VARINT)?;
                v.value = Some(Value::IntValue(r.varint()? as i64));
            }
            4 => {
                expect(f, w, I64)?;
                v.value = Some(Value::DoubleValue(f64::from_bits(r.fixed64()?)));
            }
            5 => {
                let range = nested(&mut r, f, w, limit)?;
                if !matches!(v.value, Some(Value::ArrayValue(_))) {
                    v.value = Some(Value::ArrayValue(ArrayValue::default()));
                }
                let Some(Value::ArrayValue(a)) = &mut v.value else { unreachable!("set above") };
                let mut inner = r.sub(range);
                while inner.more() {
                    let (f2, w2) = inner.key()?;
                    if f2 == 1 {
                        let range2 = nested(&mut inner, f2, w2, limit - 1)?;
                        let mut item = AnyValue { value: None };
                        any_value(inner.sub(range2), limit - 2, &mut item)?;
                        a.values.push(item);
                    } else {
                        inner.skip(f2, w2, limit - 1)?;
                    }
                }
            }
            6 => {
                let range = nested(&mut r, f, w, limit)?;
                if !matches!(v.value, Some(Value::KvlistValue(_))) {
                    v.value = Some(Value::KvlistValue(KeyValueList::default()));
                }
                let Some(Value::KvlistValue(l)) = &mut v.value else { unreachable!("set above") };
                let mut inner = r.sub(range);
                while inner.more() {
                    let (f2, w2) = inner.key()?;
                    if f2 == 1 {
                        push_key_value(&mut inner, f2, w2, limit - 1, &mut l.values)?;
                    } else {
                        inner.skip(f2, w2, limit - 1)?;
                    }
                }
            }
            7 => {
                expect(f, w, LEN)?;
                v.value = Some(Value::BytesValue(r.bytes()?));
            }
            8 => {
                expect(f, w, VARINT)?;
                v.value = Some(Value::StringValueStrindex(r.varint()? as i32));
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    Ok(())
}

/// Validate a message of strings only (an `EntityRef`: fields 1–4 are strings).
fn strings_message(mut r: Reader<'_>, limit: u32) -> R<()> {
    while r.more() {
        let (f, w) = r.key()?;
        match f {
            1..=4 => {
                expect(f, w, LEN)?;
                r.string()?;
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    Ok(())
}

/// Where one `ResourceSpans` sits in the request, for passing it on without a decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceSpansRange {
    /// Offset of its field key in the request.
    pub tag_start: usize,
    /// Its content.
    pub start: usize,
    pub end: usize,
    /// Its resource field: `(key offset, content start, content end)`, when exactly one.
    pub resource: Option<(usize, usize, usize)>,
    /// More than one `resource` field (prost merges them).
    pub resource_fields: u32,
    /// Came back through an export loop: dropped.
    pub looped: bool,
    pub spans: u64,
}

/// What admission needs besides the batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireFacts {
    pub resources: Vec<ResourceSpansRange>,
    /// Spans in the request, looped ones included.
    pub spans: u64,
    /// Spans in resources that came back through an export loop.
    pub looped_spans: u64,
    /// `mcp_health.catalog.tools` somewhere (resource, scope, span, event or link) of a resource
    /// that is not looped: the request must be rebuilt without it.
    pub raw_definitions: bool,
    /// A kept resource already carries `mcp_health.via` (another mcp-health passed it on).
    pub via_present: bool,
}

/// [`walk_with`] the default settings (no receipt key trusted; tests, tools).
pub fn walk(buf: &[u8], me: &str) -> Result<(NormalizedBatch, WireFacts), WireError> {
    walk_with(buf, me, &super::Settings::default())
}

/// One walk of a request: the batch (evidence of every kept span) and the facts.
pub fn walk_with(buf: &[u8], me: &str, settings: &super::Settings) -> Result<(NormalizedBatch, WireFacts), WireError> {
    settings.fit_thread();
    let mut out = NormalizedBatch::default();
    // Room for every span of the request at once: grown scope by scope, the evidence of a
    // 513-span request in two resources was moved once more (some 70 KB copied). At most what
    // the request's size can carry: a span that gives evidence has valid ids and an evidence
    // key (in the dialects that read attributes), so a request of empty span tags does not
    // reserve a hundred times its size; past the estimate the batch grows as it must.
    let spans = span_count(buf).unwrap_or(0).min((buf.len() / MIN_EVIDENCE_SPAN_BYTES) as u64);
    out.evidence.reserve_exact(spans as usize);
    let mut facts = WireFacts::default();
    let mut scratch = Scratch { ranges: Vec::new(), scopes: Vec::new(), held: Vec::new(), settings };
    let mut r = Reader::whole(buf);
    let limit = RECURSION_LIMIT;
    while r.more() {
        let tag_start = r.pos;
        let (f, w) = r.key()?;
        if f == 1 {
            let range = nested(&mut r, f, w, limit)?;
            let rs = resource_spans(r.sub(range), limit - 1, tag_start, me, &mut out, &mut facts, &mut scratch)?;
            facts.resources.push(rs);
        } else {
            r.skip(f, w, limit)?;
        }
    }
    Ok((out, facts))
}

/// The fewest wire bytes of a span that gives evidence: its trace id (18 bytes with tag and
/// length) and span id (10), and one attribute with an evidence key (at least 8).
const MIN_EVIDENCE_SPAN_BYTES: usize = 36;

/// Buffers reused from span to span, and the normalizer's settings carried down with them to
/// each span's reader.
struct Scratch<'s> {
    ranges: Vec<(usize, usize)>,
    scopes: Vec<(usize, usize)>,
    /// A span's attributes read but not (yet) kept (`span_message`).
    held: Vec<(usize, usize)>,
    settings: &'s super::Settings,
}

fn resource_spans<'a>(
    mut r: Reader<'a>,
    limit: u32,
    tag_start: usize,
    me: &str,
    out: &mut NormalizedBatch,
    facts: &mut WireFacts,
    scratch: &mut Scratch,
) -> R<ResourceSpansRange> {
    let mut range = ResourceSpansRange { tag_start, start: r.pos, end: r.end, resource: None, resource_fields: 0, looped: false, spans: 0 };
    let mut resource_attrs: Vec<KeyValue<'a>> = Vec::new();
    let mut scope_spans: Vec<(usize, usize)> = Vec::new();
    while r.more() {
        let key_at = r.pos;
        let (f, w) = r.key()?;
        match f {
            1 => {
                let (s, e) = nested(&mut r, f, w, limit)?;
                range.resource_fields += 1;
                range.resource = Some((key_at, s, e));
                // Resource (merged over repeated occurrences: attributes append).
                let mut res = r.sub((s, e));
                let rl = limit - 1;
                while res.more() {
                    let (f2, w2) = res.key()?;
                    match f2 {
                        1 => push_key_value(&mut res, f2, w2, rl, &mut resource_attrs)?,
                        2 => {
                            expect(f2, w2, VARINT)?;
                            res.varint()?;
                        }
                        3 => {
                            let er = nested(&mut res, f2, w2, rl)?;
                            strings_message(res.sub(er), rl - 1)?;
                        }
                        _ => res.skip(f2, w2, rl)?,
                    }
                }
            }
            2 => scope_spans.push(nested(&mut r, f, w, limit)?),
            3 => {
                expect(f, w, LEN)?;
                r.string()?;
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    if range.resource_fields != 1 {
        range.resource = None;
    }
    range.looped = super::resource_is_looped(&resource_attrs, me);
    let emitted = super::resource_is_emitted(&resource_attrs);
    let service = super::resource_service(&resource_attrs);
    let judge = !range.looped && !emitted;
    if !range.looped {
        facts.via_present |= resource_attrs.iter().any(|kv| kv.key == crate::flow::loops::VIA);
        facts.raw_definitions |= has_raw_definitions(&resource_attrs);
    }
    for ss in scope_spans {
        range.spans += scope_spans_message(r.sub(ss), limit - 1, judge, range.looped, service.as_ref(), out, facts, scratch)?;
    }
    facts.spans += range.spans;
    if range.looped {
        facts.looped_spans += range.spans;
    }
    Ok(range)
}

fn has_raw_definitions(attrs: &[KeyValue<'_>]) -> bool {
    attrs.iter().any(|kv| kv.key == crate::evidence::attributes::CATALOG_TOOLS)
}

/// One `ScopeSpans`: its scope first (wherever it sits), then its spans. Returns its span count.
#[allow(clippy::too_many_arguments)]
fn scope_spans_message<'a>(
    mut r: Reader<'a>,
    limit: u32,
    judge: bool,
    looped: bool,
    service: Option<&std::sync::Arc<str>>,
    out: &mut NormalizedBatch,
    facts: &mut WireFacts,
    scratch: &mut Scratch,
) -> R<u64> {
    let mut spans = std::mem::take(&mut scratch.ranges);
    let mut scopes = std::mem::take(&mut scratch.scopes);
    spans.clear();
    scopes.clear();
    while r.more() {
        let (f, w) = r.key()?;
        match f {
            1 => scopes.push(nested(&mut r, f, w, limit)?),
            2 => spans.push(nested(&mut r, f, w, limit)?),
            3 => {
                expect(f, w, LEN)?;
                r.string()?;
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    // The scope (occurrences merge: the last name wins).
    let mut scope_name: Option<&'a str> = None;
    let mut scope_attrs: Vec<KeyValue<'a>> = Vec::new();
    let sl = limit - 1;
    for &range in &scopes {
        let mut s = r.sub(range);
        while s.more() {
            let (f, w) = s.key()?;
            match f {
                1 => {
                    expect(f, w, LEN)?;
                    scope_name = Some(s.string()?);
                }
                2 => {
                    expect(f, w, LEN)?;
                    s.string()?;
                }
                3 => push_key_value(&mut s, f, w, sl, &mut scope_attrs)?,
                4 => {
                    expect(f, w, VARINT)?;
                    s.varint()?;
                }
                _ => s.skip(f, w, sl)?,
            }
        }
    }
    if !looped {
        facts.raw_definitions |= has_raw_definitions(&scope_attrs);
    }
    let by_scope = if scopes.is_empty() { None } else { super::dialect_of_scope(scope_name.unwrap_or("")) };
    let tap = scope_name == Some(super::TAP_SCOPE);
    let mut view = SpanView::default();
    let count = spans.len() as u64;
    for &range in &spans {
        let (raw, kept) = span_message(r.sub(range), sl, by_scope.is_some(), &mut view, &mut scratch.held)?;
        if !looped {
            facts.raw_definitions |= raw;
        }
        if judge {
            out.spans += 1;
            if kept {
                super::read_view(&view, by_scope, tap, service, scratch.settings, out);
            } else {
                super::read_activity(&view, out);
            }
        }
    }
    scratch.ranges = spans;
    scratch.scopes = scopes;
    Ok(count)
}

/// One span into `view` (its buffers reused). Returns whether it carries raw tool definitions
/// (on the span, an event or a link), and whether its attributes were kept (when not, no
/// dialect reads anything in it).
///
/// Every attribute is read (and checked as prost checks it), but kept in `view` only when
/// `keep` (a dialect owns the span's scope) or when something may read it: a key a dialect asks
/// about ([`super::KeyInterest`]), an event, a name a dialect claims. Until then each one's
/// place is `held`, and read again if the span turns out to want them. Nearly every span of a
/// shared pipeline never does, and keeping its attributes only to look through them and drop
/// them was a quarter of the walk.
fn span_message<'a>(mut r: Reader<'a>, limit: u32, keep: bool, view: &mut SpanView<'a>, held: &mut Vec<(usize, usize)>) -> R<(bool, bool)> {
    let mut attributes = std::mem::take(&mut view.attributes);
    let mut events = std::mem::take(&mut view.events);
    attributes.clear();
    events.clear();
    held.clear();
    let mut kept = keep;
    let mut interest = super::KeyInterest::default();
    *view = SpanView::default();
    let mut raw = false;
    let mut link_attrs: Vec<KeyValue<'a>> = Vec::new();
    let cl = limit - 1;
    while r.more() {
        let (f, w) = r.key()?;
        match f {
            1 => {
                expect(f, w, LEN)?;
                view.trace_id = r.bytes()?;
            }
            2 => {
                expect(f, w, LEN)?;
                view.span_id = r.bytes()?;
            }
            3 => {
                expect(f, w, LEN)?;
                r.string()?;
            }
            4 => {
                expect(f, w, LEN)?;
                view.parent_span_id = r.bytes()?;
            }
            5 => {
                expect(f, w, LEN)?;
                view.name = r.string()?;
            }
            6 => {
                expect(f, w, VARINT)?;
                view.kind = r.varint()? as i32;
            }
            7 => {
                expect(f, w, I64)?;
                view.start_time_unix_nano = r.fixed64()?;
            }
            8 => {
                expect(f, w, I64)?;
                view.end_time_unix_nano = r.fixed64()?;
            }
            9 if kept => push_key_value(&mut r, f, w, limit, &mut attributes)?,
            9 => {
                let range = nested(&mut r, f, w, limit)?;
                // Dropped by hand, and only what owns memory (an array, a list): a drop call per
                // attribute was a tenth of this loop.
                let kv = std::mem::ManuallyDrop::new(read_key_value(r.buf, range, limit)?);
                held.push(range);
                let wanted = interest.see(&kv);
                if matches!(kv.value, Some(AnyValue { value: Some(Value::ArrayValue(_) | Value::KvlistValue(_)) })) {
                    drop(std::mem::ManuallyDrop::into_inner(kv));
                }
                if wanted {
                    kept = true;
                    keep_held(r.buf, held, limit, &mut attributes)?;
                }
            }
            10 | 12 | 14 => {
                expect(f, w, VARINT)?;
                r.varint()?;
            }
            11 => {
                let range = nested(&mut r, f, w, limit)?;
                let mut e = r.sub(range);
                let mut ev = Event::default();
                while e.more() {
                    let (f2, w2) = e.key()?;
                    match f2 {
                        1 => {
                            expect(f2, w2, I64)?;
                            ev.time_unix_nano = e.fixed64()?;
                        }
                        2 => {
                            expect(f2, w2, LEN)?;
                            ev.name = e.string()?;
                        }
                        3 => push_key_value(&mut e, f2, w2, cl, &mut ev.attributes)?,
                        4 => {
                            expect(f2, w2, VARINT)?;
                            e.varint()?;
                        }
                        _ => e.skip(f2, w2, cl)?,
                    }
                }
                raw |= has_raw_definitions(&ev.attributes);
                events.push(ev);
            }
            13 => {
                let range = nested(&mut r, f, w, limit)?;
                let mut l = r.sub(range);
                link_attrs.clear();
                while l.more() {
                    let (f2, w2) = l.key()?;
                    match f2 {
                        1 | 2 => {
                            expect(f2, w2, LEN)?;
                            l.bytes()?;
                        }
                        3 => {
                            expect(f2, w2, LEN)?;
                            l.string()?;
                        }
                        4 => push_key_value(&mut l, f2, w2, cl, &mut link_attrs)?,
                        5 => {
                            expect(f2, w2, VARINT)?;
                            l.varint()?;
                        }
                        6 => {
                            expect(f2, w2, I32)?;
                            l.fixed32()?;
                        }
                        _ => l.skip(f2, w2, cl)?,
                    }
                }
                raw |= has_raw_definitions(&link_attrs);
            }
            15 => {
                let range = nested(&mut r, f, w, limit)?;
                let mut s = r.sub(range);
                let st = view.status.get_or_insert(Status::default());
                while s.more() {
                    let (f2, w2) = s.key()?;
                    match f2 {
                        2 => {
                            expect(f2, w2, LEN)?;
                            st.message = s.string()?;
                        }
                        3 => {
                            expect(f2, w2, VARINT)?;
                            st.code = s.varint()? as i32;
                        }
                        _ => s.skip(f2, w2, cl)?,
                    }
                }
            }
            16 => {
                expect(f, w, I32)?;
                r.fixed32()?;
            }
            _ => r.skip(f, w, limit)?,
        }
    }
    if !kept && (!events.is_empty() || super::claimed_by_name(view)) {
        kept = true;
        keep_held(r.buf, held, limit, &mut attributes)?;
    }
    raw |= has_raw_definitions(&attributes);
    view.attributes = attributes;
    view.events = events;
    Ok((raw, kept))
}

/// The attributes `held` so far, read again and kept.
fn keep_held<'a>(buf: &'a [u8], held: &mut Vec<(usize, usize)>, limit: u32, out: &mut Vec<KeyValue<'a>>) -> R<()> {
    for &range in held.iter() {
        push_key_value_at(buf, range, limit, out)?;
    }
    held.clear();
    Ok(())
}

/// The request with this process's id appended to each kept resource's `mcp_health.via`, and
/// looped resources left out: a copy of the bytes with one attribute spliced into each resource,
/// no decode and no re-encode. `None` when a resource cannot be spliced (it already has a
/// `via`, or more than one `resource` field): then the request is rebuilt from its decode.
pub fn splice_via(buf: &[u8], facts: &WireFacts, me: &str) -> Option<Vec<u8>> {
    let pieces = via_pieces(buf.len(), facts, me)?;
    let mut out = Vec::with_capacity(pieces.iter().map(Piece::len).sum());
    for p in &pieces {
        match p {
            Piece::Kept(s, e) => out.extend_from_slice(&buf[*s..*e]),
            Piece::Made(m) => out.extend_from_slice(m),
        }
    }
    Some(out)
}

/// [`splice_via`] in the request's own buffer: its bytes moved up in place and the new bytes
/// written between them, so that the request passed on is the buffer it was read into — held
/// once, never copied (issue 11: a held request costs its wire size). `false`, and `buf`
/// untouched, when it cannot be done in place: not spliceable (see [`splice_via`]), a looped
/// resource left out (bytes would move down as well as up), or too little spare capacity
/// (the receiver allocates [`VIA_HEADROOM`] beyond each message for it).
pub fn splice_via_in_place(buf: &mut bytes::BytesMut, facts: &WireFacts, me: &str) -> bool {
    let Some(pieces) = via_pieces(buf.len(), facts, me) else { return false };
    let total: usize = pieces.iter().map(Piece::len).sum();
    if total < buf.len() || total - buf.len() > buf.capacity() - buf.len() {
        return false;
    }
    // Where each piece goes; every kept range must move up, and no less than the one before it,
    // so that moving them from the last to the first never overwrites bytes still to be moved.
    let mut at = Vec::with_capacity(pieces.len());
    let (mut o, mut shift, mut end) = (0usize, 0usize, 0usize);
    for p in &pieces {
        if let Piece::Kept(s, e) = p {
            if *s < end || o < *s || o - *s < shift {
                return false;
            }
            shift = o - *s;
            end = *e;
        }
        at.push(o);
        o += p.len();
    }
    let len = buf.len();
    buf.resize(total, 0);
    for (p, &o) in pieces.iter().zip(&at).rev() {
        match p {
            Piece::Kept(s, e) => buf.copy_within(*s..*e, o),
            Piece::Made(m) => buf[o..o + m.len()].copy_from_slice(m),
        }
    }
    debug_assert!(buf.len() >= len);
    true
}

/// Spare bytes the receivers allocate after a message, so that [`splice_via_in_place`] finds
/// room for `mcp_health.via` in every resource (some 60 bytes each: about 60 resources).
pub const VIA_HEADROOM: usize = 4096;

/// One piece of the request passed on: a range of the request received, or bytes made here.
enum Piece {
    Kept(usize, usize),
    Made(Vec<u8>),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Kept(s, e) => e - s,
            Piece::Made(m) => m.len(),
        }
    }
}

/// The pieces of [`splice_via`]'s output, in order, for a request of `len` bytes.
fn via_pieces(len: usize, facts: &WireFacts, me: &str) -> Option<Vec<Piece>> {
    use prost::Message;
    if facts.via_present || facts.resources.iter().any(|r| !r.looped && r.resource_fields > 1) {
        return None;
    }
    // `Resource { attributes: [via] }` encodes as exactly the attribute's field: appended to a
    // resource's content, it is one more attribute.
    let attr = opentelemetry_proto::tonic::resource::v1::Resource {
        attributes: vec![crate::flow::loops::via_attribute(me)],
        ..Default::default()
    }
    .encode_to_vec();
    let mut out = Vec::with_capacity(facts.resources.len() * 6 + 1);
    fn kept(out: &mut Vec<Piece>, s: usize, e: usize) {
        if e > s {
            out.push(Piece::Kept(s, e));
        }
    }
    let mut copied = 0;
    for rs in &facts.resources {
        kept(&mut out, copied, rs.tag_start);
        copied = rs.end;
        if rs.looped {
            continue;
        }
        let mut head = Vec::with_capacity(24);
        match rs.resource {
            Some((key_at, s, e)) => {
                let resource_len = e - s + attr.len();
                let inner = (rs.end - rs.start) - (e - key_at) + 1 + varint_len(resource_len as u64) + resource_len;
                head.push(0x0a);
                put_varint(&mut head, inner as u64);
                out.push(Piece::Made(head));
                kept(&mut out, rs.start, key_at);
                let mut key = vec![0x0a];
                put_varint(&mut key, resource_len as u64);
                out.push(Piece::Made(key));
                kept(&mut out, s, e);
                out.push(Piece::Made(attr.clone()));
                kept(&mut out, e, rs.end);
            }
            None => {
                // No resource: one is added (field order does not matter in protobuf).
                let inner = (rs.end - rs.start) + 1 + varint_len(attr.len() as u64) + attr.len();
                head.push(0x0a);
                put_varint(&mut head, inner as u64);
                head.push(0x0a);
                put_varint(&mut head, attr.len() as u64);
                head.extend_from_slice(&attr);
                out.push(Piece::Made(head));
                kept(&mut out, rs.start, rs.end);
            }
        }
    }
    kept(&mut out, copied, len);
    Some(out)
}

/// Split a request at `ResourceSpans` boundaries into pieces of at most `max` bytes each (a
/// `ResourceSpans` larger than `max` alone is one piece). Other top-level fields go with the first.
pub fn split_resource_spans(buf: &[u8], max: usize) -> Option<Vec<(usize, usize)>> {
    let mut r = Reader::whole(buf);
    let mut pieces = Vec::new();
    let mut start = 0;
    while r.more() {
        let at = r.pos;
        let (f, w) = r.key().ok()?;
        if f == 1 && w == LEN {
            r.len_range().ok()?;
        } else {
            r.skip(f, w, RECURSION_LIMIT).ok()?;
        }
        if r.pos - start > max && at > start {
            pieces.push((start, at));
            start = at;
        }
    }
    pieces.push((start, buf.len()));
    Some(pieces)
}

/// How many spans a (valid) request holds, counted without reading them (nor allocating: the
/// walk asks it of every request it reads, to size the batch once).
pub fn span_count(buf: &[u8]) -> Option<u64> {
    /// Call `each` with the content range of every `field` (length-delimited) of a message.
    fn fields(mut r: Reader<'_>, field: u32, each: &mut dyn FnMut((usize, usize)) -> Option<()>) -> Option<()> {
        while r.more() {
            let (f, w) = r.key().ok()?;
            if f == field && w == LEN {
                each(r.len_range().ok()?)?;
            } else {
                r.skip(f, w, RECURSION_LIMIT).ok()?;
            }
        }
        Some(())
    }
    let whole = Reader::whole(buf);
    let mut n = 0u64;
    fields(whole, 1, &mut |rs| {
        fields(whole.sub(rs), 2, &mut |ss| {
            fields(whole.sub(ss), 2, &mut |_| {
                n += 1;
                Some(())
            })
        })
    })?;
    Some(n)
}

/// A request's spans and, of those, the spans of resources that came back through an export
/// loop, read without reading a span: what a refusal counts (issue 11: a request refused because
/// a queue is full costs a skim, not the walk). The structure down to the spans is checked as
/// [`walk`] checks it; inside a span nothing is, so a request refused busy may be one the walk
/// would have called undecodable: its sender retries and is then told so.
pub fn skim(buf: &[u8], me: &str) -> Result<(u64, u64), WireError> {
    let limit = RECURSION_LIMIT;
    let mut r = Reader::whole(buf);
    let (mut spans, mut looped) = (0u64, 0u64);
    let mut attrs: Vec<KeyValue<'_>> = Vec::new();
    while r.more() {
        let (f, w) = r.key()?;
        if f != 1 {
            r.skip(f, w, limit)?;
            continue;
        }
        let range = nested(&mut r, f, w, limit)?;
        let mut rs = r.sub(range);
        let rl = limit - 1;
        attrs.clear();
        let mut n = 0u64;
        while rs.more() {
            let (f, w) = rs.key()?;
            match f {
                1 => {
                    let res_range = nested(&mut rs, f, w, rl)?;
                    let mut res = rs.sub(res_range);
                    while res.more() {
                        let (f2, w2) = res.key()?;
                        if f2 == 1 {
                            push_key_value(&mut res, f2, w2, rl - 1, &mut attrs)?;
                        } else {
                            res.skip(f2, w2, rl - 1)?;
                        }
                    }
                }
                2 => {
                    let ss_range = nested(&mut rs, f, w, rl)?;
                    let mut ss = rs.sub(ss_range);
                    while ss.more() {
                        let (f2, w2) = ss.key()?;
                        if f2 == 2 {
                            nested(&mut ss, f2, w2, rl - 1)?;
                            n += 1;
                        } else {
                            ss.skip(f2, w2, rl - 1)?;
                        }
                    }
                }
                _ => rs.skip(f, w, rl)?,
            }
        }
        spans += n;
        if super::resource_is_looped(&attrs, me) {
            looped += n;
        }
    }
    Ok((spans, looped))
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    fn request() -> ExportTraceServiceRequest {
        crate::loadgen::build_request(1, 3)
    }

    /// One `KeyValue` message's bytes read as the walk reads a span attribute, and as prost
    /// decodes it: the same answer (both refuse, or both read the same attribute).
    fn attribute_agrees(kv: &[u8]) {
        use opentelemetry_proto::tonic::common::v1 as pc;
        let mut field = vec![0x4a];
        put_varint(&mut field, kv.len() as u64);
        field.extend_from_slice(kv);
        let mut r = Reader::whole(&field);
        let (f, w) = r.key().unwrap();
        let mut walked = Vec::new();
        let walk = push_key_value(&mut r, f, w, RECURSION_LIMIT, &mut walked);
        match pc::KeyValue::decode(kv) {
            Ok(decoded) => {
                assert!(walk.is_ok(), "{kv:x?}: prost decodes it, the walk refuses it ({walk:?})");
                assert_eq!(walked, crate::normalize::view::attributes_from_proto(std::slice::from_ref(&decoded)), "{kv:x?}");
            }
            Err(e) => assert!(walk.is_err(), "{kv:x?}: prost refuses it ({e}), the walk reads {walked:?}"),
        }
    }

    /// Issue 11: the evidence is sized once for the whole request (no growth scope by scope),
    /// and never past what the request's size can carry: a request of empty span tags (two bytes
    /// each) reserved 208 bytes of evidence for every one of them, a hundred times its size.
    #[test]
    fn the_evidence_is_sized_once_and_bounded_by_the_request() {
        let batch = crate::loadgen::encode(&crate::loadgen::build_request(1, 171));
        let (b, _) = walk(&batch.bytes, "0000000000000000").unwrap();
        assert_eq!(b.evidence.len(), 513);
        assert_eq!(b.evidence.capacity(), 513, "one allocation of the right size, in two resources");

        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        let empty = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans { spans: vec![Span::default(); 20_000], ..Default::default() }],
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let (b, facts) = walk(&empty, "0000000000000000").unwrap();
        assert_eq!((facts.spans, b.rejected_spans, b.evidence.len()), (20_000, 20_000, 0));
        assert!(b.evidence.capacity() <= empty.len() / MIN_EVIDENCE_SPAN_BYTES, "{} for {} bytes", b.evidence.capacity(), empty.len());
    }

    #[test]
    fn the_ascii_check_finds_a_high_byte_at_every_place_in_every_length() {
        for n in 0..40 {
            let mut b = vec![b'a'; n];
            assert!(ascii(&b), "{n}");
            for at in 0..n {
                b[at] = 0x80;
                assert!(!ascii(&b), "{n} {at}");
                b[at] = b'a';
            }
        }
    }

    #[test]
    fn plain_attributes_read_as_prost_decodes_them() {
        let long = [b'k'; 130];
        let mut long_key = vec![0x0a, 0x82, 0x01];
        long_key.extend_from_slice(&long);
        long_key.extend_from_slice(&[0x12, 0x03, 0x0a, 0x01, b'v']);
        let cases: Vec<Vec<u8>> = vec![
            b"\x0a\x01k\x12\x03\x0a\x01v".to_vec(),                                    // plain string
            b"\x0a\x01k\x12\x02\x18\x05".to_vec(),                                     // plain integer
            b"\x0a\x01k\x12\x03\x18\xac\x02".to_vec(),                                 // integer of two bytes
            b"\x0a\x01k\x12\x0b\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".to_vec(), // -1
            b"\x0a\x01k\x12\x0b\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02".to_vec(), // 10th byte > 1
            b"\x0a\x01k\x12\x02\x18\x80".to_vec(),                                     // truncated varint
            b"\x0a\x01k\x12\x00".to_vec(),                                             // empty value
            b"\x0a\x01k".to_vec(),                                                     // no value
            b"\x0a\x01k\x12\x03\x0a\x01\xff".to_vec(),                                 // value not UTF-8
            b"\x0a\x01\xff\x12\x03\x0a\x01v".to_vec(),                                 // key not UTF-8
            "\x0a\x01k\x12\x04\x0a\x02\u{e9}".as_bytes().to_vec(),                     // value UTF-8, not ASCII
            b"\x0a\x01k\x12\x05\x0a\x01v\x18\x01".to_vec(),                            // two value fields: the last wins
            b"\x0a\x01k\x12\x03\x0a\x02v".to_vec(),                                    // string longer than its value
            b"\x0a\x01k\x12\x04\x0a\x01v".to_vec(),                                    // value longer than the attribute
            b"\x0a\x01k\x12\x03\x0a\x01v\x0a\x01j".to_vec(),                           // a second key: the last wins
            b"\x0a\x01k\x12\x03\x0a\x01v\x12\x02\x18\x07".to_vec(),                    // a second value merges
            b"\x0a\x01k\x12\x03\x10\x01\x00".to_vec(),                                 // bool, then a bad key
            b"\x0a\x01k\x12\x02\x1a\x00".to_vec(),                                     // integer field with the wrong wire type
            b"\x0b\x01k\x12\x03\x0a\x01v".to_vec(),                                    // key with the wrong wire type
            long_key,
        ];
        for kv in &cases {
            attribute_agrees(kv);
        }
    }

    proptest::proptest! {
        /// Attributes near the plain form: keys and strings of any bytes, values of either
        /// kind, every length byte possibly off by one, bytes trailing.
        #[test]
        fn attributes_near_the_plain_form_read_as_prost_decodes_them(
            key in proptest::collection::vec(proptest::prop_oneof![proptest::prelude::Just(b'k'), proptest::prelude::any::<u8>()], 0..4),
            string in proptest::collection::vec(proptest::prop_oneof![proptest::prelude::Just(b'v'), proptest::prelude::any::<u8>()], 0..4),
            varint in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..11),
            tag in proptest::prop_oneof![proptest::prelude::Just(0x0au8), proptest::prelude::Just(0x18), proptest::prelude::any::<u8>()],
            off in proptest::collection::vec(-1i32..=1, 3),
            trailing in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3),
        ) {
            let len = |n: usize, d: i32| (n as i32 + d).clamp(0, 127) as u8;
            let mut value = vec![tag];
            if tag == 0x18 {
                value.extend_from_slice(&varint);
            } else {
                value.push(len(string.len(), off[0]));
                value.extend_from_slice(&string);
            }
            let mut kv = vec![0x0a, len(key.len(), off[1])];
            kv.extend_from_slice(&key);
            kv.extend_from_slice(&[0x12, len(value.len(), off[2])]);
            kv.extend_from_slice(&value);
            kv.extend_from_slice(&trailing);
            attribute_agrees(&kv);
        }
    }

    #[test]
    fn the_skim_counts_what_the_walk_counts() {
        // The skim's counts of a request, held to the walk's; its bytes.
        let skimmed = |req: &ExportTraceServiceRequest| {
            let bytes = req.encode_to_vec();
            let (_, facts) = walk(&bytes, "me").expect("walk");
            assert_eq!(skim(&bytes, "me"), Ok((facts.spans, facts.looped_spans)));
            (facts, bytes)
        };
        let req = crate::loadgen::build_request(3, 7);
        assert_eq!(skimmed(&req).0.spans, 21);
        // A resource that came back through this process's own loop counts as looped.
        let mut looped = req.clone();
        for r in &mut looped.resource_spans {
            crate::flow::loops::mark_via(&mut r.resource, "me");
        }
        let (facts, bytes) = skimmed(&looped);
        assert_eq!(facts.looped_spans, 21);
        assert_eq!(skim(&bytes[..bytes.len() - 1], "me"), Err(WireError::Truncated));
    }

    #[test]
    fn varints_follow_prost() {
        let ok = |b: &[u8]| Reader::whole(b).varint();
        assert_eq!(ok(&[0x01]), Ok(1));
        assert_eq!(ok(&[0xff, 0x01]), Ok(255));
        assert_eq!(ok(&[0xff; 9].iter().copied().chain([0x01]).collect::<Vec<_>>()), Ok(u64::MAX));
        assert_eq!(ok(&[0xff; 9].iter().copied().chain([0x02]).collect::<Vec<_>>()), Err(WireError::Varint));
        assert_eq!(ok(&[0x80]), Err(WireError::Varint));
        assert_eq!(ok(&[]), Err(WireError::Varint));
    }

    #[test]
    fn the_walk_reads_what_the_decode_reads() {
        let req = request();
        let bytes = req.encode_to_vec();
        let (batch, facts) = walk(&bytes, "0000000000000000").unwrap();
        let typed = crate::normalize::normalize_request(&req);
        assert_eq!(format!("{:?}", batch.evidence), format!("{:?}", typed.evidence));
        assert_eq!(batch.activity, typed.activity);
        assert_eq!(batch.spans, typed.spans);
        assert_eq!(facts.spans, typed.spans);
        assert_eq!(facts.resources.len(), req.resource_spans.len());
        assert!(!facts.raw_definitions && !facts.via_present);
    }

    /// Issue 11: spliced in place, the request passed on is the buffer it was read into, byte for
    /// byte what the copying splice gives, for every shape: resources with and without a
    /// resource field, many resources, a resource field after the scopes, large varints. A looped
    /// resource (bytes would move down) or too little room leaves the buffer untouched.
    #[test]
    fn splicing_in_place_is_splicing_a_copy() {
        use opentelemetry_proto::tonic::resource::v1::Resource;
        let me = "0123456789abcdef";
        let in_place = |bytes: &[u8], room: usize| {
            let (_, facts) = walk(bytes, "other-instance-00").unwrap();
            let mut m = bytes::BytesMut::with_capacity(bytes.len() + room);
            m.extend_from_slice(bytes);
            let at = m.as_ptr();
            let done = splice_via_in_place(&mut m, &facts, me);
            (done, m.as_ptr() == at, m.to_vec(), splice_via(bytes, &facts, me))
        };
        let mut shapes = vec![request()];
        let mut no_resource = request();
        no_resource.resource_spans.push(Default::default());
        no_resource.resource_spans.insert(0, Default::default());
        shapes.push(no_resource);
        let mut many = request();
        for n in 0..40 {
            let mut rs = request().resource_spans[(n % 2) as usize].clone();
            rs.resource = Some(Resource { dropped_attributes_count: n, ..rs.resource.unwrap_or_default() });
            many.resource_spans.push(rs);
        }
        shapes.push(many);
        shapes.push(crate::loadgen::build_request(2, 400)); // resources over 16 KiB: 3-byte varints
        for req in &shapes {
            let bytes = req.encode_to_vec();
            let (done, same_buffer, got, copy) = in_place(&bytes, VIA_HEADROOM);
            assert!(done && same_buffer, "spliced in place, in the buffer it was read into");
            assert_eq!(Some(got.clone()), copy, "what the copying splice gives");
            let mut want = req.clone();
            for rs in &mut want.resource_spans {
                crate::flow::loops::mark_via(&mut rs.resource, me);
            }
            assert_eq!(ExportTraceServiceRequest::decode(got.as_slice()).unwrap(), want);
        }
        // The resource field after the scopes (field order is free in protobuf).
        let req = request();
        let mut bytes = Vec::new();
        for rs in &req.resource_spans {
            let mut inner = Vec::new();
            for ss in &rs.scope_spans {
                prost::encoding::message::encode(2, ss, &mut inner);
            }
            prost::encoding::message::encode(1, rs.resource.as_ref().unwrap(), &mut inner);
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut bytes);
            prost::encoding::encode_varint(inner.len() as u64, &mut bytes);
            bytes.extend_from_slice(&inner);
        }
        let (done, _, got, copy) = in_place(&bytes, VIA_HEADROOM);
        assert!(done);
        assert_eq!(Some(got), copy);
        // Too little room, or a looped resource left out: not in place, buffer untouched.
        let bytes = request().encode_to_vec();
        let (done, _, got, _) = in_place(&bytes, 10);
        assert!(!done && got == bytes);
        let mut looped = request();
        crate::flow::loops::mark_via(&mut looped.resource_spans[0].resource, "other-instance-00");
        let bytes = looped.encode_to_vec();
        let (_, facts) = walk(&bytes, "other-instance-00").unwrap();
        assert!(facts.resources[0].looped);
        let mut m = bytes::BytesMut::with_capacity(bytes.len() + VIA_HEADROOM);
        m.extend_from_slice(&bytes);
        assert!(!splice_via_in_place(&mut m, &facts, me));
        assert_eq!(&m[..], &bytes[..]);
    }

    #[test]
    fn splicing_via_is_what_marking_the_decoded_request_gives() {
        let mut req = request();
        req.resource_spans.push(Default::default()); // a ResourceSpans without a resource
        let bytes = req.encode_to_vec();
        let (_, facts) = walk(&bytes, "me").unwrap();
        let spliced = splice_via(&bytes, &facts, "0123456789abcdef").unwrap();
        let got = ExportTraceServiceRequest::decode(spliced.as_slice()).unwrap();
        let mut want = req.clone();
        for rs in &mut want.resource_spans {
            crate::flow::loops::mark_via(&mut rs.resource, "0123456789abcdef");
        }
        assert_eq!(got, want);
        // Once marked, this id sees it as a loop; an earlier `via` makes the walk refuse to splice.
        let (_, again) = walk(&spliced, "0123456789abcdef").unwrap();
        assert!(again.resources.iter().all(|r| r.looped) && again.looped_spans == again.spans);
        let (_, other) = walk(&spliced, "fedcba9876543210").unwrap();
        assert!(other.via_present && splice_via(&spliced, &other, "fedcba9876543210").is_none());
    }

    #[test]
    fn splitting_keeps_whole_resource_spans() {
        let mut req = request();
        for _ in 0..3 {
            req.resource_spans.extend(request().resource_spans);
        }
        let bytes = req.encode_to_vec();
        let max = bytes.len() / 3;
        let pieces = split_resource_spans(&bytes, max).unwrap();
        assert!(pieces.len() >= 3);
        let mut all = Vec::new();
        for (s, e) in pieces {
            let part = ExportTraceServiceRequest::decode(&bytes[s..e]).unwrap();
            all.extend(part.resource_spans);
        }
        assert_eq!(all, req.resource_spans);
    }
}
