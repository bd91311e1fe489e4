"""Two agents, one server, no shared trace: two mcp 2.x `mcp.Client` processes (`service.name`
`agent-a` and `agent-b`, default mode: 2026-07-28 via `server/discover`) call the same tool of ONE
streamable-HTTP server (the SDK's low-level `Server`, `service.name` `shared-server`, exporting its
own spans to the same endpoint). The server has no propagator (OTEL_PROPAGATORS=none, and the
global text map set to an empty composite), so its SERVER spans start traces of their own: nothing
but timing, method, tool and request id links a server span to a client span.

  two_agents.py OTLP_ENDPOINT [overlapping|sequential]

  - both agents are separate sessions, so both number their request ids from 1 (`server/discover`
    is 1, the call is 2 in each; agent B then lists tools, 3, to validate its successful result);
  - agent A calls `create` with an empty title: the server answers a result with isError (a tool
    error that only the server span records); agent B calls `create` with a title: success;
  - the tool sleeps 300 ms and both calls start within a few ms of each other (each agent connects,
    says it is ready, and waits for a go file), so they overlap; with `sequential`, agent B's call
    starts 50 ms after agent A's returned (A writes a second go file then);
  - agent A exports promptly (batch schedule delay 200 ms, exits at once); agent B holds its spans
    (schedule delay 30 s) and shuts its provider down 1.2 s after its call, so its spans arrive
    about 1.2 s after A's and the server's.

Prints one JSON line: {"agent-a": [steps], "agent-b": [steps], "server_port": PORT}, each step
{"step", "protocol_version" | "is_error" | "exception", "code"} (class names and codes only).
The internal roles:

  two_agents.py server http PORT
  two_agents.py agent NAME URL BARRIER_DIR MODE
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
AGENTS = {
    # name: (title argument, batch schedule delay in ms, seconds to hold the spans after the call)
    "agent-a": ("", 200, 0.0),
    "agent-b": ("report", 30000, 1.2),
}
TOOL_SLEEP = 0.3
CALL_TIMEOUT = 10.0
# In `sequential` mode: how long after agent A's call returned agent B's starts.
SEQUENTIAL_GAP = 0.05


def serve(port):
    import mcp_types as types
    import uvicorn
    from mcp.server.lowlevel.server import Server
    from opentelemetry import propagate
    from opentelemetry.propagators.composite import CompositePropagator

    common.setup_tracing("shared-server")
    # No propagator: the `traceparent` the clients put in `_meta` is not extracted.
    propagate.set_global_textmap(CompositePropagator([]))

    async def list_tools(ctx, params):
        schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        return types.ListToolsResult(tools=[types.Tool(name="create", description="scenario tool create", input_schema=schema)])

    async def call_tool(ctx, params):
        await asyncio.sleep(TOOL_SLEEP)
        if params.name != "create":
            return types.CallToolResult(content=[types.TextContent(type="text", text="unknown tool")], is_error=True)
        if not (params.arguments or {}).get("title"):
            return types.CallToolResult(content=[types.TextContent(type="text", text="title must not be empty")], is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text="created")])

    server = Server("dialect-shared-server", on_list_tools=list_tools, on_call_tool=call_tool)
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(port), log_level="warning")


async def agent_session(name, url, barrier, mode, log):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    title = AGENTS[name][0]
    async with httpx2.AsyncClient(timeout=CALL_TIMEOUT) as http:
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=CALL_TIMEOUT) as client:
            log.append({"step": "connect", "protocol_version": client.protocol_version})
            open(os.path.join(barrier, f"{name}.ready"), "w").close()
            go = "go-b" if mode == "sequential" and name == "agent-b" else "go"
            deadline = time.time() + 20
            while not os.path.exists(os.path.join(barrier, go)):
                if time.time() > deadline:
                    raise TimeoutError("no go signal")
                await asyncio.sleep(0.002)
            try:
                r = await client.call_tool("create", {"title": title})
                log.append({"step": "tools/call create", "is_error": bool(r.is_error)})
            except Exception as e:  # the class only, never the message
                log.append({"step": "tools/call create", "exception": type(e).__name__, "code": getattr(e, "code", None)})
            finally:
                if mode == "sequential" and name == "agent-a":
                    await asyncio.sleep(SEQUENTIAL_GAP)
                    open(os.path.join(barrier, "go-b"), "w").close()


def agent_main(name, url, barrier, mode):
    _, delay_ms, hold = AGENTS[name]
    common.setup_tracing(name, schedule_delay_millis=delay_ms)
    log = []
    try:
        asyncio.run(asyncio.wait_for(agent_session(name, url, barrier, mode, log), 30))
    except BaseException as e:  # noqa: BLE001 - recorded, the manifest says what happened
        log.append({"step": "session", "exception": type(e).__name__, "code": getattr(e, "code", None)})
    print(json.dumps(log), flush=True)
    # The provider shuts down (and exports) at exit: agent B holds its spans a while longer.
    time.sleep(hold)


def main():
    endpoint = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "overlapping"
    base = dict(os.environ, MCP_DIALECT_OTLP=endpoint, PYTHONUNBUFFERED="1")
    port = common.free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = common.start_http_server(SCRIPT, port, {"MCP_DIALECT_OTLP": endpoint, "OTEL_PROPAGATORS": "none"})
    manifest = {}
    try:
        with tempfile.TemporaryDirectory() as barrier:
            procs = {
                name: subprocess.Popen([sys.executable, SCRIPT, "agent", name, url, barrier, mode], env=base, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
                for name in AGENTS
            }
            deadline = time.time() + 30
            while not all(os.path.exists(os.path.join(barrier, f"{n}.ready")) for n in AGENTS):
                if time.time() > deadline or any(p.poll() is not None for p in procs.values()):
                    break
                time.sleep(0.005)
            open(os.path.join(barrier, "go"), "w").close()
            for name, proc in procs.items():
                try:
                    out, _ = proc.communicate(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
                lines = [line for line in out.decode().splitlines() if line.startswith("[")]
                manifest[name] = json.loads(lines[-1]) if lines else [{"step": "process", "exception": "exit", "code": proc.returncode}]
    finally:
        common.stop_server(server)
    manifest["server_port"] = port
    print(json.dumps(manifest), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[3])
    elif sys.argv[1] == "agent":
        agent_main(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        main()
