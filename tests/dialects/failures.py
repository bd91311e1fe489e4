"""Failures only the client's own telemetry sees: no tap, no HTTP server tracing, and the server
process exports nothing (it never installs a tracer provider), so every span of these scenarios
comes from the MCP client.

  failures.py STACK REVISION OTLP_ENDPOINT

STACK is `sdk` (mcp 2.x built-in tracing, client `mcp.Client`), `fastmcp` (FastMCP 4's `Client`,
whose spans wrap the SDK's) or `traceloop` (mcp 1.x + opentelemetry-instrumentation-mcp; run it
with .venv-mcp1's python). REVISION is `2026-07-28` (the clients' default `mode="auto"`: a
`server/discover` probe at 2026-07-28, falling back to `initialize` only on a JSON-RPC error) or
`2025-11-25` (`mode="legacy"`: the initialize handshake). FastMCP's `Client` takes the same `mode`
(default "auto") and hands it to the SDK's negotiation. mcp 1.x speaks only 2025-11-25 and
earlier: `traceloop 2026-07-28` prints `{"skipped": REASON}` and runs nothing.

Each scenario is its own client process with `service.name` STACK-REVISION-SCENARIO:

  down           streamable HTTP to a port where nothing listens: the setup request fails
  dies-stdio     over stdio: connect, tools/call `echo` (answered), tools/call `die`, during which
                 the server process exits hard (os._exit) before answering
  dies-http      the same over streamable HTTP (mcp 1.x notices only when the 10 s timeout ends)
  refused        streamable HTTP to a bearer-auth server with an unknown token: 401 at setup
                 (a short name: a long service name with digits reads as a token and is hashed)

The scenario server is the installed SDK's low-level `Server` (mcp 2.x, or mcp 1.x for traceloop)
offering `echo` and `die`. Every request has a 10 s timeout, every client process 40 s.

Prints one JSON line: agent -> the client's steps (exception class names and `code` attributes
only, never messages):

  {"step": "connect", "ok": true, "protocol_version": V}        the setup succeeded
  {"step": "connect" | "tools/call NAME", "exception": CLASS, "code": C, "causes": [...]}
                                        it raised; `causes` lists the leaves of an exception group
  {"step": "tools/call NAME", "is_error": B}                    the call returned a result
  {"step": "tools/call NAME", "exception": "CancelledError", "interrupted": true}
                                        the call never returned: the transport's crash cancelled it
  {"step": "disconnect", "exception": ...}                      what leaving the session raised

The internal roles:

  failures.py server stdio | server http PORT     (MCP_DIALECT_AUTH=1: bearer auth)
  failures.py client SCENARIO                     (MCP_DIALECT_STACK, _REVISION, _AGENT, _URL, _TOKEN)
"""

import asyncio
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
STACKS = ("sdk", "fastmcp", "traceloop")
REVISIONS = ("2026-07-28", "2025-11-25")
SCENARIOS = ("down", "dies-stdio", "dies-http", "refused")
CALL_TIMEOUT = 10.0
CLIENT_TIMEOUT = 40.0


def mcp_major():
    from importlib.metadata import version

    return int(version("mcp").split(".")[0])


def server_env():
    """The environment of a scenario server: no OTLP endpoint, so nothing could export."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DIALECT_") and not k.startswith("OTEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ----------------------------------------------------------------------------------------------
# Server (no tracer provider: the SDK's spans, if any, go to the no-op global tracer)
# ----------------------------------------------------------------------------------------------

SERVER_TOOLS = ("echo", "die")


def die():
    """Exit at once, answering nothing (no atexit, no flush, no socket shutdown)."""
    os._exit(3)


class _Verifier:
    async def verify_token(self, token):
        from mcp.server.auth.provider import AccessToken

        if token == common.GOOD_TOKEN:
            return AccessToken(token=token, client_id="scenario-client", scopes=[common.REQUIRED_SCOPE])
        return None


def serve_v2(mode, port, auth):
    import mcp_types as types
    from mcp.server.lowlevel.server import Server

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name=n, description=common.tool_description(n), input_schema=common.tool_schema(n)) for n in SERVER_TOOLS])

    async def call_tool(ctx, params):
        if params.name == "die":
            die()
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    server = Server("dialect-failures-server", on_list_tools=list_tools, on_call_tool=call_tool)
    if mode == "stdio":
        from mcp.server.stdio import stdio_server

        async def main():
            async with stdio_server() as (r, w):
                await server.run(r, w, server.create_initialization_options())

        asyncio.run(main())
        return
    import uvicorn

    kw = {}
    if auth:
        from mcp.server.auth.settings import AuthSettings

        kw = dict(
            auth=AuthSettings(issuer_url="http://127.0.0.1:9/", resource_server_url=f"http://127.0.0.1:{port}/mcp", required_scopes=[common.REQUIRED_SCOPE]),
            token_verifier=_Verifier(),
        )
    uvicorn.run(server.streamable_http_app(**kw), host="127.0.0.1", port=int(port), log_level="warning")


def serve_v1(mode, port, auth):
    import mcp.types as types
    from mcp.server.lowlevel import Server

    server = Server("dialect-failures-server")

    @server.list_tools()
    async def list_tools(req=None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, description=common.tool_description(n), inputSchema=common.tool_schema(n)) for n in SERVER_TOOLS])

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict):
        if name == "die":
            die()
        return [types.TextContent(type="text", text="ok")]

    opts = server.create_initialization_options()
    if mode == "stdio":
        from mcp.server.stdio import stdio_server

        async def main():
            async with stdio_server() as (r, w):
                await server.run(r, w, opts)

        asyncio.run(main())
        return
    import uvicorn
    from mcp.server.fastmcp.server import StreamableHTTPASGIApp
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=server)
    endpoint, middleware = StreamableHTTPASGIApp(manager), []
    if auth:
        from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
        from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
        from starlette.middleware.authentication import AuthenticationMiddleware

        endpoint = RequireAuthMiddleware(endpoint, [common.REQUIRED_SCOPE], None)
        middleware = [Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(_Verifier())), Middleware(AuthContextMiddleware)]
    app = Starlette(routes=[Route("/mcp", endpoint=endpoint)], middleware=middleware, lifespan=lambda app: manager.run())
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


def serve(mode, port=None):
    auth = os.environ.get("MCP_DIALECT_AUTH") == "1"
    (serve_v2 if mcp_major() >= 2 else serve_v1)(mode, port, auth)


# ----------------------------------------------------------------------------------------------
# Client: one adapter per stack, each an async context manager yielding (protocol_version, call)
# where `call(name, args)` returns the result's isError.
# ----------------------------------------------------------------------------------------------


def stdio_command():
    return sys.executable, [SCRIPT, "server", "stdio"]


def sdk_mode(revision):
    return "legacy" if revision == "2025-11-25" else "auto"


class SdkSession:
    def __init__(self, kind, revision, url, token):
        self.kind, self.mode, self.url, self.token = kind, sdk_mode(revision), url, token

    async def __aenter__(self):
        from contextlib import AsyncExitStack

        from mcp import Client, StdioServerParameters

        self.stack = AsyncExitStack()
        await self.stack.__aenter__()
        try:
            if self.kind == "stdio":
                cmd, args = stdio_command()
                target = StdioServerParameters(command=cmd, args=args, env=server_env())
            else:
                import httpx2
                from mcp.client.streamable_http import streamable_http_client

                headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
                http = await self.stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=CALL_TIMEOUT))
                target = streamable_http_client(self.url, http_client=http)
            self.client = await self.stack.enter_async_context(Client(target, mode=self.mode, read_timeout_seconds=CALL_TIMEOUT))
        except BaseException:
            await self.stack.__aexit__(*sys.exc_info())
            raise
        return self.client.protocol_version, self.call

    async def __aexit__(self, *exc):
        return await self.stack.__aexit__(*exc)

    async def call(self, name, args):
        return (await self.client.call_tool(name, args)).is_error


class FastmcpSession:
    def __init__(self, kind, revision, url, token):
        self.kind, self.mode, self.url, self.token = kind, sdk_mode(revision), url, token

    async def __aenter__(self):
        from fastmcp import Client
        from fastmcp.client.transports import PythonStdioTransport, StreamableHttpTransport

        if self.kind == "stdio":
            transport = PythonStdioTransport(SCRIPT, args=["server", "stdio"], env=server_env())
        else:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            transport = StreamableHttpTransport(self.url, headers=headers)
        self.client = Client(transport, mode=self.mode, timeout=CALL_TIMEOUT, init_timeout=CALL_TIMEOUT)
        await self.client.__aenter__()
        return self.client.protocol_version, self.call

    async def __aexit__(self, *exc):
        return await self.client.__aexit__(*exc)

    async def call(self, name, args):
        return (await self.client.call_tool(name, args, raise_on_error=False)).is_error


class TraceloopSession:
    """mcp 1.x `ClientSession` over `stdio_client` / `streamablehttp_client` (the transports the
    instrumentation wraps)."""

    def __init__(self, kind, revision, url, token):
        self.kind, self.url, self.token = kind, url, token

    async def __aenter__(self):
        from contextlib import AsyncExitStack
        from datetime import timedelta

        from mcp import ClientSession, StdioServerParameters

        self.stack = AsyncExitStack()
        await self.stack.__aenter__()
        try:
            if self.kind == "stdio":
                from mcp.client.stdio import stdio_client

                cmd, args = stdio_command()
                r, w = await self.stack.enter_async_context(stdio_client(StdioServerParameters(command=cmd, args=args, env=server_env())))
            else:
                from mcp.client.streamable_http import streamablehttp_client

                headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
                r, w, _ = await self.stack.enter_async_context(streamablehttp_client(self.url, headers=headers, timeout=CALL_TIMEOUT))
            self.session = await self.stack.enter_async_context(ClientSession(r, w, read_timeout_seconds=timedelta(seconds=CALL_TIMEOUT)))
            init = await self.session.initialize()
        except BaseException:
            await self.stack.__aexit__(*sys.exc_info())
            raise
        # The instrumentation's wrapper swallows exceptions (`dont_throw`): a failed request can
        # come back as None instead of raising.
        return (init.protocolVersion if init is not None else None), self.call

    async def __aexit__(self, *exc):
        return await self.stack.__aexit__(*exc)

    async def call(self, name, args):
        r = await self.session.call_tool(name, args)
        return None if r is None else bool(r.isError)


ADAPTERS = {"sdk": SdkSession, "fastmcp": FastmcpSession, "traceloop": TraceloopSession}


def describe(e):
    """What the client saw: the class, the `code` attribute (mcp 1.x: `error.code`) and, for an
    exception group, the same of each leaf. Never the message."""
    code = getattr(e, "code", None)
    if code is None and hasattr(getattr(e, "error", None), "code"):
        code = e.error.code
    out = {"exception": type(e).__name__, "code": code if isinstance(code, (int, str)) else None}
    if isinstance(e, BaseExceptionGroup):
        leaves, todo = [], list(e.exceptions)
        while todo:
            x = todo.pop(0)
            if isinstance(x, BaseExceptionGroup):
                todo[:0] = list(x.exceptions)
            else:
                leaves.append(describe(x))
        out["causes"] = leaves
    return out


async def call(log, fn, name, args):
    entry = {"step": f"tools/call {name}"}
    log.append(entry)
    try:
        entry["is_error"] = await fn(name, args)
    except Exception as e:  # the scenario records what the client saw, by class only
        entry.update(describe(e))
    except BaseException as e:  # cancelled by the transport's crash: the call never returned
        entry.update(describe(e), interrupted=True)
        raise


async def run_scenario(stack, revision, scenario, log):
    kind = "stdio" if scenario == "dies-stdio" else "http"
    session = ADAPTERS[stack](kind, revision, os.environ.get("MCP_DIALECT_URL"), os.environ.get("MCP_DIALECT_TOKEN") or None)
    connected = False
    try:
        async with session as (protocol_version, fn):
            connected = True
            log.append({"step": "connect", "ok": True, "protocol_version": protocol_version})
            await call(log, fn, "echo", {"text": "hi"})
            if scenario.startswith("dies"):
                await call(log, fn, "die", {})
    except BaseException as e:  # noqa: BLE001 - a refused setup or a torn-down session is the scenario
        if isinstance(e, KeyboardInterrupt):
            raise
        log.append({"step": "disconnect" if connected else "connect", **describe(e)})


def client_main(scenario):
    stack, revision = os.environ["MCP_DIALECT_STACK"], os.environ["MCP_DIALECT_REVISION"]
    common.setup_tracing(os.environ["MCP_DIALECT_AGENT"])
    if stack == "traceloop":
        from opentelemetry.instrumentation.mcp import McpInstrumentor

        McpInstrumentor().instrument()
    log = []

    async def guarded():
        try:
            await asyncio.wait_for(run_scenario(stack, revision, scenario, log), CLIENT_TIMEOUT - 10)
        except asyncio.TimeoutError:
            log.append({"step": "scenario", "exception": "TimeoutError", "code": None})

    asyncio.run(guarded())
    print(json.dumps(log), flush=True)


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------


def run_client(scenario, env):
    try:
        out = subprocess.run([sys.executable, SCRIPT, "client", scenario], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return [{"step": "process", "exception": "TimeoutExpired", "code": None}]
    lines = [line for line in out.stdout.decode().splitlines() if line.startswith("[")]
    return json.loads(lines[-1]) if lines else [{"step": "process", "exception": "exit", "code": out.returncode}]


def main():
    stack, revision, endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    if stack not in STACKS or revision not in REVISIONS:
        sys.exit(f"usage: failures.py {{{'|'.join(STACKS)}}} {{{'|'.join(REVISIONS)}}} OTLP_ENDPOINT")
    want = 1 if stack == "traceloop" else 2
    if mcp_major() != want:
        sys.exit(f"stack {stack} needs mcp {want}.x (this python has mcp {mcp_major()}.x)")
    if stack == "traceloop" and revision == "2026-07-28":
        print(json.dumps({"skipped": "traceloop instruments mcp 1.x, which speaks 2025-11-25 and earlier only"}), flush=True)
        return
    base = dict(os.environ, MCP_DIALECT_OTLP=endpoint, MCP_DIALECT_STACK=stack, MCP_DIALECT_REVISION=revision, PYTHONUNBUFFERED="1")
    manifest = {}
    for scenario in SCENARIOS:
        agent = f"{stack}-{revision}-{scenario}"
        env = dict(base, MCP_DIALECT_AGENT=agent)
        server = None
        port = common.free_port()
        env["MCP_DIALECT_URL"] = f"http://127.0.0.1:{port}/mcp"
        if scenario in ("dies-http", "refused"):
            extra = {"MCP_DIALECT_AUTH": "1"} if scenario == "refused" else {}
            server = start_server(port, extra)
        if scenario == "refused":
            env["MCP_DIALECT_TOKEN"] = common.BAD_TOKEN
        try:
            manifest[agent] = run_client(scenario, env)
        finally:
            if server is not None:
                common.stop_server(server)
    print(json.dumps(manifest), flush=True)


def start_server(port, extra_env):
    proc = subprocess.Popen([sys.executable, SCRIPT, "server", "http", str(port)], env=dict(server_env(), **extra_env), stdin=subprocess.DEVNULL)
    common.wait_port(port, proc)
    return proc


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif sys.argv[1] == "client":
        client_main(sys.argv[2])
    else:
        main()
