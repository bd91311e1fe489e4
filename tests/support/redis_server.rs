//! A Debian `redis-server` of the test's own, on a loopback port in a temporary directory (never
//! the system service). Killed when dropped.
//!
//! Without `redis-server` on PATH the caller skips and says so, except under `CI`, where
//! scripts/install-test-deps must have installed it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    persist: bool,
    password: Option<String>,
}

/// Whether `redis-server` can be run here; prints the skip (and fails under CI) when not.
pub fn available(test: &str) -> bool {
    let ok = Command::new("redis-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "Debian's redis-server is missing: run scripts/install-test-deps");
        println!("SKIPPED: {test} (Debian's redis-server is not installed; scripts/install-test-deps installs it)");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl RedisServer {
    /// A server with no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(false, None)
    }

    /// `persist`: append-only file fsync'd on every write, so a restart keeps every record.
    pub fn start_with(persist: bool, password: Option<&str>) -> RedisServer {
        let mut s = RedisServer {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            persist,
            password: password.map(str::to_string),
        };
        s.spawn();
        s
    }

    pub fn dir_path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The server's process id (for its CPU time), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `redis://127.0.0.1:port` (with the password, if any).
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port").arg(self.port.to_string()).arg("--bind").arg("127.0.0.1").arg("--dir").arg(self.dir.path());
        cmd.arg("--save").arg("");
        if self.persist {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(p) = &self.password {
            cmd.arg("--requirepass").arg(p);
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.child = Some(cmd.spawn().expect("start redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200))) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill the server (SIGKILL): what it had not written is lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A plain client connection (for looking at what the store wrote).
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection_with_timeout(Duration::from_secs(2)).unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
