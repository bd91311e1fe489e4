"""Dialect `fastmcp`: FastMCP's native OpenTelemetry tracing (server and client), over the `mcp`
SDK 2.x whose own spans come along (FastMCP's client wraps the SDK's `MCP send …` span).

  stack_fastmcp.py server stdio | server http PORT | client      (see stack_sdk.py)
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

STACK = "fastmcp"


def build_server(auth=None):
    from fastmcp import Context, FastMCP
    from fastmcp.exceptions import ToolError

    mcp = FastMCP("dialect-fastmcp-server", list_page_size=common.PAGE_SIZE, auth=auth)

    @mcp.tool(description=common.tool_description("echo"))
    def echo(text: str) -> str:
        return "ok"

    @mcp.tool(description=common.tool_description("fails"))
    def fails() -> str:
        raise ToolError("the tool failed")

    @mcp.tool(description=common.tool_description("explodes"))
    def explodes() -> str:
        raise RuntimeError("boom")

    @mcp.tool(description=common.tool_description("slow"))
    async def slow(ctx: Context) -> str:
        for i in range(1, 4):
            await ctx.report_progress(i, 3)
            await asyncio.sleep(0.05)
        return "ok"

    @mcp.tool(description=common.tool_description("mutate"))
    async def mutate(ctx: Context) -> str:
        if common.EXTRA_TOOL not in [t.name for t in await mcp.list_tools()]:

            def extra() -> str:
                return "ok"

            mcp.tool(name=common.EXTRA_TOOL, description=common.tool_description(common.EXTRA_TOOL))(extra)
        return "ok"

    @mcp.tool(description=common.tool_description("noop"))
    def noop() -> str:
        return "ok"

    return mcp


def serve(mode, port=None):
    common.setup_tracing(f"{STACK}-server")
    if mode == "stdio":
        build_server().run(transport="stdio", show_banner=False)
        return
    import uvicorn
    from fastmcp.server.auth import AccessToken, TokenVerifier

    class Verifier(TokenVerifier):
        """Knows two tokens; the scope check is left to FastMCP's middleware (403), as a verifier
        that validates signatures but not scopes would."""

        async def verify_token(self, token):
            scopes = {common.GOOD_TOKEN: [common.REQUIRED_SCOPE], common.NOSCOPE_TOKEN: ["tools:read"]}.get(token)
            if scopes is None:
                return None
            return AccessToken(token=token, client_id="scenario-client", scopes=scopes)

    verifier = Verifier(required_scopes=[common.REQUIRED_SCOPE])
    app = build_server(auth=verifier).http_app(path="/mcp")
    uvicorn.run(common.wrap_asgi(app), host="127.0.0.1", port=int(port), log_level="warning")


async def call(client, log, name, args, **kw):
    try:
        r = await client.call_tool(name, args, raise_on_error=False, **kw)
        log.append({"step": f"tools/call {name}", "is_error": bool(r.is_error)})
    except Exception as e:  # the class only, never the message
        log.append({"step": f"tools/call {name}", "exception": type(e).__name__, "code": getattr(e, "code", None)})


async def list_all(client, log):
    cursor, pages = None, 0
    while True:
        page = await client.list_tools_mcp(cursor=cursor, cache_mode="bypass" if cursor is None else "use")
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    log.append({"step": "tools/list", "pages": pages})


async def stdio_session(log):
    from fastmcp import Client
    from fastmcp.client.transports import PythonStdioTransport

    got = []

    async def on_progress(progress, total, message):
        got.append(progress)

    transport = PythonStdioTransport(os.path.abspath(__file__), args=["server", "stdio"], env=dict(os.environ))
    async with Client(transport, progress_handler=on_progress) as client:
        log.append({"step": "initialize", "ok": True})
        await list_all(client, log)
        await call(client, log, "echo", {"text": "hi"})
        await call(client, log, "fails", {})
        await call(client, log, "explodes", {})
        await call(client, log, "missing", {})
        await call(client, log, "slow", {})
        log[-1]["progress"] = len(got)
        await call(client, log, "mutate", {})
        await asyncio.sleep(0.2)
        await list_all(client, log)


async def http_session(url, token, log, label):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with Client(StreamableHttpTransport(url, headers=headers)) as client:
            await call(client, log, "echo", {"text": "hi"})
            log[-1]["label"] = label
    except BaseException as e:  # noqa: BLE001 - the refused handshake is the scenario
        log.append({"step": "initialize", "label": label, "exception": type(e).__name__, "code": getattr(e, "code", None)})


def client_main():
    common.setup_tracing(os.environ.get("MCP_DIALECT_AGENT", f"{STACK}-agent"))
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
