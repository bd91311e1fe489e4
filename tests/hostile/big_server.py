"""A hostile streamable-HTTP MCP server that answers with as many bytes as it likes (standard
library only), for the tap's memory bounds (tests/e2e_hostile.rs).

  big_server.py PORT_FILE      listen on a free loopback port, write it to PORT_FILE, serve

POST /mcp:
  initialize           -> a result, with an Mcp-Session-Id that is a JWT-shaped credential
  tools/call big       -> a 14 MB result (text content and structuredContent.blob), plus
                          structuredContent.id
  tools/call flood     -> text/event-stream: 200 MB of empty `data:` lines, one event that never
                          ends inside the parse limit, then a small real response
anything else          -> -32601
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BIG = "x" * (14 << 20)
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJQTEFOVEVEX1NFU1NJT04ifQ.PLANTEDSIG"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, obj, extra=None):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        msg = json.loads(self.rfile.read(n) or b"{}")
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "initialize":
            self.send_json({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "big", "version": "1"}}},
                           {"Mcp-Session-Id": JWT})
        elif method == "tools/call" and msg["params"]["name"] == "big":
            self.send_json({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": BIG}], "structuredContent": {"id": "r-1", "blob": BIG}}})
        elif method == "tools/call" and msg["params"]["name"] == "flood":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"data:\n" * (1 << 20)  # 6 MiB of empty data lines
            frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            for _ in range(34):
                self.wfile.write(frame)
            tail = b"\n" + b"data: " + json.dumps({"jsonrpc": "2.0", "id": mid, "result": {"content": []}}).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n")
        else:
            self.send_json({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(srv.server_address[1]))
    srv.serve_forever()
