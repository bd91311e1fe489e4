//! Emit.
