//! The plumbing under the receivers and the exporter: what both sides of a queue must agree on.
//! The memory a request holds ([`memory`]), the marks that keep an export loop from feeding
//! itself ([`loops`]), the message every queue carries ([`outgoing`]), the one bounded queue
//! type ([`queue`]), which records into the counters both sides share
//! ([`crate::telemetry::meters`]), and blocking work kept off the runtime's thread
//! ([`blocking`]). Nothing here knows a protocol's listener or a backend:
//! `receive/` and `emit/` both sit above it, so neither imports the other.

pub(crate) mod blocking;
pub(crate) mod loops;
pub(crate) mod memory;
pub(crate) mod outgoing;
pub(crate) mod queue;
