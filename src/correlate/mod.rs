//! Correlate: span evidence in, decided chains of call evidence out. All state and all bounds of
//! the service live here.

pub mod assemble;
pub mod chains;
pub mod crossjoin;
mod due;
pub(crate) mod outbox;
pub mod sessions;
pub mod splits;

#[cfg(test)]
pub use assemble::assemble_calls;
pub use chains::{ChainLimits, ChainStats, Chains, DecidedCalls};
pub use sessions::{CatalogChange, Discovery, SessionLimits, Sessions};

#[cfg(test)]
mod tests;
