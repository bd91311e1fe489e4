"""Receipts from your own code: tell mcp-health what a tool call really did.

Many outcomes only the agent can check (it knows what it asked for, and it can read the system of
record). After a tool call, check the destination and record the finding as a span in the call's
trace, with the plain OpenTelemetry API — no new package. mcp-health joins it to the call and
decides `healthy` (confirmed), `false_success` (missing or failed) or keeps `unverified`.

A receipt that comes after the call was decided revises the verdict (revision 1, `supersedes`).

`healthy` needs the call's answer shown too, not only its outcome. The `mcp` SDK's own client span
cannot show it (it ends the same way for an answered call and for one whose connection died), so
where the server's spans do not reach mcp-health, the agent wraps the call in a span of its own
that says it got the result (`tool_call` below: the OpenTelemetry MCP conventions' client span, no
error); the SDK's span under it is the same request.

Where the service trusts only signed receipts (`processors.mcp_health.receipts.trusted_keys`),
sign them: set MCP_HEALTH_SIGNING_KEY_FILE to a key file from `mcp-health keygen` and each receipt
carries an Ed25519 signature over the call it names and what it found (`sign_receipt` below; the
same message the tap's verifiers sign, see src/evidence/receipt.rs). Needs `cryptography`.

  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python receipt.py http://127.0.0.1:8000/mcp TOKEN [LATE_SECONDS]

127.0.0.1:4317 is a local `mcp-health serve`. Beside a collector, in either layout (fan-out, the
default: otel-config/collector.yaml; inline: otel-config/collector.inline.yaml), send to the
collector instead, as the application's other spans (127.0.0.1:14317 in docker-compose.yml).

Needs `mcp` (2.x, with its built-in OpenTelemetry tracing), `opentelemetry-sdk` and
`opentelemetry-exporter-otlp-proto-grpc`. CI runs it against tests/verify/seeds.py
(tests/e2e_verify.rs).
"""

import asyncio
import hashlib
import os
import sys
import time
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "receipt-example-agent"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("receipt-example")


def load_signing_key():
    """The key of MCP_HEALTH_SIGNING_KEY_FILE (`ed25519:<hex seed>`), or None."""
    path = os.environ.get("MCP_HEALTH_SIGNING_KEY_FILE")
    if not path:
        return None
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    with open(path) as f:
        seed = bytes.fromhex(f.read().strip().removeprefix("ed25519:"))
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return key, hashlib.sha256(public).hexdigest()[:16]


SIGNING_KEY = load_signing_key()


def sign_receipt(trace_id, call_span_id, request_id, tool, verifier, result, method, checked_at):
    """The signature attributes of a receipt: the message of mcp-health-receipt-v1, one field a
    line, signed with Ed25519."""
    key, key_id = SIGNING_KEY
    msg = f"mcp-health-receipt-v1\n{trace_id:032x}\n{call_span_id:016x}\n{request_id}\n{tool}\n{verifier}\n{result}\n{method}\n{checked_at}\n"
    return {"mcp_health.outcome.key_id": key_id, "mcp_health.outcome.signature": key.sign(msg.encode()).hex()}


@contextmanager
def tool_call(tool):
    """A CLIENT span around one `tools/call`, in the OpenTelemetry MCP conventions: it ends without
    an error once the result is back (an exception marks it failed), so it shows the answer."""
    attributes = {"mcp.method.name": "tools/call", "gen_ai.tool.name": tool, "gen_ai.operation.name": "execute_tool"}
    with tracer.start_as_current_span(f"tools/call {tool}", kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
        yield span


def record_receipt(result, method="receipt", request_id=None, parent=None):
    """One outcome receipt: `confirmed`, `missing` or `failed`, checked now.

    Without `parent` the receipt goes under the current span (the same trace as the call made
    inside it); with `parent` (a saved SpanContext) it joins that trace later."""
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    with tracer.start_as_current_span("verify destination", context=ctx, kind=trace.SpanKind.INTERNAL) as span:
        checked_at = time.time_ns()
        span.set_attribute("mcp_health.outcome.result", result)
        span.set_attribute("mcp_health.outcome.method", method)
        span.set_attribute("mcp_health.outcome.checked_at", checked_at)
        if request_id is not None:
            span.set_attribute("mcp_health.outcome.request_id", str(request_id))
        if SIGNING_KEY is not None:
            # Over the call this receipt names: its trace, and the span it hangs under.
            own = span.get_span_context()
            under = span.parent.span_id if span.parent else 0
            attrs = sign_receipt(own.trace_id, under, "" if request_id is None else str(request_id), "", "", result, method, checked_at)
            for k, v in attrs.items():
                span.set_attribute(k, v)


async def main(url, token, late_seconds):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            # 1. Check right after the call, in the same trace.
            with tracer.start_as_current_span("file a ticket"):
                with tool_call("create_ticket"):
                    r = await client.call_tool("create_ticket", {"title": "receipt example"})
                created = (r.structured_content or {}).get("status") == "created"
                # Here the agent would read the ticket back from its system of record.
                record_receipt("confirmed" if created else "missing")

            # 2. A check that takes longer than mcp-health waits: keep the trace context, record
            #    the receipt when the answer is known. The call is decided `unverified` first,
            #    then revised.
            with tracer.start_as_current_span("file another ticket") as outer:
                with tool_call("create_ticket"):
                    await client.call_tool("create_ticket", {"title": "receipt example, checked late"})
                saved = outer.get_span_context()
    provider.force_flush()
    await asyncio.sleep(late_seconds)
    record_receipt("confirmed", parent=saved)
    provider.force_flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 5.0))
    provider.shutdown()
