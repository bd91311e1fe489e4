"""A tiny OTLP/gRPC trace receiver that appends every request as one OTLP/JSON line to a file.

A development tool: it is how the span shapes of each instrumentation were captured (the lines are
what `mcp-health replay` reads). Usage: otlp_dump.py PORT OUT.jsonl
"""

import base64
import json
import sys
from concurrent import futures

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Svc(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, path):
        self.path = path

    def Export(self, request, context):
        d = MessageToDict(request)
        # OTLP/JSON writes ids as hex, where protobuf's JSON mapping uses base64.
        for rs in d.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if s.get(k):
                            s[k] = base64.b64decode(s[k]).hex()
        with open(self.path, "a") as f:
            f.write(json.dumps(d) + "\n")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Svc(path), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
