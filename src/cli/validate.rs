//! `mcp-health validate CONFIG`: parse and check a configuration without starting anything.

use std::process::ExitCode;

use clap::Args;

use crate::config::Config;

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The YAML configuration file to check.
    pub config: String,
    /// Overrides, as `serve --set` (checked together with the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

pub fn run(a: ValidateArgs) -> ExitCode {
    match Config::load_with(Some(&a.config), &a.set) {
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
