//! Correlate: span evidence in, decided chains of call evidence out. All state and all bounds of
//! the service live here.

pub(crate) mod assemble;
pub(crate) mod chains;
pub(crate) mod crossjoin;
mod due;
pub(crate) mod outbox;
pub(crate) mod sessions;
pub(crate) mod splits;
pub(crate) mod takeback;

#[cfg(test)]
pub(crate) use assemble::assemble_calls;
pub use chains::{ChainLimits, ChainStats, Chains, DecidedCalls};
pub use sessions::{CatalogChange, Discovery, SessionLimits, Sessions};

#[cfg(test)]
mod tests;
