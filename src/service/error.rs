//! Why the service could not start, or stopped: [`ServeError`], the one error of the running
//! service (`serve`) and of the checks `validate` shares with it.

use crate::service::listeners::ListenError;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Bind(std::io::Error),
    /// A certificate or key that cannot be used; `0` is the key (`receivers.otlp.protocols.grpc.tls.cert_file`).
    #[error("{0}: {1}")]
    Tls(String, crate::config::tls::TlsError),
    #[error(transparent)]
    Metrics(#[from] crate::emit::metrics::MetricsError),
    #[error(transparent)]
    Export(#[from] crate::emit::otlp_traces::ExportError),
    #[error(transparent)]
    ExportTarget(#[from] crate::emit::otlp_target::TargetError),
    #[error("cannot open verdict log {0}: {1}")]
    VerdictLog(String, std::io::Error),
    #[error(transparent)]
    Lockfile(crate::config::lockfile::LockError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot open the state store at {0}: {1}")]
    Store(String, crate::state::StoreError),
    #[error("cannot open the evidence journal at {0}: {1}")]
    Journal(String, crate::state::journal::JournalError),
    /// A part of the running service (the engine, a listener, an exporter task) ended or stalled.
    #[error("a part of the service ended unexpectedly ({0}); verdicts can no longer be decided and sent")]
    PartEnded(String),
    /// The exporter would send into this service's own receiver.
    #[error("exporter: {0}")]
    ExportLoop(String),
}

impl From<ListenError> for ServeError {
    fn from(e: ListenError) -> Self {
        match e {
            ListenError::Bind(e) => ServeError::Bind(e),
            ListenError::Tls(k, e) => ServeError::Tls(k, e),
        }
    }
}
