#!/usr/bin/env python3
"""A tiny, deterministic MCP server for the evidence-tap tests (standard library only).

stdio (default): newline-delimited JSON-RPC on stdin/stdout, as the MCP stdio transport.
    fake_mcp_server.py [--exit-code N]        exits with N at EOF on stdin
HTTP: a streamable-HTTP endpoint at /mcp with bearer auth.
    fake_mcp_server.py --http PORT            PORT 0: any free port; prints "PORT <n>" on stdout
    fake_mcp_server.py --http PORT --tls CERT KEY   the same over TLS (an https:// upstream)

Tools: echo (echoes `text`), fail (isError), slow (progress notifications when the request
supplies a progressToken), change_catalog (removes `add`, adds `search`, then sends
notifications/tools/list_changed), write_file (HTTP: needs scope files:write). `tools/list` pages
hold three tools each (cursor "page-<n>"). Nothing depends on time or randomness, so two runs with
the same input produce the same bytes.

HTTP tokens: none -> 401 (no error code); `bad-token` -> 401 invalid_token; `read-token` -> 403
insufficient_scope (scope files:write) on write_file; `full-token` -> everything. `slow` and
`change_catalog` answer as text/event-stream (notifications, then the response); the rest as
application/json.
"""

import hashlib
import json
import sys
import threading
import time

PAGE = 3

BASE_TOOLS = [
    {"name": "echo", "description": "Echo the text back", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "add", "description": "Add two numbers", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}},
    {"name": "fail", "description": "Always fails", "inputSchema": {"type": "object"}},
    {"name": "slow", "description": "Reports progress", "inputSchema": {"type": "object"}},
    {"name": "change_catalog", "description": "Changes the tool list", "inputSchema": {"type": "object"}},
    {"name": "write_file", "description": "Writes a file", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}, "annotations": {"destructiveHint": True}},
]
SEARCH = {"name": "search", "description": "Search the docs", "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


class Server:
    def __init__(self):
        self.tools = [dict(t) for t in BASE_TOOLS]
        self.lock = threading.Lock()

    def page(self, cursor):
        with self.lock:
            start = 0
            if cursor:
                if not cursor.startswith("page-"):
                    return None
                start = int(cursor[5:]) * PAGE
            tools = self.tools[start:start + PAGE]
            result = {"tools": tools}
            if start + PAGE < len(self.tools):
                result["nextCursor"] = "page-%d" % (start // PAGE + 1)
            return result

    def change(self):
        with self.lock:
            self.tools = [t for t in self.tools if t["name"] != "add"] + [SEARCH]

    def handle(self, msg, send):
        """Handle one client message; `send(obj)` writes a server message. Returns the response or None."""
        method = msg.get("method")
        mid = msg.get("id")
        if method is None or mid is None:
            return None  # a notification or a response
        params = msg.get("params") or {}
        ok = lambda result: {"jsonrpc": "2.0", "id": mid, "result": result}
        err = lambda code, message: {"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": message}}
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in ("2025-03-26", "2025-06-18", "2025-11-25") else "2025-11-25"
            return ok({"protocolVersion": version, "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "fake-mcp", "version": "1.0.0"}})
        if method == "ping":
            return ok({})
        if method == "tools/list":
            page = self.page(params.get("cursor"))
            if page is None:
                return err(-32602, "Invalid cursor")
            return ok(page)
        if method == "tools/call":
            name = params.get("name")
            args = params.get("arguments") or {}
            if name == "echo":
                return ok({"content": [{"type": "text", "text": str(args.get("text", ""))}]})
            if name == "fail":
                return ok({"isError": True, "content": [{"type": "text", "text": "the tool failed: SECRET-TOOL-FAILURE-TEXT"}]})
            if name == "slow":
                token = (params.get("_meta") or {}).get("progressToken")
                if token is not None:
                    for i in (1, 2, 3):
                        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": i, "total": 3, "message": "step %d SECRET-PROGRESS-TEXT" % i}})
                        time.sleep(0.02)
                return ok({"content": [{"type": "text", "text": "done slowly"}]})
            if name == "change_catalog":
                self.change()
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                return ok({"content": [{"type": "text", "text": "catalog changed"}]})
            if name == "write_file":
                return ok({"content": [{"type": "text", "text": "written"}]})
            return err(-32602, "Unknown tool: %s" % name)
        return err(-32601, "Method not found: %s" % method)


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def run_stdio(exit_code):
    server = Server()
    out = sys.stdout.buffer
    sys.stderr.write("fake-mcp-server: ready on stdio\n")
    sys.stderr.flush()

    def send(obj):
        out.write(dumps(obj).encode() + b"\n")
        out.flush()

    for line in sys.stdin.buffer:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})
            continue
        resp = server.handle(msg, send)
        if resp is not None:
            send(resp)
    sys.exit(exit_code)


def run_http(port, tls=None):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server = Server()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def plain(self, status, headers=(), body=b""):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.plain(405, [("Allow", "POST, DELETE")])

        def do_DELETE(self):
            self.plain(200)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path.split("?")[0] != "/mcp":
                return self.plain(404)
            auth = self.headers.get("Authorization")
            if auth is None:
                return self.plain(401, [("WWW-Authenticate", 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"')])
            if auth == "Bearer bad-token":
                return self.plain(401, [("WWW-Authenticate", 'Bearer error="invalid_token", error_description="The access token expired SECRET-CHALLENGE-TEXT"')])
            if auth not in ("Bearer read-token", "Bearer full-token"):
                return self.plain(401, [("WWW-Authenticate", 'Bearer error="invalid_token"')])
            try:
                msg = json.loads(body)
            except ValueError:
                return self.plain(400, [("Content-Type", "application/json")], dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}).encode())
            if msg.get("method") is None or msg.get("id") is None:
                return self.plain(202)
            headers = []
            if msg["method"] == "initialize":
                sid = "sess-" + hashlib.sha256(body).hexdigest()[:16]
                headers.append(("Mcp-Session-Id", sid))
            elif not self.headers.get("Mcp-Session-Id"):
                return self.plain(400, [("Content-Type", "text/plain")], b"missing Mcp-Session-Id\n")
            params = msg.get("params") or {}
            if msg["method"] == "tools/call" and params.get("name") == "write_file" and auth != "Bearer full-token":
                return self.plain(403, [("WWW-Authenticate", 'Bearer error="insufficient_scope", scope="files:write", error_description="SECRET-CHALLENGE-TEXT"')])
            streaming = msg["method"] == "tools/call" and params.get("name") in ("slow", "change_catalog")
            if not streaming:
                resp = server.handle(msg, lambda _o: None)
                return self.plain(200, headers + [("Content-Type", "application/json")], dumps(resp).encode())
            # An SSE response: notifications, then the response; the stream closes the connection.
            self.send_response(200)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            counter = [0]

            def send(obj):
                counter[0] += 1
                self.wfile.write(("id: %d\nevent: message\ndata: %s\n\n" % (counter[0], dumps(obj))).encode())
                self.wfile.flush()

            resp = server.handle(msg, send)
            send(resp)

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    if tls:
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls[0], tls[1])
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    sys.stdout.write("PORT %d\n" % httpd.server_address[1])
    sys.stdout.flush()
    httpd.serve_forever()


def main(argv):
    if len(argv) >= 2 and argv[0] == "--http":
        tls = argv[3:5] if len(argv) >= 5 and argv[2] == "--tls" else None
        run_http(int(argv[1]), tls)
        return
    exit_code = 0
    if len(argv) >= 2 and argv[0] == "--exit-code":
        exit_code = int(argv[1])
    run_stdio(exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
