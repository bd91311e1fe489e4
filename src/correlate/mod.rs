//! Correlate: span evidence in, decided chains of call evidence out. All state and all bounds of
//! the service live here.

pub mod assemble;
pub mod chains;

pub use assemble::assemble_calls;
pub use chains::{ChainLimits, ChainStats, Chains, DecidedCalls};

#[cfg(test)]
mod tests;
