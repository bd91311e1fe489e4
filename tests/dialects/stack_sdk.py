"""Dialect `mcp_sdk`: the `mcp` SDK 2.x with its built-in OpenTelemetry tracing (no other
instrumentation). The server is the SDK's low-level `Server` (it paginates `tools/list` itself);
the client is `mcp.Client` on the initialize handshake (`mode="legacy"`, 2025-11-25).

  stack_sdk.py server stdio          serve on stdin/stdout
  stack_sdk.py server http PORT      serve streamable HTTP on 127.0.0.1:PORT/mcp with bearer auth
  stack_sdk.py client                run every scenario (see run.py), print a JSON manifest
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

STACK = "sdk"


# ----------------------------------------------------------------------------------------------
# Server
# ----------------------------------------------------------------------------------------------


def build_server():
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp.shared.exceptions import MCPError

    state = {"tools": list(common.TOOLS)}

    def tool(name):
        return types.Tool(name=name, description=common.tool_description(name), input_schema=common.tool_schema(name))

    async def list_tools(ctx, params):
        cursor = getattr(params, "cursor", None) if params else None
        start = int(cursor) if cursor else 0
        names = state["tools"][start : start + common.PAGE_SIZE]
        nxt = start + common.PAGE_SIZE
        return types.ListToolsResult(tools=[tool(n) for n in names], next_cursor=str(nxt) if nxt < len(state["tools"]) else None)

    async def call_tool(ctx, params):
        name = params.name
        if name not in state["tools"]:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")
        if name == "fails":
            return types.CallToolResult(content=[types.TextContent(type="text", text="the tool failed")], is_error=True)
        if name == "explodes":
            raise RuntimeError("boom")
        if name == "slow":
            meta = ctx.meta or {}
            token = meta.get("progress_token", meta.get("progressToken"))
            for i in range(1, 4):
                if token is not None:
                    await ctx.session.send_progress_notification(token, float(i), 3.0, related_request_id=ctx.request_id)
                await asyncio.sleep(0.05)
        if name == "mutate" and common.EXTRA_TOOL not in state["tools"]:
            state["tools"].append(common.EXTRA_TOOL)
            await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    return Server("dialect-sdk-server", on_list_tools=list_tools, on_call_tool=call_tool)


def serve(mode, port=None):
    from mcp.server.lowlevel.server import NotificationOptions

    common.setup_tracing(f"{STACK}-server")
    server = build_server()
    if mode == "stdio":
        from mcp.server.stdio import stdio_server

        async def main():
            async with stdio_server() as (r, w):
                await server.run(r, w, server.create_initialization_options(NotificationOptions(tools_changed=True)))

        asyncio.run(main())
        return
    import uvicorn
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings

    class Verifier:
        async def verify_token(self, token):
            if token == common.GOOD_TOKEN:
                return AccessToken(token=token, client_id="scenario-client", scopes=[common.REQUIRED_SCOPE])
            if token == common.NOSCOPE_TOKEN:
                return AccessToken(token=token, client_id="scenario-client", scopes=["tools:read"])
            return None

    auth = AuthSettings(
        issuer_url="http://127.0.0.1:9/",
        resource_server_url=f"http://127.0.0.1:{port}/mcp",
        required_scopes=[common.REQUIRED_SCOPE],
    )
    app = server.streamable_http_app(auth=auth, token_verifier=Verifier())
    uvicorn.run(common.wrap_asgi(app), host="127.0.0.1", port=int(port), log_level="warning")


# ----------------------------------------------------------------------------------------------
# Client
# ----------------------------------------------------------------------------------------------


async def list_all(client, log):
    cursor, pages = None, 0
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    log.append({"step": "tools/list", "pages": pages})


async def stdio_session(log):
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[os.path.abspath(__file__), "server", "stdio"], env=dict(os.environ))
    async with Client(params, mode="legacy") as client:
        log.append({"step": "initialize", "ok": True})
        await list_all(client, log)
        await call(client, log, "echo", {"text": "hi"})
        await call(client, log, "fails", {})
        await call(client, log, "explodes", {})
        await call(client, log, "missing", {})
        got = []

        async def on_progress(progress, total, message):
            got.append(progress)

        await call(client, log, "slow", {}, progress_callback=on_progress)
        log[-1]["progress"] = len(got)
        await call(client, log, "mutate", {})
        await asyncio.sleep(0.2)
        await list_all(client, log)


async def call(client, log, name, args, **kw):
    try:
        r = await client.call_tool(name, args, **kw)
        log.append({"step": f"tools/call {name}", "is_error": bool(r.is_error)})
    except Exception as e:  # the scenario records what the client saw, by class only
        log.append({"step": f"tools/call {name}", "exception": type(e).__name__, "code": getattr(e, "code", None)})


async def http_session(url, token, log, label):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
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
        url, token = os.environ["MCP_DIALECT_URL"], os.environ.get("MCP_DIALECT_TOKEN") or None
        asyncio.run(http_session(url, token, log, which))
    print(json.dumps(log), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        client_main()
