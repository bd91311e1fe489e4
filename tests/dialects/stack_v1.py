"""Dialects `traceloop` and `logfire`: the `mcp` SDK 1.x (which has no tracing of its own),
instrumented by traceloop's `opentelemetry-instrumentation-mcp` (`McpInstrumentor`) or by
`logfire.instrument_mcp()`, chosen by MCP_DIALECT_STACK. Both only support mcp 1.x, so this runs in
the second virtual environment. Server: the SDK's low-level `Server` (it paginates `tools/list`);
client: `ClientSession` over stdio or `streamablehttp_client`.

  stack_v1.py server stdio | server http PORT | client      (see stack_sdk.py)
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

STACK = os.environ.get("MCP_DIALECT_STACK", "traceloop")


def instrument(service_name):
    """Set up tracing the way each instrumentation's documentation says."""
    if STACK == "logfire":
        import logfire

        logfire.configure(
            send_to_logfire=False,
            console=False,
            service_name=service_name,
            additional_span_processors=[common.otlp_span_processor()],
        )
        logfire.instrument_mcp()
        return logfire
    from opentelemetry.instrumentation.mcp import McpInstrumentor

    common.setup_tracing(service_name)
    McpInstrumentor().instrument()
    return None


def build_server():
    import mcp.types as types
    from mcp.server.lowlevel import Server

    server = Server("dialect-v1-server")
    state = {"tools": list(common.TOOLS)}

    def tool(name):
        return types.Tool(name=name, description=common.tool_description(name), inputSchema=common.tool_schema(name))

    @server.list_tools()
    async def list_tools(req: types.ListToolsRequest) -> types.ListToolsResult:
        # mcp 1.x calls this with no request to fill its tool cache (to validate a call).
        cursor = req.params.cursor if req is not None and req.params else None
        start = int(cursor) if cursor else 0
        names = state["tools"][start : start + common.PAGE_SIZE]
        nxt = start + common.PAGE_SIZE
        return types.ListToolsResult(tools=[tool(n) for n in names], nextCursor=str(nxt) if nxt < len(state["tools"]) else None)

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict):
        ctx = server.request_context
        if name not in state["tools"]:
            raise ValueError(f"Unknown tool: {name}")
        if name == "fails":
            return types.CallToolResult(content=[types.TextContent(type="text", text="the tool failed")], isError=True)
        if name == "explodes":
            raise RuntimeError("boom")
        if name == "slow":
            token = ctx.meta.progressToken if ctx.meta else None
            for i in range(1, 4):
                if token is not None:
                    await ctx.session.send_progress_notification(token, float(i), 3.0, related_request_id=str(ctx.request_id))
                await asyncio.sleep(0.05)
        if name == "mutate" and common.EXTRA_TOOL not in state["tools"]:
            state["tools"].append(common.EXTRA_TOOL)
            await ctx.session.send_tool_list_changed()
        return [types.TextContent(type="text", text="ok")]

    return server


def serve(mode, port=None):
    lf = instrument(f"{STACK}-server")
    from mcp.server.lowlevel import NotificationOptions

    server = build_server()
    opts = server.create_initialization_options(NotificationOptions(tools_changed=True))
    if mode == "stdio":
        from mcp.server.stdio import stdio_server

        async def main():
            async with stdio_server() as (r, w):
                await server.run(r, w, opts)

        asyncio.run(main())
        return
    import uvicorn
    from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
    from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
    from mcp.server.auth.provider import AccessToken
    from mcp.server.fastmcp.server import StreamableHTTPASGIApp
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.routing import Route

    class Verifier:
        async def verify_token(self, token):
            scopes = {common.GOOD_TOKEN: [common.REQUIRED_SCOPE], common.NOSCOPE_TOKEN: ["tools:read"]}.get(token)
            return None if scopes is None else AccessToken(token=token, client_id="scenario-client", scopes=scopes)

    manager = StreamableHTTPSessionManager(app=server)
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), [common.REQUIRED_SCOPE], None)
    app = Starlette(
        routes=[Route("/mcp", endpoint=endpoint)],
        middleware=[Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(Verifier())), Middleware(AuthContextMiddleware)],
        lifespan=lambda app: manager.run(),
    )
    if common.http_tracing():
        if lf is not None:
            app = lf.instrument_asgi(app)
        else:
            app = common.wrap_asgi(app)
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


async def call(session, log, name, args, **kw):
    try:
        r = await session.call_tool(name, args, **kw)
        log.append({"step": f"tools/call {name}", "is_error": bool(r.isError)})
    except Exception as e:  # the class only, never the message
        log.append({"step": f"tools/call {name}", "exception": type(e).__name__})


async def list_all(session, log):
    cursor, pages = None, 0
    while True:
        page = await session.list_tools(cursor=cursor)
        pages += 1
        cursor = page.nextCursor
        if cursor is None:
            break
    log.append({"step": "tools/list", "pages": pages})


async def stdio_session(log):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=[os.path.abspath(__file__), "server", "stdio"], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as session:
            await session.initialize()
            log.append({"step": "initialize", "ok": True})
            await list_all(session, log)
            await call(session, log, "echo", {"text": "hi"})
            await call(session, log, "fails", {})
            await call(session, log, "explodes", {})
            await call(session, log, "missing", {})
            got = []

            async def on_progress(progress, total, message):
                got.append(progress)

            await call(session, log, "slow", {}, progress_callback=on_progress)
            log[-1]["progress"] = len(got)
            await call(session, log, "mutate", {})
            await asyncio.sleep(0.2)
            await list_all(session, log)


async def http_session(url, token, log, label):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with streamablehttp_client(url, headers=headers, timeout=10) as (r, w, _):
            async with ClientSession(r, w, read_timeout_seconds=__import__("datetime").timedelta(seconds=10)) as session:
                await session.initialize()
                await call(session, log, "echo", {"text": "hi"})
                log[-1]["label"] = label
    except BaseException as e:  # noqa: BLE001 - the refused handshake is the scenario
        log.append({"step": "initialize", "label": label, "exception": type(e).__name__})


def client_main():
    instrument(os.environ.get("MCP_DIALECT_AGENT", f"{STACK}-agent"))
    log = []
    which = os.environ.get("MCP_DIALECT_SESSION", "stdio")
    if which == "stdio":
        asyncio.run(stdio_session(log))
    else:
        asyncio.run(http_session(os.environ["MCP_DIALECT_URL"], os.environ.get("MCP_DIALECT_TOKEN") or None, log, which))
    print(json.dumps(log), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        client_main()
