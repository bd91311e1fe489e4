//! `${env:VAR}` and `${file:PATH}` substitution per scalar value, after the YAML is parsed.
//!
//! The providers are the collector's `env` (the default scheme: `${VAR}`) and `file`: the file's
//! content, less one final newline (the collector parses a retrieved value as YAML, which drops
//! it), read as the value's text. Any other scheme (`${http:…}`, `${yaml:…}`) is refused by name
//! rather than looked up as a variable that is not set.
//!
//! The text is never rewritten: the YAML parser reads it first (so comments are never looked at),
//! and each scalar *value* is expanded as it is deserialized, so a substituted value is always one
//! scalar — a `#` in it is not a comment, a newline in it does not make keys. Keys are not
//! expanded. Because the parser's own deserializer is wrapped, errors keep the key path, line and
//! column of the value they concern.
//!
//! A value containing a reference is read as the target asks: a boolean, number or duration field
//! may be given as `${env:VAR}` (the expanded text is parsed as that type), as in the collector.
//! An optional value whose expansion is empty (`${env:VAR:-}`) is absent. In flow style
//! (`{a: ...}`) a reference must be quoted, since `{` and `}` end a plain scalar there.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess, VariantAccess, Visitor};

/// Where variables are looked up (the process environment, or a table in tests).
pub(crate) type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A reference that cannot be resolved; `line` counts from 1 within the expanded string.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Missing {
    /// The variable's name, the file's path or the unsupported scheme.
    pub var: String,
    pub line: usize,
    pub why: Unresolved,
}

/// Why a reference could not be resolved.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// `${env:VAR}` with `VAR` not set and no default.
    EnvNotSet,
    /// `${file:PATH}` that cannot be read (the I/O error's kind; never the content).
    File(std::io::ErrorKind),
    /// `${scheme:…}` with a scheme other than `env` and `file`.
    Scheme,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.why {
            Unresolved::EnvNotSet => {
                write!(f, "environment variable {var} is not set; use ${{env:{var}:-default}} for a fallback", var = self.var)
            }
            Unresolved::File(kind) => write!(f, "config provider file: cannot read {} ({kind})", self.var),
            Unresolved::Scheme => write!(f, "config provider {}: is not supported (env and file are)", self.var),
        }
    }
}

/// The scheme of a reference's body (`file` in `file:/p`), if it has one: letters first, then
/// letters, digits, `+`, `.`, `-`; a `:-` is a default, not a scheme (`${VAR:-x}`).
fn scheme(inner: &str) -> Option<(&str, &str)> {
    let (s, rest) = inner.split_once(':')?;
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-' | '_'));
    (ok && !rest.starts_with('-')).then_some((s, rest))
}

/// `${file:PATH}`: the file's content less one final newline.
fn read_file(path: &str) -> Result<String, std::io::ErrorKind> {
    let mut text = std::fs::read_to_string(path).map_err(|e| e.kind())?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// Expand `${env:VAR}`, `${VAR}` and `${env:VAR:-default}` in one string; `$$` is a literal `$`,
/// and a `$` not followed by `{` or `$` stays as it is.
pub(crate) fn expand(text: &str, lookup: Lookup) -> Result<String, Missing> {
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let mut rest = line;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + 1..];
            if let Some(stripped) = after.strip_prefix('$') {
                out.push('$');
                rest = stripped;
            } else if let (Some(body), Some(end)) = (after.strip_prefix('{'), after.find('}')) {
                let inner = &body[..end - 1];
                let missing = |var: &str, why| Missing { var: var.into(), line: n + 1, why };
                let inner = match scheme(inner) {
                    Some(("env", rest)) => rest,
                    Some(("file", path)) => {
                        out.push_str(&read_file(path).map_err(|k| missing(path, Unresolved::File(k)))?);
                        rest = &after[end + 1..];
                        continue;
                    }
                    Some((other, _)) => return Err(missing(other, Unresolved::Scheme)),
                    None => inner,
                };
                let (var, default) = match inner.split_once(":-") {
                    Some((v, d)) => (v, Some(d)),
                    None => (inner, None),
                };
                match lookup(var).or(default.map(str::to_string)) {
                    Some(v) => out.push_str(&v),
                    None => return Err(missing(var, Unresolved::EnvNotSet)),
                }
                rest = &after[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
    }
    Ok(out)
}

#[derive(Clone, Copy)]
struct Env<'a> {
    lookup: Lookup<'a>,
}

impl Env<'_> {
    /// The expanded string, or `None` when there is nothing to expand.
    fn expand<E: de::Error>(&self, s: &str) -> Result<Option<String>, E> {
        if !s.contains('$') {
            return Ok(None);
        }
        expand(s, self.lookup).map(Some).map_err(|m| E::custom(m))
    }
}

/// What the target asked for, so an expanded string can be read as it.
#[derive(Clone, Copy)]
enum Want {
    Any,
    Bool,
    Int,
    Float,
}

/// A deserializer that expands references in the scalar values `de` yields.
pub(crate) struct Subst<'a, D> {
    de: D,
    env: Env<'a>,
}

impl<'a, D> Subst<'a, D> {
    pub(crate) fn new(de: D, lookup: Lookup<'a>) -> Self {
        Subst { de, env: Env { lookup } }
    }
}

struct Wrap<'a, V> {
    inner: V,
    env: Env<'a>,
    want: Want,
}

struct Seed<'a, S> {
    seed: S,
    env: Env<'a>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Subst { de, env: self.env })
    }
}

macro_rules! via {
    ($($method:ident => $want:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.de.deserialize_any(Wrap { inner: visitor, env: self.env, want: Want::$want })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Subst<'_, D> {
    type Error = D::Error;

    via! {
        deserialize_any => Any, deserialize_bool => Bool,
        deserialize_i8 => Int, deserialize_i16 => Int, deserialize_i32 => Int, deserialize_i64 => Int, deserialize_i128 => Int,
        deserialize_u8 => Int, deserialize_u16 => Int, deserialize_u32 => Int, deserialize_u64 => Int, deserialize_u128 => Int,
        deserialize_f32 => Float, deserialize_f64 => Float,
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_char(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_str(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_string(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_bytes(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_byte_buf(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_option(Opt { inner: visitor, env: self.env })
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_unit(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_unit_struct(name, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_newtype_struct(name, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_seq(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple(len, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(self, name: &'static str, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple_struct(name, len, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_map(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_struct(name, fields, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_enum(name, variants, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    /// Only values get here (keys are never wrapped): an enum variant or a tag, such as
    /// `unpinned: ${env:POLICY}` or `mode: ${env:MODE}`.
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_identifier(Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_ignored_any(visitor)
    }
    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

macro_rules! forward {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Wrap<'_, V> {
    /// Hand on an expanded string, read as the target wants it.
    fn expanded<E: de::Error>(self, s: String) -> Result<V::Value, E> {
        match self.want {
            Want::Any => self.inner.visit_string(s),
            Want::Bool => match s.as_str() {
                "true" | "True" | "TRUE" => self.inner.visit_bool(true),
                "false" | "False" | "FALSE" => self.inner.visit_bool(false),
                _ => self.inner.visit_string(s),
            },
            Want::Int => match (s.parse::<u64>(), s.parse::<i64>()) {
                (Ok(u), _) => self.inner.visit_u64(u),
                (_, Ok(i)) => self.inner.visit_i64(i),
                _ => self.inner.visit_string(s),
            },
            Want::Float => match s.parse::<f64>() {
                Ok(f) => self.inner.visit_f64(f),
                Err(_) => self.inner.visit_string(s),
            },
        }
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64), visit_i128(i128),
        visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64), visit_u128(u128),
        visit_f32(f32), visit_f64(f64), visit_char(char),
        visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        match self.env.expand(v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_str(v),
        }
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        match self.env.expand(v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_borrowed_str(v),
        }
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        match self.env.expand(&v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_string(v),
        }
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Subst { de, env: self.env })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Subst { de, env: self.env })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(Seq { seq, env: self.env })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(Map { map, env: self.env })
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(Enum { data, env: self.env })
    }
}

/// An optional value: a reference that expands to nothing (`${env:VAR:-}`) is an absent value,
/// as when the text was substituted before parsing.
struct Opt<'a, V> {
    inner: V,
    env: Env<'a>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Opt<'_, V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        de.deserialize_any(Present { inner: self.inner, env: self.env })
    }
}

/// What is inside `Some`: expanded strings are checked for emptiness, everything else is handed on.
struct Present<'a, V> {
    inner: V,
    env: Env<'a>,
}

impl<'de, V: Visitor<'de>> Present<'_, V> {
    fn expanded<E: de::Error>(self, s: String) -> Result<V::Value, E> {
        if s.is_empty() {
            return self.inner.visit_none();
        }
        self.inner.visit_some(Expanded { s, marker: std::marker::PhantomData })
    }
}

macro_rules! present {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.visit_some(v.into_deserializer())
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Present<'_, V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    present! { visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_i128(i128), visit_u128(u128), visit_f64(f64) }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        match self.env.expand(v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_some(v.to_string().into_deserializer()),
        }
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        match self.env.expand(v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_some(de::value::BorrowedStrDeserializer::new(v)),
        }
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        match self.env.expand(&v)? {
            Some(s) => self.expanded(s),
            None => self.inner.visit_some(v.into_deserializer()),
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_some(de::value::SeqAccessDeserializer::new(Seq { seq, env: self.env }))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_some(de::value::MapAccessDeserializer::new(Map { map, env: self.env }))
    }
}

/// An expanded string, read as the target asks (`${env:VAR}` for a number, boolean or duration).
struct Expanded<E> {
    s: String,
    marker: std::marker::PhantomData<E>,
}

impl<E> Expanded<E> {
    fn visit<'de, V: Visitor<'de>>(self, visitor: V, want: Want) -> Result<V::Value, E>
    where
        E: de::Error,
    {
        // Already expanded: the lookup is not used again.
        Wrap { inner: visitor, env: Env { lookup: &|_| None }, want }.expanded(self.s)
    }
}

macro_rules! expanded_as {
    ($($method:ident => $want:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
            self.visit(visitor, Want::$want)
        }
    )*};
}

impl<'de, E: de::Error> Deserializer<'de> for Expanded<E> {
    type Error = E;
    expanded_as! {
        deserialize_any => Any, deserialize_bool => Bool,
        deserialize_i8 => Int, deserialize_i16 => Int, deserialize_i32 => Int, deserialize_i64 => Int, deserialize_i128 => Int,
        deserialize_u8 => Int, deserialize_u16 => Int, deserialize_u32 => Int, deserialize_u64 => Int, deserialize_u128 => Int,
        deserialize_f32 => Float, deserialize_f64 => Float,
    }
    fn deserialize_enum<V: Visitor<'de>>(self, _name: &'static str, _variants: &'static [&'static str], visitor: V) -> Result<V::Value, E> {
        visitor.visit_enum(self.s.into_deserializer())
    }
    serde::forward_to_deserialize_any! {
        char str string bytes byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

struct Seq<'a, A> {
    seq: A,
    env: Env<'a>,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Seq<'_, A> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.seq.next_element_seed(Seed { seed, env: self.env })
    }
    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

struct Map<'a, A> {
    map: A,
    env: Env<'a>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Map<'_, A> {
    type Error = A::Error;
    /// Keys are taken as written.
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.map.next_key_seed(seed)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.map.next_value_seed(Seed { seed, env: self.env })
    }
    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

struct Enum<'a, A> {
    data: A,
    env: Env<'a>,
}

impl<'a, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Enum<'a, A> {
    type Error = A::Error;
    type Variant = Variant<'a, A::Variant>;
    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let (v, variant) = self.data.variant_seed(Seed { seed, env: self.env })?;
        Ok((v, Variant { variant, env: self.env }))
    }
}

struct Variant<'a, A> {
    variant: A,
    env: Env<'a>,
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<'_, A> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        self.variant.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.variant.newtype_variant_seed(Seed { seed, env: self.env })
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.variant.tuple_variant(len, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, A::Error> {
        self.variant.struct_variant(fields, Wrap { inner: visitor, env: self.env, want: Want::Any })
    }
}

/// The line and column (from 1) of the key at `path` (`a.b.c`) in a YAML text, or of its deepest
/// ancestor present when the key itself is not written (a default). `None` when not even the
/// first key is there, or the text does not parse.
pub(crate) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let parts: Vec<&str> = path.split('.').collect();
    (1..=parts.len()).rev().find_map(|n| locate_exactly(text, &parts[..n]))
}

/// The parser knows positions only in its errors: walk to the key and fail there on purpose.
const FOUND: &str = "\u{0}mcp-health: key found";

fn locate_exactly(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    match (Find { path }).deserialize(serde_yaml_ng::Deserializer::from_str(text)) {
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| (l.line(), l.column())),
        _ => None,
    }
}

struct Find<'p> {
    path: &'p [&'p str],
}

impl<'de> DeserializeSeed<'de> for Find<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Find<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else { return Ok(()) };
        while let Some(matched) = map.next_key_seed(Key { want: first, last: rest.is_empty() })? {
            if matched {
                return map.next_value_seed(Find { path: rest });
            }
            map.next_value::<de::IgnoredAny>()?;
        }
        Ok(())
    }
}

/// A key: `true` when it is the one wanted; the last key of the path fails with [`FOUND`], which
/// the parser marks with the key's own position.
struct Key<'p> {
    want: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match v == self.want {
            true if self.last => Err(E::custom(FOUND)),
            matched => Ok(matched),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    /// `${file:PATH}` is the file's content less one final newline, as the collector's file
    /// provider; an unreadable file and an unknown scheme are refused by name, never read as a
    /// variable that is not set.
    #[test]
    fn file_references_are_read_and_other_schemes_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "s3cret\n").unwrap();
        let crlf = dir.path().join("crlf");
        std::fs::write(&crlf, "two\nlines\r\n").unwrap();
        let t = format!("Bearer ${{file:{}}}|${{file:{}}}", p.display(), crlf.display());
        assert_eq!(expand(&t, &none).unwrap(), "Bearer s3cret|two\nlines");
        let gone = dir.path().join("gone");
        let e = expand(&format!("${{file:{}}}", gone.display()), &none).unwrap_err();
        assert_eq!(e.why, Unresolved::File(std::io::ErrorKind::NotFound));
        assert!(e.to_string().contains("config provider file") && e.to_string().contains("gone"), "{e}");
        let e = expand("${http://example.com/c}", &none).unwrap_err();
        assert_eq!((e.var.as_str(), &e.why), ("http", &Unresolved::Scheme));
        assert!(e.to_string().contains("config provider http: is not supported"), "{e}");
        // `env:` and no scheme are variables; a `:-` is a default, not a scheme.
        assert_eq!(expand("${env:A}${B:-x}", &|v| (v == "A").then(|| "a".to_string())).unwrap(), "ax");
        assert_eq!(expand("${NOPE}", &none).unwrap_err().why, Unresolved::EnvNotSet);
    }
}
