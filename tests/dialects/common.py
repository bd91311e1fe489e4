"""Shared pieces of the dialect scenarios: OpenTelemetry set-up, the tools every server offers,
the tokens of the bearer-auth scenarios, and small process helpers.

Every process exports its spans over OTLP/gRPC to `MCP_DIALECT_OTLP` (e.g. http://127.0.0.1:4317),
as the instrumentation's users would: an SDK tracer provider with a batch processor, flushed at
exit. Nothing here reads or prints tool arguments, results or tokens beyond what the scenarios
themselves need to run.
"""

import atexit
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The catalog: six tools, listed three to a page, so a full traversal is two pages. `mutate` adds
# `extra` and signals the change; the re-list then has seven tools (three pages).
TOOLS = ["echo", "fails", "explodes", "slow", "mutate", "noop"]
EXTRA_TOOL = "extra"
PAGE_SIZE = 3
REQUIRED_SCOPE = "tools:call"
GOOD_TOKEN = "tok-good-0123456789"
NOSCOPE_TOKEN = "tok-noscope-0123456789"
# The 401 case: a token the server does not know.
BAD_TOKEN = "tok-bad-0123456789"


def tool_description(name):
    return f"scenario tool {name}"


def tool_schema(name):
    if name == "echo":
        return {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return {"type": "object", "properties": {}}


def setup_tracing(service_name, provider_hook=None, schedule_delay_millis=200):
    """A tracer provider exporting to MCP_DIALECT_OTLP; installed globally. Returns it.
    `schedule_delay_millis` is the batch processor's export interval."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    endpoint = os.environ["MCP_DIALECT_OTLP"]
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True), schedule_delay_millis=schedule_delay_millis))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)
    return provider


def otlp_span_processor():
    """A batch processor exporting to MCP_DIALECT_OTLP (for SDKs that build their own provider)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["MCP_DIALECT_OTLP"], insecure=True), schedule_delay_millis=200)


def http_tracing():
    """Whether the HTTP server is wrapped in OpenTelemetry's ASGI middleware (`POST /mcp` spans)."""
    return os.environ.get("MCP_DIALECT_HTTP_TRACING") == "1"


def wrap_asgi(app):
    """The ASGI app, wrapped in HTTP server tracing when asked for."""
    if not http_tracing():
        return app
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(app)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout}s")


def start_http_server(script, port, extra_env=None):
    """Start `python SCRIPT server http PORT` and wait until it listens."""
    env = dict(os.environ)
    env.update(extra_env or {})
    proc = subprocess.Popen([sys.executable, script, "server", "http", str(port)], env=env, stdin=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc


def stop_server(proc):
    """SIGTERM (uvicorn shuts down and the provider flushes at exit), then wait."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
