//! Receive: OTLP/gRPC and OTLP/HTTP in, admitted evidence batches out.

pub mod admit;
pub mod listen;
pub mod otlp_grpc;
pub mod otlp_http;
pub mod otlp_json;
pub mod throttle;
