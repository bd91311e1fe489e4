//! `mcp-health health [--endpoint A]`: ask a running service's health check, exit 0 when it
//! answers 200 and 1 otherwise — the container's `HEALTHCHECK`, with no curl in the image.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct HealthArgs {
    /// The health check's `host:port` (`extensions.health_check.endpoint`).
    #[arg(long, default_value = "127.0.0.1:13133")]
    pub endpoint: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// The HTTP status the health check answered, if it answered.
pub(crate) fn status(endpoint: &str, timeout: Duration) -> std::io::Result<u16> {
    let addr = endpoint
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{endpoint} resolves to no address")))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(format!("GET / HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").as_bytes())?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head)?;
    let line = std::str::from_utf8(&head[..n]).unwrap_or("");
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer"))
}

pub(crate) fn run(a: HealthArgs) -> ExitCode {
    match status(&a.endpoint, a.timeout) {
        Ok(200) => {
            println!("{}: available", a.endpoint);
            ExitCode::SUCCESS
        }
        Ok(code) => {
            eprintln!("{}: answered {code}", a.endpoint);
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("{}: {e}", a.endpoint);
            ExitCode::from(1)
        }
    }
}
