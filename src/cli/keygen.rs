//! `mcp-health keygen`: a receipt-signing key (see `evidence::receipt`). The private part goes to
//! a file only its owner can read; the public part is printed, for the service's
//! `processors.mcp_health.receipts.trusted_keys`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::evidence::receipt::SigningKey;

#[derive(clap::Args, Debug)]
pub(crate) struct KeygenArgs {
    /// Where the signing key goes (created, never overwritten; mode 0600). Give it to the tap's
    /// `--signing-key` or to the agent code that signs receipts.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

pub(crate) fn run(a: KeygenArgs) -> ExitCode {
    let (text, key) = match SigningKey::generate() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("mcp-health keygen: {e}");
            return ExitCode::from(1);
        }
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let written = opts.open(&a.out).and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("mcp-health keygen: cannot write {}: {}", a.out.display(), e.kind());
        return ExitCode::from(2);
    }
    println!("{}", key.public());
    eprintln!(
        "mcp-health keygen: signing key {} written to {}; trust the public key above in processors.mcp_health.receipts.trusted_keys",
        key.id(),
        a.out.display()
    );
    ExitCode::SUCCESS
}
