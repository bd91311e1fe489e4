//! What mcp-health says about itself, declared once: every instrument (name, kind, unit, labels,
//! description, level — [`instruments`]), the closed label sets they and the logs are recorded by
//! ([`labels`]), and the counters the receivers and the queues share ([`meters`]). It sits under
//! `flow/`, `receive/` and `emit/` and knows nothing of them: the exporter builds the meters from
//! these declarations and generates the metrics reference from them, so a name, a unit or a label
//! value is spelled in one place.

pub(crate) mod instruments;
pub(crate) mod labels;
pub(crate) mod meters;
