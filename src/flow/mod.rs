//! The plumbing under the receivers and the exporter: what both sides of a queue must agree on.
//! The memory a request holds ([`memory`]), the marks that keep an export loop from feeding
//! itself ([`loops`]), the message every queue carries ([`outgoing`]), the one bounded queue
//! type ([`queue`]) and the counters both sides record into ([`meters`], labelled by
//! [`labels`]). Nothing here knows a protocol's listener or a backend: `receive/` and `emit/`
//! both sit above it, so neither imports the other.

pub mod labels;
pub mod loops;
pub mod memory;
pub mod meters;
pub mod outgoing;
pub mod queue;
