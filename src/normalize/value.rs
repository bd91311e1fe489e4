//! Tolerant readers for OTLP `AnyValue`s: instrumentations disagree on types (a status code as a
//! string, a request id as an int), so each reader accepts the forms that carry the same meaning
//! and reports everything else as a type error instead of guessing.

use super::view::{AnyValue, Value};

/// A string value, borrowed.
pub(crate) fn as_str<'a>(v: &Option<AnyValue<'a>>) -> Option<&'a str> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// An integer, from an int, an integral double or a decimal string.
pub(crate) fn as_i64(v: &Option<AnyValue<'_>>) -> Option<i64> {
    match v.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => Some(*i),
        Value::DoubleValue(d) if d.fract() == 0.0 && d.is_finite() && d.abs() < 9.0e15 => Some(*d as i64),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A boolean, from a bool or the strings `true` / `false`.
pub(crate) fn as_bool(v: &Option<AnyValue<'_>>) -> Option<bool> {
    match v.as_ref()?.value.as_ref()? {
        Value::BoolValue(b) => Some(*b),
        Value::StringValue(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Value::StringValue(s) if s.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

/// An identifier attribute (a string, or an integer in decimal) handed to `f` as text, without
/// the `String` [`as_id`] makes: request ids are read on every call span and kept only in their
/// redacted form.
pub(crate) fn id_with<T>(v: &Option<AnyValue<'_>>, f: impl FnOnce(&str) -> T) -> Option<T> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(f(s)),
        Value::IntValue(i) => {
            use std::io::Write;
            let mut buf = [0u8; 20];
            let mut w = &mut buf[..];
            write!(w, "{i}").ok()?;
            let n = 20 - w.len();
            std::str::from_utf8(&buf[..n]).ok().map(f)
        }
        _ => None,
    }
}

/// An identifier that may be written as a string or an int (JSON-RPC ids are either).
pub(crate) fn as_id(v: &Option<AnyValue<'_>>) -> Option<String> {
    id_with(v, str::to_string)
}

/// A list of strings, from an array of strings or a comma-separated string.
pub(crate) fn as_str_list(v: &Option<AnyValue<'_>>) -> Option<Vec<String>> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()),
        Value::ArrayValue(a) => Some(
            a.values
                .iter()
                .filter_map(|x| match x.value.as_ref()? {
                    Value::StringValue(s) => Some(s.to_string()),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

/// A number, from a double, an int or a decimal string.
pub(crate) fn as_f64(v: &Option<AnyValue<'_>>) -> Option<f64> {
    match v.as_ref()?.value.as_ref()? {
        Value::DoubleValue(d) if d.is_finite() => Some(*d),
        Value::IntValue(i) => Some(*i as f64),
        Value::StringValue(s) => s.trim().parse::<f64>().ok().filter(|d| d.is_finite()),
        _ => None,
    }
}
