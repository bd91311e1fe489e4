//! Receive: OTLP/gRPC and OTLP/HTTP in, admitted batches out.

pub mod otlp_json;
