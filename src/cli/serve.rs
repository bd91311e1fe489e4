//! `mcp-health serve`: the service's command line. It reads the configuration and hands it to
//! the running service (`crate::service`), which binds, serves, reloads on SIGHUP and drains on
//! SIGTERM.

use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::service::ConfigSource;

#[derive(Args, Debug, Default)]
pub(crate) struct ServeArgs {
    /// YAML configuration (collector style); the embedded default when absent.
    #[arg(long, short)]
    pub config: Option<String>,
    /// Override one setting, as the collector's `--set`: a dotted key and a value, e.g.
    /// `--set receivers.otlp.protocols.grpc.endpoint=0.0.0.0:4317`. Repeatable; later wins.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Exit 2 for a configuration that cannot be loaded, 1 when the service could not start or a
/// part of it failed, 0 after a drain.
pub(crate) fn run(a: ServeArgs) -> ExitCode {
    let cfg = match Config::load_with(a.config.as_deref(), &a.set) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match crate::service::run(cfg, ConfigSource { path: a.config, sets: a.set }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
