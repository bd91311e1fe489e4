//! `mcp-health serve`.
use std::process::ExitCode;
use clap::Args;
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// YAML configuration; the embedded default when absent.
    #[arg(long, short)]
    pub config: Option<String>,
}
pub fn run(_a: ServeArgs) -> ExitCode { ExitCode::SUCCESS }
