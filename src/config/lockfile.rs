//! Reading and writing the lockfile of pinned tool contracts (`mcp-health lock`, `verify`, the
//! service's `processors.mcp_health.lockfile`, `replay --lockfile`).

use crate::classify::pinning::Lockfile;

/// Why a lockfile could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot read lockfile {0}: {1}")]
    Read(String, std::io::Error),
    #[error("lockfile {0}: {1}")]
    Invalid(String, crate::classify::pinning::LockfileError),
    #[error("cannot write lockfile {0}: {1}")]
    Write(String, std::io::Error),
}

pub fn load_lockfile(path: &str) -> Result<Lockfile, LockError> {
    let text = std::fs::read_to_string(path).map_err(|e| LockError::Read(path.into(), e))?;
    Lockfile::parse(&text).map_err(|e| LockError::Invalid(path.into(), e))
}

pub fn save_lockfile(l: &Lockfile, path: &str) -> Result<(), LockError> {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, l.to_pretty()).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| LockError::Write(path.into(), e))
}
