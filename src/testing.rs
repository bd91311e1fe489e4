//! The crate's insides that its own benches and integration tests reach, under the paths they
//! have inside the crate (`testing::correlate::ChainLimits` is `crate::correlate::ChainLimits`).
//!
//! Not part of what the library offers: these names change with the code behind them, without
//! notice. They are here because a `tests/` or `benches/` file is compiled as a crate of its own
//! and can only see what is `pub`.

/// Eviction counters of the bounded maps.
pub mod bounded {
    pub use crate::bounded::{evicted, evictions};
}

/// The classifier's pure functions.
pub mod classify {
    pub use crate::classify::{classify_call, Decision, SessionContext};

    pub mod digest {
        pub use crate::classify::digest::{registry_digest, tool_digest, ToolDigest, PROJECTION_VERSION};
    }

    pub mod incidents {
        pub use crate::classify::incidents::{IncidentState, Transition};
    }
}

/// The TLS helpers the listeners and the exporters share.
pub mod config {
    pub mod tls {
        pub use crate::config::tls::{provider, read_certificates};
    }
}

/// `replay` as the command line runs it.
pub mod cli {
    pub mod replay {
        pub use crate::cli::replay::{engine_config, replay_files, replay_until, Summary};
    }
}

/// Chains and sessions, and their limits.
pub mod correlate {
    pub use crate::correlate::{ChainLimits, Chains, DecidedCalls, SessionLimits, Sessions};
}

/// Metrics and their Prometheus names.
pub mod emit {
    pub mod metrics {
        pub use crate::emit::metrics::{MetricsPipeline, MetricsSettings};
    }

    pub mod prometheus {
        pub use crate::emit::prometheus::{names, render, sanitize_name};
    }
}

/// The gate's gRPC messages and client.
pub mod gate {
    pub mod service {
        pub use crate::gate::service::pb;
    }
}

/// Synthetic load.
pub mod loadgen {
    pub use crate::loadgen::{build_mixed_request, build_request, encode, run, run_with, stamp, EncodedBatch, LoadReport, SendOptions};
}

/// The interner of identifiers.
pub mod normalize {
    pub mod intern {
        pub use crate::normalize::intern::{intern, Kind};
    }
}

/// OTLP/JSON decoding.
pub mod receive {
    pub mod otlp_json {
        pub use crate::receive::otlp_json::decode_traces;
    }
}

/// The shared store.
pub mod state {
    pub use crate::state::{MemoryStore, RedisSettings, SharedMemory, StoreHandle};

    pub mod format {
        pub use crate::state::format::MAGIC;
    }

    pub mod redis {
        pub use crate::state::redis::RedisSettings;
    }
}

/// The tap: ids, the exporter and the verifiers.
pub mod tap {
    pub use crate::tap::{new_span_id, new_trace_id};

    pub mod export {
        pub use crate::tap::export::{spawn, ExportSettings};
    }

    pub mod verify {
        pub use crate::tap::verify::{verify, VerifierPool, VerifyJob};

        pub mod check {
            pub use crate::tap::verify::check::{Finding, VerifyError};
        }

        pub mod client {
            pub use crate::tap::verify::client::http_client;
        }

        pub mod rules {
            pub use crate::tap::verify::rules::RuleSet;
        }
    }
}

/// The instruments the service describes itself with.
pub mod telemetry {
    pub mod instruments {
        pub use crate::telemetry::instruments::{Kind, ALL};
    }
}
