//! The command line: `serve` (the default), `replay`, `validate`. One file per command.

pub(crate) mod health;
pub(crate) mod keygen;
pub(crate) mod loadgen;
pub(crate) mod lock;
pub(crate) mod replay;
pub(crate) mod send;
pub(crate) mod serve;
pub(crate) mod tap;
pub(crate) mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mcp-health: are your agents' MCP tool calls really healthy?
///
/// Receives OTLP spans from MCP clients, servers and verifiers, joins them per call (by trace id),
/// decides for each call the first failed layer (transport, protocol, authorization, execution,
/// outcome) and a health state, and sends health spans and metrics back over OTLP and Prometheus.
/// A call nobody verified is `unverified`, never `healthy`.
#[derive(Parser, Debug)]
#[command(name = "mcp-health", version = VERSION, about, long_about, after_help = EXAMPLES)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--version`: the package version and the commit it was built from (`-dirty` when the tree had
/// changes; `unknown` outside a git checkout unless `MCP_HEALTH_COMMIT` was set at build time).
pub(crate) const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("MCP_HEALTH_COMMIT"), ")");

const EXAMPLES: &str = "\
Examples:
  mcp-health                                  run on the embedded default (loopback, no backend)
  mcp-health serve --config otel-config/mcp-health.yaml
  mcp-health validate otel-config/mcp-health.yaml
  mcp-health replay tests/fixtures/eight_calls.jsonl
  mcp-health replay --format json traces.jsonl   one JSON verdict per line, then a summary
  mcp-health replay evidence.jsonl --fail-on state=false_success,effect_unknown --format sarif > out.sarif
                                              a CI gate: exit 1 on findings (docs/ci-gate.md)
  mcp-health lock traces.jsonl --lockfile mcp-health.lock.json   pin tool contracts
  mcp-health verify traces.jsonl --lockfile mcp-health.lock.json exit 1 on contract drift
  mcp-health loadgen --endpoint 127.0.0.1:4317 --seconds 10
  mcp-health tap -- python server.py          wrap a stdio MCP server, emit evidence spans over OTLP
  mcp-health tap --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000   the same for streamable HTTP
  mcp-health tap --record evidence.jsonl -- python server.py   evidence to a file `replay` reads
  mcp-health print-default-config > my.yaml   start your own config from the default
  mcp-health health --endpoint 127.0.0.1:13133   exit 0 when the service answers 200
  mcp-health keygen --out tap.key             a receipt-signing key for `tap --signing-key`
  mcp-health send tests/fixtures/eight_calls.jsonl   send a recording to a running service, moved to now
  mcp-health completions bash > /etc/bash_completion.d/mcp-health

Environment: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT,
OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_METRIC_EXPORT_INTERVAL, OTEL_SERVICE_NAME, RUST_LOG.";

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run the service (the default when no command is given).
    Serve(serve::ServeArgs),
    /// Classify OTLP/JSON files offline and print verdicts and the two success rates; with
    /// `--fail-on`, a CI gate (exit 0 passed, 1 findings, 2 bad input).
    Replay(replay::ReplayArgs),
    /// Check a configuration file; names the bad key and its line.
    Validate(validate::ValidateArgs),
    /// Pin tool contracts (digest + definition per server and tool) from observed discoveries.
    Lock(lock::LockArgs),
    /// Check observed tool definitions against a lockfile; names what changed. Exit 1 on drift.
    Verify(lock::VerifyArgs),
    /// Send synthetic MCP spans to an OTLP/gRPC endpoint and report the accepted rate.
    Loadgen(loadgen::LoadgenArgs),
    /// A transparent MCP proxy (stdio or streamable HTTP) that emits evidence spans over OTLP.
    Tap(Box<tap::TapArgs>),
    /// Ask a running service's health check: exit 0 when it answers 200 (a container HEALTHCHECK).
    Health(health::HealthArgs),
    /// Make a receipt-signing key: the private part to a file, the public part printed.
    Keygen(keygen::KeygenArgs),
    /// Send OTLP/JSON recordings to a running service (or any OTLP receiver), moved to now.
    Send(send::SendArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(CompletionsArgs),
    /// Print the embedded default configuration.
    #[command(name = "print-default-config")]
    PrintDefaultConfig,
}

#[derive(clap::Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve(serve::ServeArgs::default())) {
        Command::Serve(a) => serve::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Loadgen(a) => loadgen::run(a),
        Command::Lock(a) => lock::run_lock(a),
        Command::Verify(a) => lock::run_verify(a),
        Command::Tap(a) => tap::run(*a),
        Command::Health(a) => health::run(a),
        Command::Keygen(a) => keygen::run(a),
        Command::Send(a) => send::run(a),
        Command::Completions(a) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(a.shell, &mut cmd, "mcp-health", &mut script);
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            ExitCode::SUCCESS
        }
        Command::PrintDefaultConfig => {
            print!("{}", crate::config::DEFAULT_CONFIG);
            ExitCode::SUCCESS
        }
    }
}
