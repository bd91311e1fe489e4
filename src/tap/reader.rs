//! Reading JSON-RPC messages within a fixed budget (issue 35).
//!
//! The observer needs a handful of fields of each message (`id`, `method`, `isError`, a task's
//! status, the values a verifier rule names…), never the whole of it. A `serde_json::Value` tree
//! of a message costs about 40 times its bytes when the message is made of small values (a 14 MB
//! array of zeros is some 550 MB of `Value`s), so the byte limits of lines and bodies did not bound
//! what a message could cost by its shape. The tap therefore never builds the tree of a message:
//!
//! - [`Document::parse`] checks once, in one pass and a fixed amount of memory, that the bytes are
//!   one JSON value (UTF-8, the JSON grammar). The kinds of the open containers are the bits of a
//!   `u128`, so nesting is followed [`MAX_DEPTH`] levels deep; a container deeper than that is
//!   skipped by counting its brackets (its strings still read as strings), without checking what it
//!   holds. The document is then not [`whole`](Document::whole): what it has down there is never
//!   read, and the caller must not take a message it could not read whole as a success.
//! - A [`Node`] is one value of the document as the bytes it was sent as: reading a field walks
//!   the bytes of its object; nothing is copied except a string that has escapes.
//! - [`Node::to_value`] builds the `Value` of one small part (what a verifier rule reads) against
//!   a [`Budget`] that counts what the tree will cost, and stops — keeping nothing — at the first
//!   allocation past it.
//!
//! Recursion is bounded by [`MAX_DEPTH`] (only [`Node::to_value`] and [`Node::is_whole`] descend,
//! and neither goes into a container deeper than that), so no input can exhaust the stack.

use std::borrow::Cow;

use serde_json::Value;

/// Levels of nesting read: a container at this depth (the root is at depth 0) or deeper is
/// skipped unread. serde_json's own limit (it refuses a 128th level), so the tap reads whatever it
/// read before, and what a `Value`-based reader (the tool digests) would refuse is never handed
/// to one.
pub(crate) const MAX_DEPTH: usize = 127;

/// Longest key compared when it has escapes (decoded to compare): no key the tap looks for is
/// longer, so a longer escaped key is never decoded.
const MAX_ESCAPED_KEY: usize = 256;

/// What [`byte!`] reads past the end: a byte no JSON text has raw (NUL is a control character,
/// refused in strings and outside them), so the end needs no case of its own.
const END: u8 = 0;

/// `b[i]`, or [`END`] past the end: built-in indexing, no call. The reader's loops run once per
/// byte, and the tap's tests run unoptimized builds, where `get` and its `Option` are calls.
macro_rules! byte {
    ($b:expr, $i:expr) => {
        if $i < $b.len() {
            $b[$i]
        } else {
            END
        }
    };
}

/// Why (part of) a message was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unread {
    /// Not one JSON value: a syntax error, truncated, not UTF-8, or a string escape that is no
    /// Unicode (a lone surrogate).
    #[error("not JSON")]
    Syntax,
    /// Nested deeper than [`MAX_DEPTH`]: skipped, never read.
    #[error("nested deeper than {MAX_DEPTH} levels")]
    Depth,
    /// Past the [`Budget`] of what the tap keeps of a message.
    #[error("past its budget")]
    Budget,
}

/// What the `Value`s built from one message may cost, in bytes (an estimate of the heap a tree
/// takes: each node, each object entry, the bytes of strings and keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    left: usize,
}

/// What one node of a `Value` tree costs besides its strings.
const NODE_COST: usize = std::mem::size_of::<Value>();
/// What one object entry costs besides its key's bytes and its value (the key `String` and the
/// map's share of a B-tree node).
const ENTRY_COST: usize = std::mem::size_of::<String>() + 32;

impl Budget {
    pub(crate) fn new(bytes: usize) -> Self {
        Budget { left: bytes }
    }

    /// What is left.
    #[cfg(test)]
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    fn spend(&mut self, n: usize) -> Result<(), Unread> {
        self.left = self.left.checked_sub(n).ok_or(Unread::Budget)?;
        Ok(())
    }
}

/// One JSON text, checked (see the module documentation).
#[derive(Debug)]
pub(crate) struct Document<'a> {
    bytes: &'a [u8],
    /// Where the value is in `bytes` (without the blanks around it).
    root: (usize, usize),
    whole: bool,
    index: Index,
}

/// Shortest container whose end [`Document::parse`] remembers, so that reading past it later
/// does not scan it again (the fields around a 14 MB array are read in a few lookups, not a few
/// passes).
const INDEXED_CONTAINER: usize = 64 << 10;
/// Most containers remembered (past it, the others are scanned when skipped): a fixed budget.
const MAX_INDEXED: usize = 4096;

/// The ends of the large containers of a document: `(start, end)` offsets, by start.
#[derive(Debug, Default)]
struct Index {
    /// The address of the document's first byte (offsets are from it).
    base: usize,
    ends: Vec<(usize, usize)>,
}

impl Index {
    fn note(&mut self, start: usize, end: usize) {
        if end - start >= INDEXED_CONTAINER && self.ends.len() < MAX_INDEXED {
            self.ends.push((start, end));
        }
    }

    /// The end of the container at `b[i]`, if remembered (`b` is part of the document).
    fn end_of(&self, b: &[u8], i: usize) -> Option<usize> {
        let off = (b.as_ptr() as usize).checked_sub(self.base)?;
        let at = self.ends.binary_search_by_key(&(off + i), |(s, _)| *s).ok()?;
        self.ends[at].1.checked_sub(off).filter(|end| *end <= b.len())
    }
}

/// The index of bytes that have none (a key read as a string).
static NO_INDEX: Index = Index { base: 0, ends: Vec::new() };

impl<'a> Document<'a> {
    /// Check `bytes` as one JSON value (whitespace around it allowed). Fixed memory whatever the
    /// input; the only error is [`Unread::Syntax`] (nesting past [`MAX_DEPTH`] is skipped, and
    /// the document is then not [`whole`](Self::whole)).
    // `matches!` on digits, not `is_ascii_digit`: that is a call per byte in unoptimized builds.
    #[allow(clippy::manual_is_ascii_check)]
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, Unread> {
        std::str::from_utf8(bytes).map_err(|_| Unread::Syntax)?;
        let b = bytes;
        let mut index = Index { base: b.as_ptr() as usize, ends: Vec::new() };
        let start = ws(b, 0);
        let mut i = start;
        // Bit d: the open container at depth d is an object; `opened[d]`: where it starts.
        let mut kinds: u128 = 0;
        let mut opened = [0usize; MAX_DEPTH];
        let mut depth = 0usize;
        let mut whole = true;
        loop {
            // A value starts at `i`. (The common cases first, with as few calls as can be: the
            // tap's tests run unoptimized builds, and a message can be millions of values.)
            match byte!(b, i) {
                b'0'..=b'9' => {
                    // An integer without a call; a fraction or an exponent the long way.
                    let first = i;
                    i += 1;
                    if b[first] != b'0' {
                        while matches!(byte!(b, i), b'0'..=b'9') {
                            i += 1;
                        }
                    }
                    if matches!(byte!(b, i), b'.' | b'e' | b'E') {
                        i = number_end(b, first)?;
                    }
                }
                b'-' => i = number_end(b, i)?,
                b'"' => i = string_end(b, i).ok_or(Unread::Syntax)?,
                open @ (b'{' | b'[') if depth < MAX_DEPTH => {
                    let object = open == b'{';
                    if object {
                        kinds |= 1u128 << depth;
                    } else {
                        kinds &= !(1u128 << depth);
                    }
                    opened[depth] = i;
                    i = ws(b, i + 1);
                    if byte!(b, i) == if object { b'}' } else { b']' } {
                        i += 1; // empty: a whole value, the container is not left open
                    } else {
                        depth += 1;
                        if object {
                            i = member_value(b, i)?;
                        }
                        continue;
                    }
                }
                b'{' | b'[' => {
                    let end = skip_brackets(b, i).ok_or(Unread::Syntax)?;
                    index.note(i, end);
                    i = end;
                    whole = false;
                }
                b't' => i = literal(b, i, b"true")?,
                b'f' => i = literal(b, i, b"false")?,
                b'n' => i = literal(b, i, b"null")?,
                _ => return Err(Unread::Syntax),
            }
            // After a value: the containers it closes, then a comma or the end.
            loop {
                if depth == 0 {
                    if ws(b, i) != b.len() {
                        return Err(Unread::Syntax);
                    }
                    index.ends.sort_unstable();
                    return Ok(Document { bytes, root: (start, i), whole, index });
                }
                if matches!(byte!(b, i), b' ' | b'\t' | b'\n' | b'\r') {
                    i = ws(b, i);
                }
                let object = (kinds >> (depth - 1)) & 1 == 1;
                match byte!(b, i) {
                    b',' => {
                        i += 1;
                        if matches!(byte!(b, i), b' ' | b'\t' | b'\n' | b'\r') {
                            i = ws(b, i);
                        }
                        if object {
                            i = member_value(b, i)?;
                        }
                        break;
                    }
                    b'}' if object => {
                        i += 1;
                        depth -= 1;
                        index.note(opened[depth], i);
                    }
                    b']' if !object => {
                        i += 1;
                        depth -= 1;
                        index.note(opened[depth], i);
                    }
                    _ => return Err(Unread::Syntax),
                }
            }
        }
    }

    /// The value.
    pub(crate) fn root(&self) -> Node<'_> {
        Node { text: &self.bytes[self.root.0..self.root.1], depth: 0, index: &self.index }
    }

    /// Every container was read: nothing was skipped for its depth.
    pub(crate) fn whole(&self) -> bool {
        self.whole
    }
}

/// The kind of a [`Node`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

/// One value of a checked [`Document`]: its bytes, and how deep it sits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<'a> {
    text: &'a [u8],
    depth: usize,
    index: &'a Index,
}

impl<'a> Node<'a> {
    pub(crate) fn kind(&self) -> Kind {
        match self.text.first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// The bytes of the value, as sent.
    pub(crate) fn bytes(&self) -> &'a [u8] {
        self.text
    }

    /// Where the value starts in `doc`, the bytes its document was parsed from (`None` for other
    /// bytes).
    pub(crate) fn offset_in(&self, doc: &[u8]) -> Option<usize> {
        let at = (self.text.as_ptr() as usize).checked_sub(doc.as_ptr() as usize)?;
        (at + self.text.len() <= doc.len()).then_some(at)
    }

    pub(crate) fn is_null(&self) -> bool {
        self.kind() == Kind::Null
    }

    /// A container deeper than [`MAX_DEPTH`]: skipped when the document was checked, never read.
    pub(crate) fn is_opaque(&self) -> bool {
        matches!(self.kind(), Kind::Object | Kind::Array) && self.depth >= MAX_DEPTH
    }

    /// Nothing in it sits deeper than [`MAX_DEPTH`] (one pass over its bytes).
    pub(crate) fn is_whole(&self) -> bool {
        if !matches!(self.kind(), Kind::Object | Kind::Array) {
            return true;
        }
        let b = self.text;
        let (mut level, mut i) = (0usize, 0usize);
        while i < b.len() {
            match b[i] {
                b'"' => {
                    i = string_end(b, i).unwrap_or(b.len());
                    continue;
                }
                b'{' | b'[' => {
                    if self.depth + level >= MAX_DEPTH {
                        return false;
                    }
                    level += 1;
                }
                b'}' | b']' => level = level.saturating_sub(1),
                _ => {}
            }
            i += 1;
        }
        true
    }

    /// An object's members in the order sent (none for anything else, or an opaque object).
    pub(crate) fn members(&self) -> Members<'a> {
        let read = self.kind() == Kind::Object && !self.is_opaque();
        Members { text: if read { self.text } else { b"" }, at: 1, depth: self.depth + 1, index: self.index }
    }

    /// An array's elements (none for anything else, or an opaque array).
    pub(crate) fn elements(&self) -> Elements<'a> {
        let read = self.kind() == Kind::Array && !self.is_opaque();
        Elements { text: if read { self.text } else { b"" }, at: 1, depth: self.depth + 1, index: self.index }
    }

    /// The member `key` of an object; the last one when it is sent more than once (as
    /// `serde_json` and Python's `json` read it).
    pub(crate) fn get(&self, key: &str) -> Option<Node<'a>> {
        let [v] = self.pick([key]);
        v
    }

    /// The members `keys` of an object, in one pass over it.
    pub(crate) fn pick<const N: usize>(&self, keys: [&str; N]) -> [Option<Node<'a>>; N] {
        let mut out = [None; N];
        for (k, v) in self.members() {
            if let Some(i) = keys.iter().position(|want| k.is(want)) {
                out[i] = Some(v);
            }
        }
        out
    }

    /// The `n`th element of an array.
    pub(crate) fn index(&self, n: usize) -> Option<Node<'a>> {
        self.elements().nth(n)
    }

    /// The value at an RFC 6901 pointer (`""` is the node itself), as `Value::pointer` finds it.
    pub(crate) fn pointer(&self, ptr: &str) -> Option<Node<'a>> {
        if ptr.is_empty() {
            return Some(*self);
        }
        let rest = ptr.strip_prefix('/')?;
        let mut at = *self;
        for token in rest.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            at = match at.kind() {
                Kind::Object => at.get(&token)?,
                Kind::Array => at.index(array_index(&token)?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// A string's text (borrowed unless it has escapes; `None` for anything else, or a string
    /// whose escapes are no Unicode).
    pub(crate) fn as_str(&self) -> Option<Cow<'a, str>> {
        if self.kind() != Kind::String {
            return None;
        }
        let inner = self.text.get(1..self.text.len().saturating_sub(1))?;
        if inner.contains(&b'\\') {
            serde_json::from_slice::<String>(self.text).ok().map(Cow::Owned)
        } else {
            std::str::from_utf8(inner).ok().map(Cow::Borrowed)
        }
    }

    /// A number's text as sent.
    pub(crate) fn number_text(&self) -> Option<&'a str> {
        (self.kind() == Kind::Number).then(|| std::str::from_utf8(self.text).ok()).flatten()
    }

    /// An integer that fits an `i64` (`1.0` and `1e3` are not, as with `Value::as_i64`).
    pub(crate) fn as_i64(&self) -> Option<i64> {
        self.number_text()?.parse().ok()
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        self.number_text()?.parse().ok()
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self.text {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    /// The `Value` of this node, if it fits `budget` (what is spent stays spent, also when it
    /// does not fit). A container deeper than [`MAX_DEPTH`] is [`Unread::Depth`].
    pub(crate) fn to_value(self, budget: &mut Budget) -> Result<Value, Unread> {
        // The text must fit too (a tree costs more than its text but for blanks and long
        // numbers): so the walk never scans more than the budget at each level.
        if self.text.len() > budget.left {
            return Err(Unread::Budget);
        }
        budget.spend(NODE_COST)?;
        match self.kind() {
            Kind::Object => {
                if self.is_opaque() {
                    return Err(Unread::Depth);
                }
                let mut map = serde_json::Map::new();
                for (k, v) in self.members() {
                    budget.spend(ENTRY_COST + k.text.len())?;
                    let key = k.decode().ok_or(Unread::Syntax)?;
                    let value = v.to_value(budget)?;
                    map.insert(key.into_owned(), value);
                }
                Ok(Value::Object(map))
            }
            Kind::Array => {
                if self.is_opaque() {
                    return Err(Unread::Depth);
                }
                let mut list = Vec::new();
                for v in self.elements() {
                    list.push(v.to_value(budget)?);
                }
                // A `Vec` may hold up to twice what it needs: count the slack.
                budget.spend((list.capacity() - list.len()) * NODE_COST)?;
                Ok(Value::Array(list))
            }
            Kind::String => {
                budget.spend(self.text.len())?;
                self.as_str().map(|s| Value::String(s.into_owned())).ok_or(Unread::Syntax)
            }
            Kind::Number => serde_json::from_slice::<serde_json::Number>(self.text).map(Value::Number).map_err(|_| Unread::Syntax),
            Kind::Bool => Ok(Value::Bool(self.text == b"true")),
            Kind::Null => Ok(Value::Null),
        }
    }
}

/// An object key as sent (with its quotes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key<'a> {
    text: &'a [u8],
}

impl<'a> Key<'a> {
    /// Whether the key is `name` (escapes decoded when the key is short enough to be it).
    pub(crate) fn is(&self, name: &str) -> bool {
        let inner = self.text.get(1..self.text.len().saturating_sub(1)).unwrap_or_default();
        if !inner.contains(&b'\\') {
            return inner == name.as_bytes();
        }
        self.text.len() <= MAX_ESCAPED_KEY && self.decode().is_some_and(|k| k == name)
    }

    /// The key's text.
    pub(crate) fn decode(&self) -> Option<Cow<'a, str>> {
        Node { text: self.text, depth: 0, index: &NO_INDEX }.as_str()
    }
}

/// See [`Node::members`].
pub(crate) struct Members<'a> {
    text: &'a [u8],
    at: usize,
    depth: usize,
    index: &'a Index,
}

impl<'a> Iterator for Members<'a> {
    type Item = (Key<'a>, Node<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.text;
        let mut i = ws(b, self.at);
        if byte!(b, i) == b',' {
            i = ws(b, i + 1);
        }
        if byte!(b, i) != b'"' {
            self.at = b.len();
            return None;
        }
        let key_end = string_end(b, i)?;
        let key = Key { text: &b[i..key_end] };
        let colon = ws(b, key_end);
        let start = ws(b, colon + 1);
        let end = value_end(b, start, self.index);
        self.at = end;
        Some((key, Node { text: b.get(start..end)?, depth: self.depth, index: self.index }))
    }
}

/// See [`Node::elements`].
pub(crate) struct Elements<'a> {
    text: &'a [u8],
    at: usize,
    depth: usize,
    index: &'a Index,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Node<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.text;
        let mut i = ws(b, self.at);
        if byte!(b, i) == b',' {
            i = ws(b, i + 1);
        }
        if matches!(byte!(b, i), END | b']') {
            self.at = b.len();
            return None;
        }
        let end = value_end(b, i, self.index);
        self.at = end;
        Some(Node { text: b.get(i..end)?, depth: self.depth, index: self.index })
    }
}

/// An RFC 6901 array index as `Value::pointer` reads it: digits, no leading zero, no sign.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while matches!(byte!(b, i), b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// After `"key"` and `:` at `i`: where the member's value starts.
fn member_value(b: &[u8], i: usize) -> Result<usize, Unread> {
    if byte!(b, i) != b'"' {
        return Err(Unread::Syntax);
    }
    let i = ws(b, string_end(b, i).ok_or(Unread::Syntax)?);
    if byte!(b, i) != b':' {
        return Err(Unread::Syntax);
    }
    Ok(ws(b, i + 1))
}

/// The end of the string that starts at `i` (its opening quote), its escapes checked; `None` when
/// it is not a JSON string.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        match byte!(b, j) {
            b'"' => return Some(j + 1),
            b'\\' => match byte!(b, j + 1) {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                b'u' => {
                    let hex = b.get(j + 2..j + 6)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    j += 6;
                }
                _ => return None,
            },
            // Control characters, and the end (END is one).
            0..0x20 => return None,
            _ => j += 1,
        }
    }
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, Unread> {
    if b.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err(Unread::Syntax)
    }
}

/// The end of the number that starts at `i` (the JSON grammar: `-? int frac? exp?`).
#[allow(clippy::manual_is_ascii_check)] // see `Document::parse`
fn number_end(b: &[u8], i: usize) -> Result<usize, Unread> {
    let mut j = i;
    if byte!(b, j) == b'-' {
        j += 1;
    }
    match byte!(b, j) {
        b'0' => j += 1,
        b'1'..=b'9' => {
            j += 1;
            while matches!(byte!(b, j), b'0'..=b'9') {
                j += 1;
            }
        }
        _ => return Err(Unread::Syntax),
    }
    if byte!(b, j) == b'.' {
        j = digits_end(b, j + 1)?;
    }
    if matches!(byte!(b, j), b'e' | b'E') {
        j += 1;
        if matches!(byte!(b, j), b'+' | b'-') {
            j += 1;
        }
        j = digits_end(b, j)?;
    }
    Ok(j)
}

/// The end of the run of one or more digits at `i` (a fraction's or an exponent's).
#[allow(clippy::manual_is_ascii_check)] // see `Document::parse`
fn digits_end(b: &[u8], i: usize) -> Result<usize, Unread> {
    let mut j = i;
    while matches!(byte!(b, j), b'0'..=b'9') {
        j += 1;
    }
    if j == i {
        Err(Unread::Syntax)
    } else {
        Ok(j)
    }
}

/// The end of the container that starts at `i`, found by counting brackets outside strings (its
/// strings are checked, nothing else is): how a container too deep to read is skipped, in fixed
/// memory whatever its depth. `None` when it does not end.
fn skip_brackets(b: &[u8], i: usize) -> Option<usize> {
    let (mut open, mut j) = (0usize, i);
    while j < b.len() {
        match b[j] {
            b'"' => {
                j = string_end(b, j)?;
                continue;
            }
            b'{' | b'[' => open += 1,
            b'}' | b']' => {
                open = open.checked_sub(1)?;
                if open == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// The end of the value that starts at `i` in checked bytes (see [`Document::parse`]).
fn value_end(b: &[u8], i: usize, index: &Index) -> usize {
    match byte!(b, i) {
        b'"' => string_end(b, i).unwrap_or(b.len()),
        b'{' | b'[' => index.end_of(b, i).or_else(|| skip_brackets(b, i)).unwrap_or(b.len()),
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                j += 1;
            }
            j
        }
    }
}

#[cfg(test)]
mod tests;
