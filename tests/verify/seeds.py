"""The seeds' experiment, live (issue 9): a real MCP server whose tools really create a record in a
local HTTP service, write a file and insert a row in SQLite, and a real MCP client (the `mcp` SDK
2.x) that drives calls through the evidence tap.

  seeds.py serve DIR     start, on 127.0.0.1 with free ports:
                           records  - the "system of record" (HTTP, bearer RECORDS_TOKEN)
                           mcp      - the MCP server (streamable HTTP, bearer auth)
                           legacy   - an MCP server without tools (tools/call -> -32601)
                           down     - an HTTP server answering 503
                         then print {"records": port, ...} on one line and serve until killed.
  seeds.py eight URLS_JSON     the eight calls of the seeds (URLs of the taps), log on stdout
  seeds.py eight-live REVISION URLS_JSON
                               the same eight calls, each the way an agent makes it: a fresh SDK client
                               that sets up its session first (REVISION 2025-11-25: mode="legacy",
                               initialize; 2026-07-28: mode="auto", server/discover), then tools/call.
                               Log entries say where the call ended ("phase": "setup" or "call"), what
                               the client saw (exception class, JSON-RPC code, is_error) and the
                               JSON-RPC methods it POSTed with their HTTP statuses.
  seeds.py reconcile URL       three calls whose response is lost (the tap's upstream timeout)

Planted secrets (tests/e2e_verify.rs checks that none leaves mcp-health or the tap): the tokens,
argument and result values containing PLANTED_*, the record service's path and the SQLite file.
"""

import asyncio
import hashlib
import json
import os
import socket
import sqlite3
import sys
import uuid

GOOD_TOKEN = "tok-good-PLANTED_BEARER_0123456789"
REVOKED_TOKEN = "tok-revoked-PLANTED_BEARER_9876543210"
NOSCOPE_TOKEN = "tok-noscope-PLANTED_BEARER_5555555555"
REQUIRED_SCOPE = "tickets:write"
RECORDS_TOKEN = os.environ.get("RECORDS_TOKEN", "rec-PLANTED_RECORDS_TOKEN")


def bind():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def records_app(store):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def authorized(request):
        return request.headers.get("authorization") == f"Bearer {RECORDS_TOKEN}"

    async def create(request):
        if not authorized(request):
            return Response(status_code=401)
        body = await request.json()
        rid = body.get("id") or f"rec-{uuid.uuid4().hex[:12]}"
        store[rid] = {"id": rid, "title": body.get("title")}
        return JSONResponse(store[rid], status_code=201)

    async def read(request):
        if not authorized(request):
            return Response(status_code=401)
        rec = store.get(request.path_params["rid"])
        return JSONResponse(rec) if rec else Response(status_code=404)

    return Starlette(routes=[Route("/records", create, methods=["POST"]), Route("/records/{rid}", read)])


def mcp_app(records_port, workdir):
    import httpx2
    from mcp import types
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.lowlevel.server import Server

    db = os.path.join(workdir, "items.db")
    con = sqlite3.connect(db)
    con.execute("create table if not exists items (id integer primary key, name text, version integer)")
    con.commit()
    con.close()

    def obj(schema_props):
        return {"type": "object", "properties": schema_props}

    tools = [
        types.Tool(name="create_ticket", description="Create a ticket", input_schema=obj({"title": {"type": "string"}, "priority": {"type": "string"}})),
        types.Tool(name="fails", description="Always fails", input_schema=obj({})),
        types.Tool(name="write_report", description="Write a report file", input_schema=obj({"name": {"type": "string"}, "text": {"type": "string"}})),
        types.Tool(name="insert_row", description="Insert a row", input_schema=obj({"name": {"type": "string"}, "version": {"type": "integer"}})),
        types.Tool(name="slow_commit", description="Commit, maybe, then hang", input_schema=obj({"id": {"type": "string"}, "title": {"type": "string"}, "mode": {"type": "string"}})),
    ]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def post_record(payload):
        async with httpx2.AsyncClient(timeout=5) as h:
            r = await h.post(f"http://127.0.0.1:{records_port}/records", json=payload, headers={"Authorization": f"Bearer {RECORDS_TOKEN}"})
            return r.json()

    def done(content):
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(content))], structured_content=content)

    async def call_tool(ctx, params):
        args = params.arguments or {}
        name = params.name
        if name == "create_ticket":
            if args.get("priority") == "low":
                # The bug of the seeds: says "created", creates nothing.
                return done({"id": f"rec-{uuid.uuid4().hex[:12]}", "status": "created"})
            rec = await post_record({"title": args.get("title")})
            return done({"id": rec["id"], "status": "created"})
        if name == "fails":
            return types.CallToolResult(content=[types.TextContent(type="text", text="PLANTED_ERROR_TEXT the tool failed")], is_error=True)
        if name == "write_report":
            path = os.path.join(workdir, f"{args['name']}.txt")
            data = args.get("text", "").encode()
            with open(path, "wb") as f:
                f.write(data)
            return done({"path": path, "sha256": hashlib.sha256(data).hexdigest()})
        if name == "insert_row":
            c = sqlite3.connect(db)
            cur = c.execute("insert into items (name, version) values (?, ?)", (args["name"], args["version"]))
            c.commit()
            rid = cur.lastrowid
            c.close()
            return done({"id": rid, "version": args["version"]})
        if name == "slow_commit":
            mode = args.get("mode")
            if mode == "commit_then_hang":
                await post_record({"id": args["id"], "title": args["title"]})
            elif mode == "wrong":
                await post_record({"id": args["id"], "title": "PLANTED_WRONG_TITLE"})
            await asyncio.sleep(4)
            return done({"id": args["id"], "status": "created"})
        raise ValueError("unknown tool")

    class Verifier:
        async def verify_token(self, token):
            if token == GOOD_TOKEN:
                return AccessToken(token=token, client_id="seeds-agent", scopes=[REQUIRED_SCOPE])
            if token == NOSCOPE_TOKEN:
                return AccessToken(token=token, client_id="seeds-agent", scopes=["tickets:read"])
            return None

    def build(port):
        server = Server("seeds-tickets", on_list_tools=list_tools, on_call_tool=call_tool)
        auth = AuthSettings(issuer_url="http://127.0.0.1:9/", resource_server_url=f"http://127.0.0.1:{port}/mcp", required_scopes=[REQUIRED_SCOPE])
        return server.streamable_http_app(auth=auth, token_verifier=Verifier(), stateless_http=True, json_response=True)

    return build


def legacy_app():
    from mcp.server.lowlevel.server import Server
    from mcp import types

    async def list_prompts(ctx, params):
        return types.ListPromptsResult(prompts=[])

    # No tools at all: a tools/call is a method this server does not have (-32601).
    return Server("seeds-legacy", on_list_prompts=list_prompts).streamable_http_app(stateless_http=True, json_response=True)


def down_app():
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def unavailable(request):
        return Response("upstream maintenance", status_code=503)

    return Starlette(routes=[Route("/{p:path}", unavailable, methods=["GET", "POST", "DELETE"])])


async def serve(workdir):
    import uvicorn

    socks = {k: bind() for k in ("records", "mcp", "legacy", "down")}
    ports = {k: s.getsockname()[1] for k, s in socks.items()}
    apps = {
        "records": records_app({}),
        "mcp": mcp_app(ports["records"], workdir)(ports["mcp"]),
        "legacy": legacy_app(),
        "down": down_app(),
    }
    servers = [uvicorn.Server(uvicorn.Config(apps[k], log_level="warning", lifespan="on")) for k in socks]
    tasks = [asyncio.create_task(srv.serve(sockets=[socks[k]])) for srv, k in zip(servers, socks)]
    while not all(s.started for s in servers):
        await asyncio.sleep(0.05)
    print(json.dumps(ports), flush=True)
    await asyncio.gather(*tasks)


async def one_call(url, token, name, args, initialize=True):
    """One tools/call through a fresh client; what the client saw (class and code only)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    entry = {"tool": name}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                r = await client.call_tool(name, args)
                entry["is_error"] = bool(getattr(r, "is_error", False))
    except BaseException as e:  # noqa: BLE001 - the failure is the scenario
        entry["exception"] = type(e).__name__
    return entry


async def raw_call(url, token, name, args):
    """A tools/call POSTed by the SDK's HTTP client without a prior initialize (the upstream is
    gone: the agent's session was made before)."""
    import httpx2

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    async with httpx2.AsyncClient(timeout=10) as http:
        r = await http.post(url, json=body, headers=headers)
        return {"tool": name, "status": r.status_code}


async def eight(urls):
    log = []
    ok, legacy, unresolved, down = urls["mcp"], urls["legacy"], urls["unresolved"], urls["down"]
    log.append(await raw_call(unresolved, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_unresolved"}))
    log.append(await raw_call(down, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_down"}))
    log.append(await one_call(legacy, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_legacy"}))
    log.append(await raw_call(ok, REVOKED_TOKEN, "create_ticket", {"title": "PLANTED_ARG_revoked"}))
    log.append(await raw_call(ok, NOSCOPE_TOKEN, "create_ticket", {"title": "PLANTED_ARG_noscope"}))
    log.append(await one_call(ok, GOOD_TOKEN, "fails", {}))
    log.append(await one_call(ok, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_lying", "priority": "low"}))
    log.append(await one_call(ok, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_printer on fire"}))
    return log


LIVE_MODES = {"2025-11-25": "legacy", "2026-07-28": "auto"}


def leaf(e):
    """The first non-group exception (the SDK raises from inside anyio task groups)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


async def live_call(revision, case, url, token, name, args):
    """One logical tool call through a fresh SDK client: session setup, then tools/call. The
    entry holds no argument value, result value or token: the case, the tool name, where the call
    ended, the exception class and JSON-RPC code, and the (method, HTTP status) of each POST."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    requests = []

    async def on_request(request):
        method = None
        if request.method == "POST":
            try:
                method = json.loads(request.content).get("method")
            except Exception:  # noqa: BLE001 - a body that is not one JSON-RPC message
                pass
        requests.append({"http": request.method, "method": method, "status": None})

    async def on_response(response):
        if requests:
            requests[-1]["status"] = response.status_code

    entry = {"case": case, "revision": revision, "tool": name, "phase": "setup"}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    hooks = {"request": [on_request], "response": [on_response]}
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=10, event_hooks=hooks) as http:
            async with Client(streamable_http_client(url, http_client=http), mode=LIVE_MODES[revision]) as client:
                entry["protocol_version"] = client.protocol_version
                entry["phase"] = "call"
                r = await client.call_tool(name, args)
                entry["is_error"] = bool(getattr(r, "is_error", False))
    except BaseException as e:  # noqa: BLE001 - the failure is the scenario
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        cause = leaf(e)
        entry["exception"] = type(cause).__name__
        if isinstance(cause, MCPError):
            entry["code"] = cause.code
    entry["requests"] = requests
    return entry


async def eight_live(revision, urls):
    """The eight calls of the seeds, in order, each by a fresh client on REVISION."""
    if revision not in LIVE_MODES:
        raise SystemExit(f"revision must be one of {sorted(LIVE_MODES)}, not {revision!r}")
    ok, legacy, unresolved, down = urls["mcp"], urls["legacy"], urls["unresolved"], urls["down"]
    calls = [
        ("unresolved", unresolved, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_unresolved"}),
        ("down", down, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_down"}),
        ("legacy", legacy, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_legacy"}),
        ("revoked", ok, REVOKED_TOKEN, "create_ticket", {"title": "PLANTED_ARG_revoked"}),
        ("noscope", ok, NOSCOPE_TOKEN, "create_ticket", {"title": "PLANTED_ARG_noscope"}),
        ("fails", ok, GOOD_TOKEN, "fails", {}),
        ("lying", ok, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_lying", "priority": "low"}),
        ("created", ok, GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_printer on fire"}),
    ]
    return [await live_call(revision, *c) for c in calls]


async def reconcile(url):
    log = []
    for mode in ("commit_then_hang", "hang", "wrong"):
        log.append(await one_call(url, GOOD_TOKEN, "slow_commit", {"id": f"op-{mode}", "title": "PLANTED_ARG_slow", "mode": mode}))
    return log


async def kinds(url):
    log = []
    log.append(await one_call(url, GOOD_TOKEN, "write_report", {"name": "PLANTED_PATH_q3", "text": "PLANTED_RESULT quarterly"}))
    log.append(await one_call(url, GOOD_TOKEN, "insert_row", {"name": "PLANTED_SQL_PARAM", "version": 3}))
    return log


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "serve":
        asyncio.run(serve(sys.argv[2]))
    elif cmd == "eight":
        print(json.dumps(asyncio.run(eight(json.loads(sys.argv[2])))), flush=True)
    elif cmd == "eight-live":
        print(json.dumps(asyncio.run(eight_live(sys.argv[2], json.loads(sys.argv[3])))), flush=True)
    elif cmd == "reconcile":
        print(json.dumps(asyncio.run(reconcile(sys.argv[2]))), flush=True)
    elif cmd == "one":
        print(json.dumps(asyncio.run(one_call(sys.argv[2], GOOD_TOKEN, "create_ticket", {"title": "PLANTED_ARG_one"}))), flush=True)
    elif cmd == "kinds":
        print(json.dumps(asyncio.run(kinds(sys.argv[2]))), flush=True)
