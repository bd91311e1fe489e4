//! The four check kinds, each through a real client library: hyper for `http`, the file system
//! and SHA-256 for `file`, a child process (no shell) for `command`, rusqlite and tokio-postgres
//! for `sql` (the `sql` cargo feature, on by default). A check returns a [`Finding`] or, when it could not decide, a [`VerifyError`]: an
//! unreachable destination, a timeout or a template that does not resolve is never `missing`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

use super::client::HttpClient;
use super::rules::{Check, SqlDb};
use super::template::{same, TemplateError};

/// What the destination says about the call's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The effect is there and the deliverable check passes.
    Confirmed,
    /// No effect.
    Missing,
    /// The effect is there and the deliverable check fails.
    Failed,
}

impl Finding {
    pub fn as_str(self) -> &'static str {
        match self {
            Finding::Confirmed => "confirmed",
            Finding::Missing => "missing",
            Finding::Failed => "failed",
        }
    }
}

/// Why a check could not decide. The class is emitted (`mcp_health.outcome.error`); the detail
/// never is — it may hold a URL, a path or a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the destination is unreachable")]
    Unreachable,
    #[error("the check timed out")]
    Timeout,
    #[error("a pointer resolves to nothing in the call")]
    PointerUnresolved,
    #[error("a template could not be filled")]
    TemplateError,
    #[error("the verifier queue is full")]
    QueueFull,
    #[error("the destination answered something that proves nothing either way")]
    BadResponse,
    #[error("the check failed to run")]
    Other,
}

impl VerifyError {
    pub fn as_str(self) -> &'static str {
        match self {
            VerifyError::Unreachable => "unreachable",
            VerifyError::Timeout => "timeout",
            VerifyError::PointerUnresolved => "pointer_unresolved",
            VerifyError::TemplateError => "template_error",
            VerifyError::QueueFull => "queue_full",
            VerifyError::BadResponse => "bad_response",
            VerifyError::Other => "other",
        }
    }
}

impl From<TemplateError> for VerifyError {
    fn from(e: TemplateError) -> Self {
        match e {
            TemplateError::Unresolved(_) => VerifyError::PointerUnresolved,
            _ => VerifyError::TemplateError,
        }
    }
}

/// Largest destination response body read for `body_pointer`.
const MAX_BODY: usize = 1 << 20;

/// Run one attempt of `check` against `call` (`{"arguments": …, "result": …}`).
pub(crate) async fn run(check: &Check, call: &Value, http: &HttpClient, timeout: Duration) -> Result<Finding, VerifyError> {
    match tokio::time::timeout(timeout, attempt(check, call, http, timeout)).await {
        Ok(r) => r,
        Err(_) => Err(VerifyError::Timeout),
    }
}

async fn attempt(check: &Check, call: &Value, http: &HttpClient, timeout: Duration) -> Result<Finding, VerifyError> {
    match check {
        Check::Http { method, url, headers, expect_status, missing_status, body_pointer, equals, client } => {
            let uri: hyper::Uri = url.render(call)?.parse().map_err(|_| VerifyError::TemplateError)?;
            let mut req = hyper::Request::new(Full::new(Bytes::new()));
            *req.method_mut() = method.clone();
            *req.uri_mut() = uri;
            for (k, v) in headers {
                let v = hyper::header::HeaderValue::from_str(&v.render(call)?).map_err(|_| VerifyError::TemplateError)?;
                req.headers_mut().append(k.clone(), v);
            }
            let expected = equals.as_ref().map(|e| e.value(call)).transpose()?;
            let client = client.as_deref().unwrap_or(http).0.as_ref().ok_or(VerifyError::Unreachable)?;
            let resp = client.request(req).await.map_err(|_| VerifyError::Unreachable)?;
            let status = resp.status().as_u16();
            let present = if expect_status.is_empty() { (200..300).contains(&status) } else { expect_status.contains(&status) };
            if !present {
                return if missing_status.contains(&status) { Ok(Finding::Missing) } else { Err(VerifyError::BadResponse) };
            }
            let (Some(ptr), Some(expected)) = (body_pointer, expected) else { return Ok(Finding::Confirmed) };
            let body = Limited::new(resp.into_body(), MAX_BODY).collect().await.map_err(|_| VerifyError::BadResponse)?.to_bytes();
            let doc: Value = serde_json::from_slice(&body).map_err(|_| VerifyError::BadResponse)?;
            Ok(match doc.pointer(ptr) {
                Some(found) if same(found, &expected) => Finding::Confirmed,
                _ => Finding::Failed,
            })
        }
        Check::File { path, base_dir, sha256, min_size, max_bytes } => {
            let rendered = path.render(call)?;
            let path = match base_dir {
                Some(base) => beneath(base, &rendered)?,
                None => std::path::PathBuf::from(rendered),
            };
            let want = sha256.as_ref().map(|t| t.render(call)).transpose()?;
            let (min, max) = (*min_size, *max_bytes);
            // The deadline is checked while reading: a file check never outlives its timeout.
            let deadline = std::time::Instant::now() + timeout;
            let strict = base_dir.is_some();
            tokio::task::spawn_blocking(move || file(&path, want.as_deref(), min, max, deadline, strict))
                .await
                .map_err(|_| VerifyError::Other)?
        }
        Check::Command { argv, env, cwd } => {
            let args = command_args(argv, call)?;
            let mut cmd = tokio::process::Command::new(&args[0]);
            cmd.args(&args[1..])
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .current_dir(cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true);
            // A process group of its own, killed as a group when the check ends or times out
            // (the caller's timeout drops this future, and with it the guard).
            #[cfg(unix)]
            cmd.process_group(0);
            let mut child = cmd.spawn().map_err(|_| VerifyError::Other)?;
            let _group = child.id().map(GroupGuard);
            let status = child.wait().await.map_err(|_| VerifyError::Other)?;
            Ok(if status.success() { Finding::Confirmed } else { Finding::Failed })
        }
        Check::Sql { db, query, params, min_version } => sql(db, query, params, min_version.as_ref(), call, timeout).await,
    }
}

/// An `sql` check: the first column of the first row (missing when there is none), compared with
/// `min_version` when the rule gives one.
#[cfg(feature = "sql")]
async fn sql(
    db: &SqlDb,
    query: &str,
    params: &[super::template::Template],
    min_version: Option<&super::template::Template>,
    call: &Value,
    timeout: Duration,
) -> Result<Finding, VerifyError> {
    let params: Vec<String> = params.iter().map(|p| p.render(call)).collect::<Result<_, _>>()?;
    let min = min_version.map(|m| m.render(call)).transpose()?;
    let row = match db {
        SqlDb::Sqlite(file) => {
            let file = file.render(call)?;
            let query = query.to_string();
            tokio::task::spawn_blocking(move || sqlite_first(&file, &query, &params, timeout)).await.map_err(|_| VerifyError::Other)??
        }
        SqlDb::Postgres(url) => postgres_first(&url.render(call)?, query, &params, timeout).await?,
    };
    Ok(match (row, min) {
        (None, _) => Finding::Missing,
        (Some(_), None) => Finding::Confirmed,
        (Some(v), Some(min)) => {
            if at_least(&v, &min) {
                Finding::Confirmed
            } else {
                Finding::Failed
            }
        }
    })
}

/// A build without the `sql` feature has no drivers; its rules refuse an `sql` check when they
/// load (`rules::SQL_NOT_BUILT`), so no such check ever runs. Should one come, it decides nothing.
#[cfg(not(feature = "sql"))]
async fn sql(
    _db: &SqlDb,
    _query: &str,
    _params: &[super::template::Template],
    _min_version: Option<&super::template::Template>,
    _call: &Value,
    _timeout: Duration,
) -> Result<Finding, VerifyError> {
    Err(VerifyError::Other)
}

/// The arguments of a command check. A value from the call that starts with `-` could be read as
/// an option (`git diff --output=FILE`): refused, unless a literal `--` comes before it.
fn command_args(argv: &[super::template::Template], call: &Value) -> Result<Vec<String>, VerifyError> {
    let mut out = Vec::with_capacity(argv.len());
    let mut options_ended = false;
    for t in argv {
        let a = t.render(call)?;
        if t.has_holes() && !options_ended && a.starts_with('-') {
            return Err(TemplateError::Refused("a value from the call starts with `-`: write `--` before it in argv").into());
        }
        if !t.has_holes() && a == "--" {
            options_ended = true;
        }
        out.push(a);
    }
    Ok(out)
}

/// Kills a command check's process group when dropped (the check ended, or timed out).
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: killpg takes plain integers; the group is the child's own (process_group(0)).
        unsafe {
            let _ = libc::killpg(self.0 as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// `rel` resolved beneath `base`: relative, no `..`, and no symbolic link on the way (each
/// component is looked at, not followed). A path the call chose that would leave `base` is
/// refused, never read.
fn beneath(base: &std::path::Path, rel: &str) -> Result<std::path::PathBuf, VerifyError> {
    use std::path::Component;
    let rel = std::path::Path::new(rel);
    let mut path = base.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(x) => path.push(x),
            Component::CurDir => {}
            _ => return Err(TemplateError::Refused("a file path from the call must stay beneath base_dir").into()),
        }
    }
    if path == base {
        return Err(TemplateError::Refused("a file path from the call names no file").into());
    }
    Ok(path)
}

fn file(
    path: &std::path::Path,
    sha256: Option<&str>,
    min_size: Option<u64>,
    max_bytes: u64,
    deadline: std::time::Instant,
    strict: bool,
) -> Result<Finding, VerifyError> {
    use sha2::Digest;
    use std::io::Read;
    if strict {
        // Beneath base_dir: no symbolic link anywhere on the way (a link the server planted could
        // point the check at any file the tap can read).
        let mut at = std::path::PathBuf::new();
        for c in path.components() {
            at.push(c);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => return Ok(Finding::Failed),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Finding::Missing),
                Err(_) => return Err(VerifyError::Other),
            }
        }
    }
    let meta =
        match std::fs::symlink_metadata(path)
            .and_then(|m| if m.file_type().is_symlink() && !strict { std::fs::metadata(path) } else { Ok(m) })
        {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Finding::Missing),
            Err(_) => return Err(VerifyError::Other),
        };
    if strict && !meta.is_file() {
        return Ok(Finding::Failed);
    }
    if min_size.is_some_and(|m| meta.len() < m) {
        return Ok(Finding::Failed);
    }
    let Some(want) = sha256 else { return Ok(Finding::Confirmed) };
    if !meta.is_file() {
        return Ok(Finding::Failed);
    }
    if meta.len() > max_bytes {
        return Err(VerifyError::BadResponse);
    }
    let mut f = std::fs::File::open(path).map_err(|_| VerifyError::Other)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    loop {
        if std::time::Instant::now() > deadline {
            return Err(VerifyError::Timeout);
        }
        let n = f.read(&mut buf).map_err(|_| VerifyError::Other)?;
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > max_bytes {
            return Err(VerifyError::BadResponse);
        }
        h.update(&buf[..n]);
    }
    let got = hex::encode(h.finalize());
    let want = want.trim().trim_start_matches("sha256:");
    Ok(if got.eq_ignore_ascii_case(want) { Finding::Confirmed } else { Finding::Failed })
}

/// A value read from a row: a number or text.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    Int(i64),
    Real(f64),
    Text(String),
    Null,
}

/// Whether a row version is at least `min`: numerically when both are numbers, else as text.
pub(crate) fn at_least(v: &Cell, min: &str) -> bool {
    let m = min.trim();
    match v {
        Cell::Int(i) => m.parse::<i64>().map(|x| *i >= x).or_else(|_| m.parse::<f64>().map(|x| *i as f64 >= x)).unwrap_or(false),
        Cell::Real(r) => m.parse::<f64>().is_ok_and(|x| *r >= x),
        Cell::Text(t) => match (t.trim().parse::<f64>(), m.parse::<f64>()) {
            (Ok(a), Ok(b)) => a >= b,
            _ => t.as_str() >= m,
        },
        Cell::Null => false,
    }
}

#[cfg(feature = "sql")]
fn sqlite_first(file: &str, query: &str, params: &[String], timeout: Duration) -> Result<Option<Cell>, VerifyError> {
    use rusqlite::types::ValueRef;
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if !std::path::Path::new(file).exists() {
        // SQLite would report "unable to open": the database is not there to ask.
        return Err(VerifyError::Unreachable);
    }
    let conn = rusqlite::Connection::open_with_flags(file, flags).map_err(|_| VerifyError::Unreachable)?;
    let _ = conn.busy_timeout(timeout);
    // Interrupted at the deadline: a slow query never outlives its check.
    let deadline = std::time::Instant::now() + timeout;
    conn.progress_handler(1000, Some(move || std::time::Instant::now() > deadline));
    let mut stmt = conn.prepare(query).map_err(|_| VerifyError::Other)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(params.iter())).map_err(|_| VerifyError::Other)?;
    let Some(row) = rows.next().map_err(|_| VerifyError::Other)? else { return Ok(None) };
    let cell = match row.get_ref(0) {
        Ok(ValueRef::Integer(i)) => Cell::Int(i),
        Ok(ValueRef::Real(r)) => Cell::Real(r),
        Ok(ValueRef::Text(t)) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
        Ok(ValueRef::Null) => Cell::Null,
        Ok(ValueRef::Blob(_)) | Err(_) => Cell::Null,
    };
    Ok(Some(cell))
}

#[cfg(feature = "sql")]
async fn postgres_first(url: &str, query: &str, params: &[String], timeout: Duration) -> Result<Option<Cell>, VerifyError> {
    use tokio_postgres::types::{ToSql, Type};
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.map_err(|_| VerifyError::Unreachable)?;
    let conn = tokio::spawn(conn);
    let result = async {
        // The server ends the statement at the check's deadline, whatever happens to this side.
        client.batch_execute(&format!("SET statement_timeout = {}", timeout.as_millis().max(1))).await.map_err(|_| VerifyError::Other)?;
        let stmt = client.prepare(query).await.map_err(|_| VerifyError::Other)?;
        // Each value is bound with the type the server inferred for its placeholder.
        let mut bound: Vec<Box<dyn ToSql + Sync + Send>> = Vec::with_capacity(params.len());
        for (ty, v) in stmt.params().iter().zip(params) {
            let b: Box<dyn ToSql + Sync + Send> = match *ty {
                Type::INT2 => Box::new(v.trim().parse::<i16>().map_err(|_| VerifyError::TemplateError)?),
                Type::INT4 => Box::new(v.trim().parse::<i32>().map_err(|_| VerifyError::TemplateError)?),
                Type::INT8 => Box::new(v.trim().parse::<i64>().map_err(|_| VerifyError::TemplateError)?),
                Type::FLOAT4 => Box::new(v.trim().parse::<f32>().map_err(|_| VerifyError::TemplateError)?),
                Type::FLOAT8 => Box::new(v.trim().parse::<f64>().map_err(|_| VerifyError::TemplateError)?),
                Type::BOOL => Box::new(v.trim().parse::<bool>().map_err(|_| VerifyError::TemplateError)?),
                _ => Box::new(v.clone()),
            };
            bound.push(b);
        }
        if bound.len() != stmt.params().len() {
            return Err(VerifyError::TemplateError);
        }
        let refs: Vec<&(dyn ToSql + Sync)> = bound.iter().map(|b| b.as_ref() as &(dyn ToSql + Sync)).collect();
        let row = client.query_opt(&stmt, &refs).await.map_err(|_| VerifyError::Other)?;
        Ok(row.map(|r| {
            let col = r.columns().first().map(|c| c.type_().clone());
            match col {
                Some(Type::INT2) => r.try_get::<_, Option<i16>>(0).ok().flatten().map_or(Cell::Null, |v| Cell::Int(v.into())),
                Some(Type::INT4) => r.try_get::<_, Option<i32>>(0).ok().flatten().map_or(Cell::Null, |v| Cell::Int(v.into())),
                Some(Type::INT8) => r.try_get::<_, Option<i64>>(0).ok().flatten().map_or(Cell::Null, Cell::Int),
                Some(Type::FLOAT4) => r.try_get::<_, Option<f32>>(0).ok().flatten().map_or(Cell::Null, |v| Cell::Real(v.into())),
                Some(Type::FLOAT8) => r.try_get::<_, Option<f64>>(0).ok().flatten().map_or(Cell::Null, Cell::Real),
                Some(_) => r.try_get::<_, Option<String>>(0).ok().flatten().map_or(Cell::Null, Cell::Text),
                None => Cell::Null,
            }
        }))
    }
    .await;
    drop(client);
    conn.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_versions_compare_as_numbers_or_text() {
        assert!(at_least(&Cell::Int(5), "5"));
        assert!(at_least(&Cell::Int(5), "4.5"));
        assert!(!at_least(&Cell::Int(5), "6"));
        assert!(at_least(&Cell::Text("10".into()), "9"), "numbers in text compare as numbers");
        assert!(at_least(&Cell::Text("b".into()), "a"));
        assert!(!at_least(&Cell::Null, "0"));
    }
}
