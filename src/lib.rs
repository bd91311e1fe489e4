//! mcp-health: tells whether MCP tool calls are really healthy, from the OTLP spans of clients,
//! servers and verifiers.
//!
//! The data takes one road and the modules follow it:
//! `receive` (OTLP/gRPC, OTLP/HTTP) → [`normalize`] (dialects → [`evidence`]) → `correlate`
//! (trace-keyed chains) → `classify` (pure functions → [`verdict`]) → `emit` (pass-through,
//! health spans, metrics). [`engine`] is the one pipeline serve and replay both run; `flow` and
//! `telemetry` are the plumbing and the self-description under both ends of a queue; `cli` is
//! the command line.
//!
//! What the library offers is the judge without the service around it: load a [`config`] (its
//! [`config::Config::engine_config`] is what the engine is made from), turn an OTLP export request
//! into a batch of [`evidence`] with [`normalize`], feed it to an [`engine::Engine`] and read the
//! [`verdict`]s it decides. [`main`] is the whole command line,
//! for the binary. Everything else (the receivers, the exporters, the store, the tap, the gate,
//! the plumbing) is `pub(crate)`: it is how the service runs, not a contract, and keeping it
//! private lets it change without breaking a user and lets the compiler find what nobody calls.
//! `testing` re-exports the few inner items the crate's own benches and tests need.

mod allocator;
pub(crate) mod bounded;
pub(crate) mod classify;
pub(crate) mod cli;
pub mod config;
pub(crate) mod correlate;
pub(crate) mod defaults;
pub(crate) mod emit;
pub mod engine;
pub mod evidence;
pub(crate) mod flow;
pub(crate) mod gate;
pub(crate) mod loadgen;
pub mod normalize;
pub(crate) mod receive;
pub(crate) mod service;
pub(crate) mod state;
pub(crate) mod tap;
pub(crate) mod telemetry;
pub mod verdict;

#[doc(hidden)]
pub mod testing;

pub use allocator::Mimalloc;

/// What the binary's allocator offers the service: the service calls them. The library installs
/// no allocator; the binary and the benchmarks install [`Mimalloc`].
pub struct Allocator {
    /// Whether the allocator returns freed memory to the OS at once (`true`) or keeps it for
    /// reuse: the memory limiter asks for at once while the process is near its limit, since a
    /// limit on the resident set needs freed memory to leave it.
    pub return_freed_memory: fn(bool),
    /// Called on a runtime thread about to go idle: hand back what it freed (to the OS while the
    /// process is near its memory limit).
    pub collect_on_idle: fn(),
}

/// The `mcp-health` command line: parse the arguments, run the command, return its exit code.
pub fn main(allocator: Allocator) -> std::process::ExitCode {
    flow::memory::set_allocator_hook(allocator.return_freed_memory);
    flow::memory::set_idle_hook(allocator.collect_on_idle);
    cli::main()
}
