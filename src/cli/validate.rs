//! `mcp-health validate CONFIG`: parse and check a configuration without starting anything.

use std::process::ExitCode;

use clap::Args;

use crate::config::Config;

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The YAML configuration file to check.
    pub config: String,
}

pub fn run(a: ValidateArgs) -> ExitCode {
    match Config::load(Some(&a.config)) {
        Ok(_) => {
            println!("{}: ok", a.config);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
