//! `storage:`, the store's configuration: which store keeps the cross-trace state and its
//! bounds. Declared beside the stores it chooses among; `config` assembles it into the tree.

use std::time::Duration;

use serde::Deserialize;

/// `storage:` — where the cross-trace state is kept: `{directory: …}` (or `{kind: embedded,
/// directory: …}`) for the embedded redb file, `{kind: redis, endpoint: redis://…}` for a store
/// shared by several instances (`state::redis`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(try_from = "StorageKeys")]
pub enum Storage {
    /// A directory the service may write; the store is `state.redb` in it (created if missing),
    /// the evidence journal `journal/` (at most `journal_max_bytes`).
    Embedded { directory: std::path::PathBuf, journal_max_bytes: u64 },
    Redis {
        /// `redis://[user:password@]host:port[/db]`; shown only redacted.
        endpoint: Secret,
        /// Bound of each connect, read and write to Redis.
        timeout: Duration,
        /// After a failure, how long the store answers errors at once before it tries again.
        retry_after: Duration,
        /// How long a deleted record's tombstone stays, so another instance cannot write it back.
        tombstone_ttl: Duration,
        /// The state protocol this instance speaks on the shared store (`None`: this build's).
        /// 0 while a 0.1.0 instance shares the store (it announces nothing; see
        /// docs/multi-instance.md, "Versions").
        state_protocol: Option<u32>,
    },
}

/// A string that may hold a secret (a password in a URL): its `Debug` shows it redacted, so a
/// configuration printed for a failed test or a log line never carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", crate::state::redis::redact(&self.0))
    }
}

/// `storage:` as written; [`Storage`] is what it must mean.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StorageKeys {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    directory: Option<std::path::PathBuf>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    retry_after: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    tombstone_ttl: Option<Duration>,
    #[serde(default)]
    state_protocol: Option<u32>,
    #[serde(default)]
    journal_max_bytes: Option<u64>,
}

/// The evidence journal's bound unless `storage.journal_max_bytes` says otherwise: a flood's
/// worth of calls in flight (`max_wait` of evidence at a few thousand spans a second).
pub const JOURNAL_MAX_BYTES: u64 = 256 << 20;

impl TryFrom<StorageKeys> for Storage {
    type Error = String;

    fn try_from(k: StorageKeys) -> Result<Self, String> {
        match k.kind.as_deref() {
            None | Some("embedded") => {
                if k.endpoint.is_some()
                    || k.timeout.is_some()
                    || k.retry_after.is_some()
                    || k.tombstone_ttl.is_some()
                    || k.state_protocol.is_some()
                {
                    return Err("endpoint, timeout, retry_after, tombstone_ttl and state_protocol need kind: redis".into());
                }
                let directory = k.directory.ok_or("storage needs directory (embedded) or kind: redis with an endpoint")?;
                let journal_max_bytes = k.journal_max_bytes.unwrap_or(JOURNAL_MAX_BYTES);
                if journal_max_bytes < 1 << 20 {
                    return Err("journal_max_bytes must be at least 1048576 (1 MiB)".into());
                }
                Ok(Storage::Embedded { directory, journal_max_bytes })
            }
            Some("redis") => {
                if k.journal_max_bytes.is_some() {
                    return Err("journal_max_bytes is for the embedded store (directory), not kind: redis".into());
                }
                if k.directory.is_some() {
                    return Err("directory is for the embedded store, not kind: redis".into());
                }
                let endpoint = k.endpoint.ok_or("kind: redis needs an endpoint (redis://host:port)")?;
                if let Some(p) = k.state_protocol.filter(|p| *p > crate::state::format::PROTOCOL) {
                    return Err(format!("state_protocol {p} is newer than this build speaks (0 to {})", crate::state::format::PROTOCOL));
                }
                Ok(Storage::Redis {
                    endpoint: Secret(endpoint),
                    timeout: k.timeout.unwrap_or(Duration::from_secs(1)),
                    retry_after: k.retry_after.unwrap_or(Duration::from_secs(1)),
                    tombstone_ttl: k.tombstone_ttl.unwrap_or(Duration::from_secs(3600)),
                    state_protocol: k.state_protocol,
                })
            }
            Some(other) => Err(format!("unknown storage kind {other:?} (embedded or redis)")),
        }
    }
}

impl Storage {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`storage`).
    pub fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((format!("{key_prefix}{key}"), why.to_string()));
        match self {
            Storage::Embedded { directory, .. } if directory.as_os_str().is_empty() => bad(".directory", "must be a directory path"),
            Storage::Redis { endpoint, timeout, retry_after, tombstone_ttl, .. } => {
                if !endpoint.0.starts_with("redis://") && !endpoint.0.starts_with("redis+unix://") && !endpoint.0.starts_with("unix://") {
                    return bad(".endpoint", "must be a redis://host:port URL (or redis+unix:// for a socket)");
                }
                if timeout.is_zero() || retry_after.is_zero() || tombstone_ttl.as_millis() == 0 {
                    return bad("", "timeout, retry_after and tombstone_ttl must be greater than zero (tombstone_ttl at least 1ms)");
                }
                Ok(())
            }
            Storage::Embedded { .. } => Ok(()),
        }
    }
}
