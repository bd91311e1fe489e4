//! A borrowed view of one OTLP span: what the dialects read.
//!
//! The hot path (`super::wire`) builds it straight from the request's wire bytes, so a span costs
//! no allocation for its strings and ids: they are slices of the request. OTLP/JSON and tests,
//! which hold generated `opentelemetry-proto` structs, borrow them into the same view
//! ([`SpanView::from_proto`]). The field and variant names are the generated types' own, so a
//! dialect reads a view the way it would read a `Span`.

use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::trace::v1 as pt;

/// One attribute.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyValue<'a> {
    pub key: &'a str,
    pub value: Option<AnyValue<'a>>,
}

/// An attribute value (`None` inside: the value was empty on the wire).
#[derive(Clone, Debug, PartialEq)]
pub struct AnyValue<'a> {
    pub value: Option<Value<'a>>,
}

/// The value's one field.
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::enum_variant_names,
    reason = "the variants are named as the OTLP proto's any_value::Value, which the dialects read the same way"
)]
pub enum Value<'a> {
    StringValue(&'a str),
    BoolValue(bool),
    IntValue(i64),
    DoubleValue(f64),
    ArrayValue(ArrayValue<'a>),
    KvlistValue(KeyValueList<'a>),
    BytesValue(&'a [u8]),
    /// A profiling-only string-table reference; no dialect reads it.
    StringValueStrindex(i32),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArrayValue<'a> {
    pub values: Vec<AnyValue<'a>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyValueList<'a> {
    pub values: Vec<KeyValue<'a>>,
}

/// A span event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event<'a> {
    pub time_unix_nano: u64,
    pub name: &'a str,
    pub attributes: Vec<KeyValue<'a>>,
}

/// A span's status.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Status<'a> {
    pub message: &'a str,
    pub code: i32,
}

/// One span, borrowed. Links are not read by any dialect and are not in the view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpanView<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub parent_span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    /// Empty from the wire walk when no dialect could read them (see `wire::span_message`).
    pub attributes: Vec<KeyValue<'a>>,
    pub events: Vec<Event<'a>>,
    pub status: Option<Status<'a>>,
}

impl<'a> SpanView<'a> {
    /// Borrow a generated span.
    pub fn from_proto(s: &'a pt::Span) -> Self {
        SpanView {
            trace_id: &s.trace_id,
            span_id: &s.span_id,
            parent_span_id: &s.parent_span_id,
            name: &s.name,
            kind: s.kind,
            start_time_unix_nano: s.start_time_unix_nano,
            end_time_unix_nano: s.end_time_unix_nano,
            attributes: attributes_from_proto(&s.attributes),
            events: s
                .events
                .iter()
                .map(|e| Event { time_unix_nano: e.time_unix_nano, name: &e.name, attributes: attributes_from_proto(&e.attributes) })
                .collect(),
            status: s.status.as_ref().map(|st| Status { message: &st.message, code: st.code }),
        }
    }
}

/// Borrow generated attributes.
pub(crate) fn attributes_from_proto(kvs: &[pc::KeyValue]) -> Vec<KeyValue<'_>> {
    kvs.iter().map(|kv| KeyValue { key: &kv.key, value: kv.value.as_ref().map(any_from_proto) }).collect()
}

fn any_from_proto(v: &pc::AnyValue) -> AnyValue<'_> {
    use pc::any_value::Value as P;
    AnyValue {
        value: v.value.as_ref().map(|v| match v {
            P::StringValue(s) => Value::StringValue(s),
            P::BoolValue(b) => Value::BoolValue(*b),
            P::IntValue(i) => Value::IntValue(*i),
            P::DoubleValue(d) => Value::DoubleValue(*d),
            P::ArrayValue(a) => Value::ArrayValue(ArrayValue { values: a.values.iter().map(any_from_proto).collect() }),
            P::KvlistValue(l) => Value::KvlistValue(KeyValueList { values: attributes_from_proto(&l.values) }),
            P::BytesValue(b) => Value::BytesValue(b),
            P::StringValueStrindex(i) => Value::StringValueStrindex(*i),
        }),
    }
}
