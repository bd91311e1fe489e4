//! The gRPC gate service (proto/mcp_health/v1/gate.proto). Filled in by the gate implementation.
