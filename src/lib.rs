//! mcp-health: tells whether MCP tool calls are really healthy, from the OTLP spans of clients,
//! servers and verifiers.
//!
//! The data takes one road and the modules follow it:
//! [`receive`] (OTLP/gRPC, OTLP/HTTP) → [`normalize`] (dialects → [`evidence`]) → [`correlate`]
//! (trace-keyed chains) → [`classify`] (pure functions → [`verdict`]) → [`emit`] (pass-through,
//! health spans, metrics). [`engine`] is the one pipeline serve and replay both run; [`flow`] and
//! [`telemetry`] are the plumbing and the self-description under both ends of a queue; [`cli`] is
//! the command line.

pub mod bounded;
pub mod classify;
pub mod cli;
pub mod config;
pub mod correlate;
pub mod emit;
pub mod engine;
pub mod evidence;
pub mod flow;
pub mod gate;
pub mod loadgen;
pub mod normalize;
pub mod receive;
pub(crate) mod service;
pub mod state;
pub mod tap;
pub mod telemetry;
pub mod verdict;
