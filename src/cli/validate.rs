//! `mcp-health validate CONFIG`: parse and check a configuration without starting anything.
//!
//! `validate` runs the checks `serve` runs before it binds anything (`service::preflight`: the
//! `OTEL_EXPORTER_OTLP_*` variables, the exporter endpoints, certificates, the lockfile), so
//! what `serve` refuses at start `validate` refuses too, with the same message. What it cannot
//! know without starting (a port in use, a state store that does not answer) it does not check.

use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::service::preflight::{check_files, env, prepare};
use crate::service::ServeError;

#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// The YAML configuration file to check.
    pub config: String,
    /// Overrides, as `serve --set` (checked together with the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

pub(crate) fn run(a: ValidateArgs) -> ExitCode {
    let checked = Config::load_with(Some(&a.config), &a.set).map_err(ServeError::from).and_then(|cfg| {
        prepare(&cfg, &env)?;
        check_files(&cfg)
    });
    match checked {
        Ok(()) => {
            println!("{}: ok", a.config);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
