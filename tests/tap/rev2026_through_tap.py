"""The `mcp` SDK 2.3.0 speaking MCP revision 2026-07-28 (no initialize handshake, per-request
`_meta` envelope) through `mcp-health tap`. Real SDK client (`mcp.Client`) and real SDK server
(`mcp.server.mcpserver.MCPServer`, defined in this file), the SDK's own tracing off
(OTEL_SDK_DISABLED=true): every span the service gets comes from the tap.

  rev2026_through_tap.py TAP_BINARY OTLP_ENDPOINT     run every scenario, print one JSON manifest
  rev2026_through_tap.py server stdio [TTL_MS]         the server on stdin/stdout (the tap runs this)
  rev2026_through_tap.py server http PORT              the server's streamable HTTP app on 127.0.0.1:PORT/mcp

Run with the .venv-mcp interpreter. Scenarios (agent = the tap's --service-name; stdio ones run the
server as `TAP tap --otlp-endpoint E --service-name AGENT --server-address rev26-server -- python
THIS server stdio [TTL_MS]`):

  rev26-default-auto     stdio, SDK-default server (tools/list ttlMs 0), client mode="auto":
                         server/discover probe, tools/list (all pages), echo x2 (the arguments carry
                         the planted string SECRET-REV26-ARGUMENT)
  rev26-default-pinned   stdio, same server, client mode="2026-07-28": no discover on the wire;
                         tools/list, echo
  rev26-ttl              stdio, server with cache_hints tools/list CacheHint(ttl_ms=1500):
                         tools/list, echo at once, sleep 2.5 s, echo (catalog expired), tools/list
                         (the client cache has expired, so this goes on the wire), echo
  rev26-listen           stdio, ttl-0 server: tools/list, subscriptions/listen (toolsListChanged),
                         echo while listening, mutate (adds tool `extra`, ctx.notify_tools_changed():
                         notifications/tools/list_changed tagged with the subscription id), wait for
                         the event, echo on the now stale catalog, tools/list (sees `extra`), echo,
                         close the listen
                         (notifications/cancelled for the listen id), echo after the close
  rev26-confirm          stdio: tool `confirm` (Resolve(Elicit)): one logical call = two tools/call
                         requests (first answered resultType "input_required" with inputRequests +
                         requestState, the retry carries inputResponses + requestState);
                         `confirm_slow`: the same, the client's elicitation callback sleeps 3 s
                         before accepting (a human thinking)
  rev26-refused-version  streamable HTTP through an HTTP tap (`--listen 127.0.0.1:0 --upstream`), raw
                         httpx2 requests to the MCPServer app under uvicorn:
                           tools/call echo at 2026-07-28 (control)          -> 200, result
                           tools/call echo at "2099-01-01" (header + _meta) -> HTTP 400, -32022
                             UnsupportedProtocolVersion, data {supported: ["2026-07-28"], requested}
                           tools/call confirm, clientCapabilities {} (no elicitation)
                                                                            -> HTTP 400, -32021
                             MissingRequiredClientCapability (raised by the Resolve(Elicit) resolver
                             before the tool runs; data.requiredCapabilities.elicitation.form)
                           GET /mcp and DELETE /mcp with 2026-07-28 headers -> 405 (Allow: POST)
                         The manifest records what the SDK really answered (status and code).

Prints one JSON object on stdout: agent -> list of steps the client saw (class / code / counts only,
never argument values or tokens). Takes about 15 s.
"""

import asyncio
import json
import os
import subprocess
import sys
import time

THIS = os.path.abspath(__file__)
HERE = os.path.dirname(THIS)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dialects"))
import common  # noqa: E402  (free_port, wait_port, stop_server)
from sdk_through_tap import start_tap  # noqa: E402
SECRET = "SECRET-REV26-ARGUMENT"
REV = "2026-07-28"
UNKNOWN_REV = "2099-01-01"
SERVER_ADDRESS = "rev26-server"

# The SDK's own tracing is off in the client and (through the inherited environment) the server.
os.environ["OTEL_SDK_DISABLED"] = "true"


# ----------------------------------------------------------------------------------------------
# Server
# ----------------------------------------------------------------------------------------------

# Imported after OTEL_SDK_DISABLED is set, so the SDK never sees its tracing on.
from typing import Annotated  # noqa: E402

from pydantic import BaseModel  # noqa: E402

from mcp.server.mcpserver.resolve import Elicit, Resolve  # noqa: E402


class Ok(BaseModel):
    confirm: bool


# Module-level resolvers, so their inputRequests keys are "__main__:ask" and "__main__:ask_slow".
def ask() -> Elicit[Ok]:
    return Elicit("Proceed?", Ok)


def ask_slow() -> Elicit[Ok]:
    # The client's elicitation callback recognises this message and "thinks" for 3 s.
    return Elicit("Proceed (think it over)?", Ok)


def build_server(ttl_ms=None):
    from mcp.server.caching import CacheHint
    from mcp.server.mcpserver import Context, MCPServer

    kw = {"cache_hints": {"tools/list": CacheHint(ttl_ms=ttl_ms)}} if ttl_ms is not None else {}
    app = MCPServer("rev26-server", log_level="WARNING", **kw)

    @app.tool()
    def echo(text: str) -> str:
        return text

    @app.tool()
    def confirm(x: str, ok: Annotated[Ok, Resolve(ask)]) -> str:
        return f"done {ok.confirm}"

    @app.tool()
    def confirm_slow(x: str, ok: Annotated[Ok, Resolve(ask_slow)]) -> str:
        return f"done {ok.confirm}"

    @app.tool()
    async def mutate(ctx: Context) -> str:
        if not any(t.name == "extra" for t in await app.list_tools()):

            @app.tool()
            def extra() -> str:
                return "x"

        await ctx.notify_tools_changed()
        return "mutated"

    return app


def serve(mode, arg=None):
    if mode == "stdio":
        build_server(int(arg) if arg else None).run("stdio")
        return
    import uvicorn

    app = build_server().streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=int(arg), log_level="warning")


# ----------------------------------------------------------------------------------------------
# Client helpers
# ----------------------------------------------------------------------------------------------


def stdio_params(tap, endpoint, agent, ttl_ms=None):
    from mcp import StdioServerParameters

    args = ["tap", "--otlp-endpoint", endpoint, "--service-name", agent, "--server-address", SERVER_ADDRESS, "--",
            sys.executable, THIS, "server", "stdio"]
    if ttl_ms is not None:
        args.append(str(ttl_ms))
    return StdioServerParameters(command=tap, args=args, env=dict(os.environ))


async def list_all(client, log):
    """A full tools/list traversal (the client's cache may serve page 1 when still fresh)."""
    cursor, pages, names = None, 0, []
    while True:
        page = await client.list_tools(cursor=cursor)
        pages += 1
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            break
    log.append({"step": "tools/list", "pages": pages, "tools": len(names)})
    return names


async def call(client, log, name, args, **kw):
    try:
        r = await client.call_tool(name, args, **kw)
        log.append({"step": f"tools/call {name}", "is_error": bool(r.is_error)})
    except Exception as e:  # the scenario records what the client saw, by class only
        log.append({"step": f"tools/call {name}", "exception": type(e).__name__, "code": getattr(e, "code", None)})


def connected(client, log, mode):
    log.append({"step": "connect", "mode": mode, "protocol_version": client.protocol_version})


# ----------------------------------------------------------------------------------------------
# Scenarios
# ----------------------------------------------------------------------------------------------


async def default_session(tap, endpoint, agent, mode, echoes):
    from mcp import Client

    log = []
    async with Client(stdio_params(tap, endpoint, agent), mode=mode) as client:
        connected(client, log, mode)
        await list_all(client, log)
        for i in range(echoes):
            await call(client, log, "echo", {"text": f"{SECRET}-{i}"})
    return log


async def ttl_session(tap, endpoint, agent):
    from mcp import Client

    log = []
    async with Client(stdio_params(tap, endpoint, agent, ttl_ms=1500), mode="auto") as client:
        connected(client, log, "auto")
        await list_all(client, log)
        await call(client, log, "echo", {"text": SECRET})
        await asyncio.sleep(2.5)
        log.append({"step": "sleep", "seconds": 2.5})
        await call(client, log, "echo", {"text": SECRET})
        log[-1]["catalog"] = "expired"
        await list_all(client, log)
        await call(client, log, "echo", {"text": SECRET})
    return log


async def listen_session(tap, endpoint, agent):
    import anyio

    from mcp import Client

    log = []
    async with Client(stdio_params(tap, endpoint, agent), mode="auto") as client:
        connected(client, log, "auto")
        await list_all(client, log)
        async with client.listen(tools_list_changed=True) as sub:
            log.append({"step": "subscriptions/listen", "acknowledged": True,
                        "tools_list_changed": bool(sub.honored.tools_list_changed)})
            await call(client, log, "echo", {"text": SECRET})
            await call(client, log, "mutate", {})
            events = []
            try:
                with anyio.fail_after(5):
                    async for ev in sub:
                        events.append(type(ev).__name__)
                        break
            except TimeoutError:
                pass
            log.append({"step": "event", "arrived": bool(events), "kind": events[0] if events else None})
            # Pauses longer than the tap's export delay (200 ms), so that the service sees each
            # catalog state on its own: stale after the change, converged after the re-list.
            await asyncio.sleep(0.8)
            # A call chosen from the catalog the change made stale (the client has not re-listed).
            await call(client, log, "echo", {"text": SECRET})
            await asyncio.sleep(0.8)
            names = await list_all(client, log)
            log[-1]["has_extra"] = "extra" in names
            await call(client, log, "echo", {"text": SECRET})
            await asyncio.sleep(0.8)
        # Leaving the block cancels the listen: the client sends notifications/cancelled for its id
        # from a background task (the server never answers the listen request itself). Give it a
        # moment, so the next call is on the wire after the cancellation.
        await asyncio.sleep(0.3)
        log.append({"step": "subscriptions/listen closed"})
        await call(client, log, "echo", {"text": SECRET})
    return log


async def confirm_session(tap, endpoint, agent):
    import mcp_types as types

    from mcp import Client

    seen = []

    async def elicit(ctx, params):
        slow = "think" in (params.message or "")
        seen.append("slow" if slow else "fast")
        if slow:
            await asyncio.sleep(3.0)  # longer than the service's 1 s re-evaluation plus export delays
        return types.ElicitResult(action="accept", content={"confirm": True})

    log = []
    async with Client(stdio_params(tap, endpoint, agent), mode="auto", elicitation_callback=elicit) as client:
        connected(client, log, "auto")
        await list_all(client, log)
        for name in ("confirm", "confirm_slow"):
            before = len(seen)
            t0 = time.monotonic()
            await call(client, log, name, {"x": SECRET})
            log[-1]["elicitations"] = len(seen) - before
            log[-1]["slow"] = time.monotonic() - t0 >= 1.4
    return log


def envelope(version, capabilities):
    return {"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientInfo": {"name": "rev26-raw", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": capabilities}


def rpc_reply(resp):
    """The JSON-RPC message of a POST reply, application/json or text/event-stream (last message)."""
    ctype = resp.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        return resp.json()
    if ctype.startswith("text/event-stream"):
        msg = None
        for line in resp.text.splitlines():
            if line.startswith("data:"):
                msg = json.loads(line[5:].strip())
        return msg
    return None


async def refused_session(base):
    import httpx2

    url = f"{base}/mcp"
    log = []
    n = [0]

    async def post(http, step, method, params, version):
        n[0] += 1
        body = {"jsonrpc": "2.0", "id": n[0], "method": method, "params": params}
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": version, "Mcp-Method": method}
        if method == "tools/call":
            headers["Mcp-Name"] = params["name"]
        resp = await http.post(url, json=body, headers=headers)
        msg = rpc_reply(resp) or {}
        entry = {"step": step, "method": method, "status": resp.status_code,
                 "content_type": resp.headers.get("content-type", "").split(";")[0]}
        if "error" in msg:
            entry["code"] = msg["error"].get("code")
        elif "result" in msg:
            entry["result_type"] = msg["result"].get("resultType")
            entry["is_error"] = msg["result"].get("isError")
        log.append(entry)

    async with httpx2.AsyncClient(timeout=10) as http:
        await post(http, "control", "tools/call",
                   {"name": "echo", "arguments": {"text": SECRET}, "_meta": envelope(REV, {})}, REV)
        await post(http, "unsupported-version", "tools/call",
                   {"name": "echo", "arguments": {"text": SECRET}, "_meta": envelope(UNKNOWN_REV, {})}, UNKNOWN_REV)
        await post(http, "missing-capability", "tools/call",
                   {"name": "confirm", "arguments": {"x": SECRET}, "_meta": envelope(REV, {})}, REV)
        for verb in ("GET", "DELETE"):
            headers = {"MCP-Protocol-Version": REV, "Accept": "text/event-stream" if verb == "GET" else "application/json"}
            resp = await http.request(verb, url, headers=headers)
            log.append({"step": verb, "status": resp.status_code, "allow": resp.headers.get("allow")})
    return log


def main():
    tap, endpoint = sys.argv[1], sys.argv[2]
    manifest = {}
    manifest["rev26-default-auto"] = asyncio.run(default_session(tap, endpoint, "rev26-default-auto", "auto", 2))
    manifest["rev26-default-pinned"] = asyncio.run(default_session(tap, endpoint, "rev26-default-pinned", REV, 1))
    manifest["rev26-ttl"] = asyncio.run(ttl_session(tap, endpoint, "rev26-ttl"))
    manifest["rev26-listen"] = asyncio.run(listen_session(tap, endpoint, "rev26-listen"))
    manifest["rev26-confirm"] = asyncio.run(confirm_session(tap, endpoint, "rev26-confirm"))

    port = common.free_port()
    server = subprocess.Popen([sys.executable, THIS, "server", "http", str(port)], env=dict(os.environ), stdin=subprocess.DEVNULL)
    try:
        common.wait_port(port, server)
        proc, url = start_tap(tap, f"http://127.0.0.1:{port}", endpoint, "rev26-refused-version")
        try:
            manifest["rev26-refused-version"] = asyncio.run(refused_session(url))
        finally:
            common.stop_server(proc)
    finally:
        common.stop_server(server)
    print(json.dumps(manifest), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        serve(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        t0 = time.time()
        main()
        print(f"rev2026_through_tap: {time.time() - t0:.1f}s", file=sys.stderr)
