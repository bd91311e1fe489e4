//! A scripted MCP client over stdio for the tap's end-to-end tests: writes each line, waits for
//! what the step names, closes stdin at the end, and returns everything the server (or the tap)
//! wrote.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One client line, and the request id whose response to wait for before the next line.
pub struct Step {
    pub line: Value,
    pub wait_for: Wait,
}

/// What to read before the next line is written.
pub enum Wait {
    Nothing,
    /// The response (result or error) to this request id.
    Response(Value),
    /// A server message with this method (a notification).
    Notification(&'static str),
}

pub fn req(id: i64, method: &str, params: Value) -> Step {
    Step { line: json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}), wait_for: Wait::Response(json!(id)) }
}

pub struct StdioRun {
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub code: Option<i32>,
}

/// Run `cmd` as an MCP client would: write each line, wait for its response, close stdin at the
/// end, collect everything.
pub fn drive_stdio(mut cmd: Command, script: &[Step]) -> StdioRun {
    let mut child: Child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut out = Vec::new();
    for step in script {
        stdin.write_all(format!("{}\n", step.line).as_bytes()).expect("write to the server");
        stdin.flush().unwrap();
        if matches!(step.wait_for, Wait::Nothing) {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("nothing for {} (output so far: {})", step.line, String::from_utf8_lossy(&out)));
            out.extend_from_slice(&line);
            let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
            let done = match &step.wait_for {
                Wait::Response(want) => v.get("id") == Some(want) && (v.get("result").is_some() || v.get("error").is_some()),
                Wait::Notification(m) => v.get("method").and_then(Value::as_str) == Some(m) && v.get("id").is_none(),
                Wait::Nothing => true,
            };
            if done {
                break;
            }
        }
    }
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the server did not exit after EOF");
        std::thread::sleep(Duration::from_millis(10));
    };
    reader.join().unwrap();
    while let Ok(line) = rx.try_recv() {
        out.extend_from_slice(&line);
    }
    StdioRun { stdout: out, stderr: err_reader.join().unwrap(), code: status.code() }
}
