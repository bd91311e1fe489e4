//! The verifier rules file (`mcp-health tap --verifiers FILE`): which tool calls are checked, how,
//! and when. Read once at start; a rule that cannot be compiled (an unknown key, a bad template,
//! an unset `${env:VAR}`) stops the tap with the rule's name, never a rule silently skipped.
//!
//! ```yaml
//! verifiers:
//!   - name: ticket_created          # the tool-name rule of the MCP specification
//!     tool: create_*                # exact or glob (`*`, `?`)
//!     server: tickets.internal      # optional: the upstream's host (server.address)
//!     delay: 200ms                  # before the first attempt
//!     attempts: 3                   # a `missing` or an error is tried again, with backoff
//!     backoff: 250ms                # doubled after each attempt
//!     timeout: 2s                   # per attempt
//!     http:
//!       url: "http://127.0.0.1:9000/records/{/result/structuredContent/id}"
//!       headers: {Authorization: "Bearer ${env:RECORDS_TOKEN}"}
//!       body_pointer: /title
//!       equals: "{/arguments/title}"
//! limits: {queue_size: 1024, concurrency: 8}
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::template::{Template, TemplateError, UrlTemplate};

/// Why the rules file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: serde_yaml_ng::Error },
    #[error("verifier {name:?}: {why}")]
    Rule { name: String, why: String },
    #[error("verifier {name:?}, {field}: {source}")]
    Template { name: String, field: &'static str, source: TemplateError },
}

/// The file: the rules and the runner's limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RulesFile {
    #[serde(default)]
    pub verifiers: Vec<RuleConfig>,
    #[serde(default)]
    pub limits: RunnerLimits,
}

/// How many checks wait and run at once. Past `queue_size` a call is not verified: it stays
/// `unverified` (reason `verifier_error`), counted as `queue_full`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerLimits {
    pub queue_size: usize,
    pub concurrency: usize,
}

impl Default for RunnerLimits {
    fn default() -> Self {
        RunnerLimits { queue_size: 1024, concurrency: 8 }
    }
}

/// One rule as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleConfig {
    pub name: String,
    pub tool: String,
    #[serde(default)]
    pub server: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub delay: Option<Duration>,
    #[serde(default)]
    pub attempts: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub backoff: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub http: Option<HttpConfig>,
    #[serde(default)]
    pub file: Option<FileConfig>,
    #[serde(default)]
    pub command: Option<CommandConfig>,
    #[serde(default)]
    pub sql: Option<SqlConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpConfig {
    #[serde(default = "get")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Statuses that mean the effect is there (default: any 2xx).
    #[serde(default)]
    pub expect_status: Vec<u16>,
    /// Statuses that mean there is no effect (default: 404 and 410). Any other status is no
    /// finding (`bad_response`): a 500 or a 401 from the destination proves nothing either way.
    #[serde(default)]
    pub missing_status: Vec<u16>,
    #[serde(default)]
    pub body_pointer: Option<String>,
    #[serde(default)]
    pub equals: Option<String>,
    /// `https://` destinations: trust only the CAs in this PEM file (default: the system's roots).
    #[serde(default)]
    pub ca_file: Option<String>,
}

fn get() -> String {
    "GET".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    /// The file, relative to `base_dir` when it has holes (then `base_dir` is required).
    pub path: String,
    /// The directory the call may name files beneath: the path is resolved under it, no `..`, no
    /// symbolic link on the way, a regular file only.
    #[serde(default)]
    pub base_dir: Option<String>,
    /// Most bytes read to digest the file (default 256 MiB): past it the check is no finding.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub min_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommandConfig {
    pub argv: Vec<String>,
    /// Environment variables the child gets from the tap's environment (besides `PATH`): the
    /// child starts with an empty environment, so other rules' credentials never reach it.
    #[serde(default)]
    pub env: Vec<String>,
    /// The child's working directory (default: the tap's at start).
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SqlConfig {
    /// A SQLite database file (opened read-only).
    #[serde(default)]
    pub sqlite: Option<String>,
    /// A PostgreSQL connection string (`postgresql://…` or `host=… user=…`).
    #[serde(default)]
    pub postgres: Option<String>,
    /// One statement with `?` (SQLite) or `$1` (PostgreSQL) placeholders: values are bound,
    /// never written into the text.
    pub query: String,
    #[serde(default)]
    pub params: Vec<String>,
    /// The first column of the row must be at least this (a row version).
    #[serde(default)]
    pub min_version: Option<String>,
}

/// What a rule checks, compiled.
#[derive(Clone, Debug)]
pub enum Check {
    Http {
        method: hyper::Method,
        url: UrlTemplate,
        headers: Vec<(hyper::header::HeaderName, Template)>,
        expect_status: Vec<u16>,
        missing_status: Vec<u16>,
        body_pointer: Option<String>,
        equals: Option<Template>,
        /// A client of its own when the rule names a `ca_file`; else the pool's.
        client: Option<Box<super::client::HttpClient>>,
    },
    File {
        path: Template,
        /// The directory a path with holes is resolved beneath (canonical, at load).
        base_dir: Option<std::path::PathBuf>,
        sha256: Option<Template>,
        min_size: Option<u64>,
        max_bytes: u64,
    },
    Command {
        argv: Vec<Template>,
        /// `(name, value)` of the variables the child gets; `PATH` always.
        env: Vec<(String, String)>,
        cwd: std::path::PathBuf,
    },
    Sql {
        db: SqlDb,
        query: String,
        params: Vec<Template>,
        min_version: Option<Template>,
    },
}

#[derive(Clone, Debug)]
pub enum SqlDb {
    Sqlite(Template),
    Postgres(Template),
}

impl Check {
    /// The `mcp_health.outcome.method` of the finding.
    pub fn method(&self) -> &'static str {
        match self {
            Check::Http { .. } => "http_status",
            Check::File { .. } => "file_digest",
            Check::Command { .. } => "test_result",
            Check::Sql { .. } => "row_version",
        }
    }

    fn templates(&self) -> Vec<&Template> {
        match self {
            Check::Http { url, headers, equals, .. } => {
                std::iter::once(url.template()).chain(headers.iter().map(|(_, t)| t)).chain(equals).collect()
            }
            Check::File { path, sha256, .. } => std::iter::once(path).chain(sha256).collect(),
            Check::Command { argv, .. } => argv.iter().collect(),
            Check::Sql { db, params, min_version, .. } => {
                let d = match db {
                    SqlDb::Sqlite(t) | SqlDb::Postgres(t) => t,
                };
                std::iter::once(d).chain(params).chain(min_version).collect()
            }
        }
    }

    /// The JSON pointers every hole of the check reads (what a queued job keeps of a call).
    pub fn pointers(&self) -> Vec<String> {
        let mut out: Vec<String> = self.templates().iter().flat_map(|t| t.pointers().map(str::to_string)).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether the check needs the call's result (a lost response cannot be checked by it).
    pub fn reads_result(&self) -> bool {
        self.templates().iter().any(|t| t.reads_result())
    }
}

/// One compiled rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    tool: Glob,
    server: Option<String>,
    pub delay: Duration,
    pub attempts: u32,
    pub backoff: Duration,
    pub timeout: Duration,
    pub check: Check,
}

impl Rule {
    /// Whether the rule applies to a call of `tool` on `server` (the upstream's host).
    pub fn matches(&self, tool: &str, server: &str) -> bool {
        self.tool.matches(tool) && self.server.as_deref().is_none_or(|s| s.eq_ignore_ascii_case(server))
    }
}

/// The compiled rules and the runner's limits.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    pub limits: RunnerLimits,
}

impl RuleSet {
    /// The first rule that applies to the call, in file order.
    pub fn find(&self, tool: &str, server: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.matches(tool, server))
    }

    pub fn load(path: &Path) -> Result<Self, RulesError> {
        let text = std::fs::read_to_string(path).map_err(|source| RulesError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, path, &|k| std::env::var(k).ok())
    }

    pub fn parse(text: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, RulesError> {
        let perr = |source| RulesError::Parse { path: path.to_path_buf(), source };
        // A bare list of rules, or the full file (`verifiers:` and `limits:`).
        let file = if text.trim_start().starts_with('-') {
            RulesFile { verifiers: serde_yaml_ng::from_str(text).map_err(perr)?, limits: RunnerLimits::default() }
        } else {
            serde_yaml_ng::from_str(text).map_err(perr)?
        };
        if file.limits.concurrency == 0 {
            return Err(RulesError::Rule { name: "limits".into(), why: "concurrency must be at least 1".into() });
        }
        let mut rules = Vec::with_capacity(file.verifiers.len());
        for r in file.verifiers {
            if rules.iter().any(|x: &Rule| x.name == r.name) {
                return Err(RulesError::Rule { name: r.name, why: "two rules have this name".into() });
            }
            rules.push(compile(r, env)?);
        }
        Ok(RuleSet { rules, limits: file.limits })
    }
}

fn compile(r: RuleConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Rule, RulesError> {
    let c = Compiler { name: &r.name, env };
    // The name is emitted (span attribute, metric label): it must be one the MCP tool-name rule
    // allows, so it cannot carry a secret or an unbounded text.
    let name = &r.name;
    let valid_name = (1..=128).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if !valid_name {
        return Err(c.bad("a name is 1-128 of A-Z a-z 0-9 _ - .".into()));
    }
    if r.tool.is_empty() {
        return Err(c.bad("`tool` is empty".into()));
    }
    let kinds = [r.http.is_some(), r.file.is_some(), r.command.is_some(), r.sql.is_some()].iter().filter(|x| **x).count();
    if kinds != 1 {
        return Err(c.bad("give exactly one of http, file, command, sql".into()));
    }
    let check = match (r.http, r.file, r.command, r.sql) {
        (Some(h), ..) => c.http(h)?,
        (_, Some(f), ..) => c.file(f)?,
        (_, _, Some(cmd), _) => c.command(cmd)?,
        (.., Some(s)) => c.sql(s)?,
        (None, None, None, None) => return Err(c.bad("give exactly one of http, file, command, sql".into())),
    };
    // What the check expects is the operator's or the request's, never the result's: a server
    // that lies in its result would otherwise tell the verifier what to find.
    let expected: Vec<(&str, Option<&Template>)> = match &check {
        Check::Http { equals, .. } => vec![("http.equals", equals.as_ref())],
        Check::File { sha256, .. } => vec![("file.sha256", sha256.as_ref())],
        Check::Sql { min_version, .. } => vec![("sql.min_version", min_version.as_ref())],
        Check::Command { .. } => vec![],
    };
    for (field, t) in expected {
        if t.is_some_and(Template::reads_result) {
            return Err(c.bad(format!(
                "{field} reads /result: an expected value must come from the rule or the arguments, never from the result it checks"
            )));
        }
    }
    let attempts = r.attempts.unwrap_or(1);
    if !(1..=20).contains(&attempts) {
        return Err(c.bad("attempts is 1 to 20".into()));
    }
    Ok(Rule {
        tool: Glob::new(&r.tool),
        name: r.name,
        server: r.server,
        delay: r.delay.unwrap_or(Duration::ZERO),
        attempts,
        backoff: r.backoff.unwrap_or(Duration::from_millis(250)),
        timeout: r.timeout.unwrap_or(Duration::from_secs(5)),
        check,
    })
}

/// One rule being compiled: its errors carry its name, its templates read `${env:…}` from `env`.
/// One method per check kind, each the rules of that kind.
struct Compiler<'a> {
    name: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Compiler<'_> {
    fn bad(&self, why: String) -> RulesError {
        RulesError::Rule { name: self.name.to_string(), why }
    }

    fn t(&self, field: &'static str, src: &str) -> Result<Template, RulesError> {
        Template::parse(src, self.env).map_err(|source| RulesError::Template { name: self.name.to_string(), field, source })
    }

    fn http(&self, h: HttpConfig) -> Result<Check, RulesError> {
        let method = hyper::Method::from_bytes(h.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| self.bad("http.method is not a method".into()))?;
        let url = UrlTemplate::parse(&h.url, self.env).map_err(|source| RulesError::Template {
            name: self.name.to_string(),
            field: "http.url",
            source,
        })?;
        let mut headers = Vec::new();
        for (k, v) in &h.headers {
            let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| self.bad(format!("http.headers: {k:?} is not a header name")))?;
            headers.push((name, self.t("http.headers", v)?));
        }
        if h.equals.is_some() != h.body_pointer.is_some() {
            return Err(self.bad("http.body_pointer and http.equals go together".into()));
        }
        if let Some(p) = &h.body_pointer {
            if !p.is_empty() && !p.starts_with('/') {
                return Err(self.bad("http.body_pointer is a JSON pointer (starts with /)".into()));
            }
        }
        Ok(Check::Http {
            method,
            url,
            headers,
            expect_status: h.expect_status,
            missing_status: if h.missing_status.is_empty() { vec![404, 410] } else { h.missing_status },
            body_pointer: h.body_pointer,
            equals: h.equals.as_deref().map(|e| self.t("http.equals", e)).transpose()?,
            client: match &h.ca_file {
                Some(f) => Some(Box::new(super::client::http_client_trusting(f).map_err(|e| self.bad(format!("http.ca_file: {e}")))?)),
                None => None,
            },
        })
    }

    fn file(&self, f: FileConfig) -> Result<Check, RulesError> {
        let path = self.t("file.path", &f.path)?;
        let base_dir = match &f.base_dir {
            // Canonical when it exists (a directory made later is taken as written, if absolute).
            Some(d) => Some(std::fs::canonicalize(d).or_else(|e| {
                if Path::new(d).is_absolute() {
                    Ok(PathBuf::from(d))
                } else {
                    Err(self.bad(format!("file.base_dir: {}", e.kind())))
                }
            })?),
            None if path.has_holes() => {
                return Err(self.bad("file.path has holes: give file.base_dir, the directory the call may name files beneath".into()))
            }
            None => None,
        };
        Ok(Check::File {
            path,
            base_dir,
            sha256: f.sha256.as_deref().map(|s| self.t("file.sha256", s)).transpose()?,
            min_size: f.min_size,
            max_bytes: f.max_bytes.unwrap_or(256 << 20),
        })
    }

    fn command(&self, c: CommandConfig) -> Result<Check, RulesError> {
        if c.argv.is_empty() {
            return Err(self.bad("command.argv is empty".into()));
        }
        let argv: Vec<Template> = c.argv.iter().map(|a| self.t("command.argv", a)).collect::<Result<_, _>>()?;
        if argv[0].has_holes() {
            return Err(self.bad("command.argv[0], the program, must be written in the rule".into()));
        }
        let mut child_env = Vec::new();
        for k in std::iter::once("PATH").chain(c.env.iter().map(String::as_str)) {
            if let Some(v) = (self.env)(k) {
                child_env.push((k.to_string(), v));
            } else if k != "PATH" {
                return Err(self.bad(format!("command.env: {k} is not set")));
            }
        }
        let cwd = match &c.cwd {
            Some(d) => std::fs::canonicalize(d).map_err(|e| self.bad(format!("command.cwd: {}", e.kind())))?,
            None => std::env::current_dir().map_err(|e| self.bad(format!("the tap's working directory: {}", e.kind())))?,
        };
        Ok(Check::Command { argv, env: child_env, cwd })
    }

    fn sql(&self, s: SqlConfig) -> Result<Check, RulesError> {
        if !cfg!(feature = "sql") {
            return Err(self.bad(SQL_NOT_BUILT.into()));
        }
        let db = match (s.sqlite, s.postgres) {
            (Some(f), None) => SqlDb::Sqlite(self.t("sql.sqlite", &f)?),
            (None, Some(u)) => SqlDb::Postgres(self.t("sql.postgres", &u)?),
            _ => return Err(self.bad("give exactly one of sql.sqlite, sql.postgres".into())),
        };
        // Where the database is, is the operator's: a location the call could fill in could
        // point the check at a database the checked server made up.
        if matches!(&db, SqlDb::Sqlite(t) | SqlDb::Postgres(t) if t.has_holes()) {
            return Err(self.bad(
                "the database location (sql.sqlite, sql.postgres) may not have holes: it is the operator's, never the call's".into(),
            ));
        }
        if s.query.trim().is_empty() {
            return Err(self.bad("sql.query is empty".into()));
        }
        Ok(Check::Sql {
            db,
            query: s.query,
            params: s.params.iter().map(|p| self.t("sql.params", p)).collect::<Result<_, _>>()?,
            min_version: s.min_version.as_deref().map(|m| self.t("sql.min_version", m)).transpose()?,
        })
    }
}

/// Why an `sql` check is refused by a build without the `sql` feature (its drivers are not in it).
const SQL_NOT_BUILT: &str =
    "sql checks need the `sql` cargo feature, and this mcp-health was built without it (`--no-default-features`); build with `--features sql`";

/// A tool-name pattern: `*` any run of characters, `?` one character, anything else itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Glob(Vec<char>);

impl Glob {
    pub(crate) fn new(p: &str) -> Self {
        Glob(p.chars().collect())
    }

    pub(crate) fn matches(&self, s: &str) -> bool {
        let s: Vec<char> = s.chars().collect();
        let p = &self.0;
        // Iterative wildcard matching with one backtrack point (linear in practice).
        let (mut i, mut j, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
        while i < s.len() {
            if j < p.len() && (p[j] == '?' || p[j] == s[i]) {
                i += 1;
                j += 1;
            } else if j < p.len() && p[j] == '*' {
                star = Some(j);
                mark = i;
                j += 1;
            } else if let Some(st) = star {
                j = st + 1;
                mark += 1;
                i = mark;
            } else {
                return false;
            }
        }
        while j < p.len() && p[j] == '*' {
            j += 1;
        }
        j == p.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "TOKEN").then(|| "tok".to_string())
    }

    fn parse(y: &str) -> Result<RuleSet, RulesError> {
        RuleSet::parse(y, Path::new("v.yaml"), &env)
    }

    /// Without the `sql` feature an `sql` check is refused when the rules load, with the rule's
    /// name and the feature it needs; the other kinds still compile.
    #[cfg(not(feature = "sql"))]
    #[test]
    fn sql_checks_are_refused_by_a_build_without_the_sql_feature() {
        let e = parse("- {name: rows_v2, tool: insert, sql: {sqlite: /tmp/x.db, query: 'select 1'}}").unwrap_err().to_string();
        assert!(e.contains("\"rows_v2\"") && e.contains("the `sql` cargo feature") && e.contains("--features sql"), "{e}");
        assert_eq!(parse("- {name: x, tool: t, file: {path: /p}}").unwrap().rules.len(), 1);
    }

    #[test]
    fn globs_match_as_shells_do() {
        for (p, s, want) in [
            ("create_*", "create_ticket", true),
            ("create_*", "create_", true),
            ("create_*", "delete_ticket", false),
            ("*_ticket", "create_ticket", true),
            ("c?eate", "create", true),
            ("c?eate", "ceate", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*", "", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(Glob::new(p).matches(s), want, "{p} vs {s}");
        }
    }

    // Compiles `sql` checks: a build without the `sql` feature refuses them (tested below).
    #[cfg(feature = "sql")]
    #[test]
    fn a_file_compiles_with_each_kind_and_first_rule_wins() {
        let rs = parse(
            r#"
verifiers:
  - {name: a, tool: "create_*", server: tickets, http: {url: "http://h/{/result/structuredContent/id}", headers: {Authorization: "Bearer ${env:TOKEN}"}, body_pointer: /t, equals: "{/arguments/t}"}}
  - {name: b, tool: "*", file: {base_dir: /tmp, path: "{/arguments/name}", min_size: 1}}
  - {name: c, tool: run_tests, command: {argv: [test, -f, "{/arguments/p}"]}, timeout: 1s}
  - {name: d, tool: insert, sql: {sqlite: /tmp/x.db, query: "select v from t where id = ?", params: ["{/arguments/id}"], min_version: "{/arguments/v}"}}
limits: {queue_size: 4, concurrency: 2}
"#,
        )
        .unwrap();
        assert_eq!(rs.rules.len(), 4);
        assert_eq!(rs.limits, RunnerLimits { queue_size: 4, concurrency: 2 });
        assert_eq!(rs.find("create_ticket", "tickets"), Some(0));
        assert_eq!(rs.find("create_ticket", "elsewhere"), Some(1), "the server filter");
        assert!(rs.rules[0].check.reads_result());
        assert!(!rs.rules[2].check.reads_result());
        assert_eq!(rs.rules[3].check.method(), "row_version");
        // A bare list is a file too.
        assert_eq!(parse("- {name: x, tool: t, file: {path: /p}}").unwrap().rules.len(), 1);
    }

    // Compiles `sql` checks: a build without the `sql` feature refuses them (tested below).
    #[cfg(feature = "sql")]
    #[test]
    fn the_example_file_compiles() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/otel-config/verifiers.example.yaml")).unwrap();
        let rs = RuleSet::parse(&text, Path::new("example"), &|_| Some("x".into())).unwrap();
        let methods: Vec<&str> = rs.rules.iter().map(|r| r.check.method()).collect();
        assert_eq!(methods, ["http_status", "file_digest", "test_result", "row_version"]);
    }

    // Compiles `sql` checks: a build without the `sql` feature refuses them (tested below).
    #[cfg(feature = "sql")]
    #[test]
    fn bad_rules_stop_the_tap_with_their_name() {
        for (y, want) in [
            ("verifiers: [{name: 'has space', tool: t, file: {path: /p}}]", "a name is"),
            ("verifiers: [{name: x, tool: t}]", "exactly one of"),
            ("verifiers: [{name: x, tool: t, file: {path: /p}, command: {argv: [a]}}]", "exactly one of"),
            ("verifiers: [{name: x, tool: t, http: {url: 'http://h/${env:UNSET}'}}]", "UNSET is not set"),
            ("verifiers: [{name: x, tool: t, http: {url: 'http://h/{/nope}'}}]", "JSON pointer"),
            ("verifiers: [{name: x, tool: t, http: {url: 'http://h/', equals: a}}]", "go together"),
            ("verifiers: [{name: x, tool: t, file: {path: /p}, attempts: 0}]", "attempts"),
            ("verifiers: [{name: x, tool: t, file: {path: /p}}, {name: x, tool: u, file: {path: /q}}]", "two rules"),
            ("verifiers: [{name: x, tool: t, file: {path: /p}, colour: red}]", "unknown field"),
            ("verifiers: [{name: x, tool: t, sql: {query: 'select 1'}}]", "sql.sqlite"),
            // Issue 22: what a rule means is the operator's.
            ("verifiers: [{name: x, tool: t, http: {url: 'http://{/result/host}/x'}}]", "host"),
            ("verifiers: [{name: x, tool: t, http: {url: 'http://h{/result/x}'}}]", "host or port"),
            (
                "verifiers: [{name: x, tool: t, http: {url: 'http://h/x', body_pointer: /a, equals: '{/result/a}'}}]",
                "never from the result",
            ),
            ("verifiers: [{name: x, tool: t, file: {path: '/tmp/{/result/p}'}}]", "base_dir"),
            (
                "verifiers: [{name: x, tool: t, file: {base_dir: /tmp, path: '{/arguments/p}', sha256: '{/result/d}'}}]",
                "never from the result",
            ),
            ("verifiers: [{name: x, tool: t, sql: {sqlite: '{/result/db}', query: 'select 1'}}]", "may not have holes"),
            ("verifiers: [{name: x, tool: t, sql: {postgres: 'host=h dbname={/arguments/d}', query: 'select 1'}}]", "may not have holes"),
            (
                "verifiers: [{name: x, tool: t, sql: {sqlite: /tmp/x.db, query: 'select 1', min_version: '{/result/v}'}}]",
                "never from the result",
            ),
            ("verifiers: [{name: x, tool: t, command: {argv: ['{/arguments/prog}']}}]", "the program"),
            ("verifiers: [{name: x, tool: t, command: {argv: [git], env: [NOT_SET_ANYWHERE]}}]", "is not set"),
        ] {
            let e = parse(y).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want), "{y}: {e}");
        }
    }
}
