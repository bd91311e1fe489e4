//! Export loops: what mcp-health sends upstream coming back into its own receivers (its exporter
//! pointed at a collector that feeds it). Without a guard one span became 44,919 in 6 s: every
//! pass-through copy came back to be passed on again, and every health span came back to be
//! judged as a call, making another health span.
//!
//! Everything mcp-health sends carries a marker on its resource, naming this process by an id
//! drawn at start: what it makes itself (health spans, incident records, its own metrics) carries
//! `mcp_health.emitter`; what it passes on gets its id appended to `mcp_health.via` (a string
//! array, one id per mcp-health it went through, like an HTTP `Via` header). A resource that
//! comes back with this process's id in either is a loop: its items are dropped, counted in
//! `mcp_health.spans.looped` (`mcp_health.signals.dropped{reason="looped"}` for metrics and logs),
//! neither judged nor passed on again. Another mcp-health's health spans (a different id) are
//! passed on but never judged: they are verdicts, not calls.

use std::sync::OnceLock;

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// On the resource of what mcp-health makes itself: the id of the process that made it.
pub(crate) const EMITTER: &str = "mcp_health.emitter";
/// On the resource of what mcp-health passed on: the ids of every process it went through.
pub(crate) const VIA: &str = "mcp_health.via";

/// This process's id: 16 hex digits drawn once (from the clock, the pid and the hasher's random
/// keys; it needs to be unique among the instances of a pipeline, not unpredictable).
pub(crate) fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        h.write_u32(std::process::id());
        format!("{:016x}", h.finish())
    })
}

fn str_value(v: &Option<AnyValue>) -> Option<&str> {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// The resource was made, or passed on, by the process `id`: it has looped back.
pub(crate) fn is_looped(resource: Option<&Resource>, id: &str) -> bool {
    let Some(r) = resource else { return false };
    r.attributes.iter().any(|kv| match kv.key.as_str() {
        EMITTER => str_value(&kv.value) == Some(id),
        VIA => match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::ArrayValue(a)) => a.values.iter().any(|v| matches!(&v.value, Some(Value::StringValue(s)) if s == id)),
            Some(Value::StringValue(s)) => s == id,
            _ => false,
        },
        _ => false,
    })
}

/// The resource is what some mcp-health made itself (health spans, incident records, metrics).
#[cfg(test)]
pub(crate) fn is_emitted(resource: Option<&Resource>) -> bool {
    resource.is_some_and(|r| r.attributes.iter().any(|kv| kv.key == EMITTER))
}

/// Append `id` to the resource's `mcp_health.via` before it is passed on.
pub(crate) fn mark_via(resource: &mut Option<Resource>, id: &str) {
    let r = resource.get_or_insert_with(Resource::default);
    let me = AnyValue { value: Some(Value::StringValue(id.to_string())) };
    match r.attributes.iter_mut().find(|kv| kv.key == VIA) {
        Some(kv) => match kv.value.as_mut().and_then(|v| v.value.as_mut()) {
            Some(Value::ArrayValue(a)) => a.values.push(me),
            _ => kv.value = Some(AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![me] })) }),
        },
        None => r.attributes.push(KeyValue {
            key: VIA.into(),
            value: Some(AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![me] })) }),
            ..Default::default()
        }),
    }
}

/// A fresh `mcp_health.via` attribute naming `id` (what [`mark_via`] adds to a resource without one).
pub(crate) fn via_attribute(id: &str) -> KeyValue {
    let me = AnyValue { value: Some(Value::StringValue(id.to_string())) };
    KeyValue {
        key: VIA.into(),
        value: Some(AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![me] })) }),
        ..Default::default()
    }
}

/// The `mcp_health.emitter` attribute of this process.
pub(crate) fn emitter_attribute() -> KeyValue {
    KeyValue { key: EMITTER.into(), value: Some(AnyValue { value: Some(Value::StringValue(instance_id().into())) }), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_this_process_sent_is_recognized_when_it_comes_back() {
        let me = instance_id();
        assert_eq!(me.len(), 16);
        assert_eq!(instance_id(), me, "one id per process");
        let made = Some(Resource { attributes: vec![emitter_attribute()], ..Default::default() });
        assert!(is_looped(made.as_ref(), me) && is_emitted(made.as_ref()));
        assert!(!is_looped(made.as_ref(), "0123456789abcdef"), "another instance's health spans are not a loop");
        // Passed on by another instance, then by this one: a loop for this one only.
        let mut passed = None;
        mark_via(&mut passed, "0123456789abcdef");
        assert!(!is_looped(passed.as_ref(), me) && !is_emitted(passed.as_ref()));
        mark_via(&mut passed, me);
        assert!(is_looped(passed.as_ref(), me));
        assert!(is_looped(passed.as_ref(), "0123456789abcdef"));
        let via = passed.unwrap().attributes.into_iter().find(|kv| kv.key == VIA).unwrap();
        assert!(matches!(via.value.and_then(|v| v.value), Some(Value::ArrayValue(a)) if a.values.len() == 2), "one id per hop");
        assert!(!is_looped(None, me));
    }
}
