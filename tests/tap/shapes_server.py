"""An MCP server whose answers are shapes, not sizes (issue 35), for tests/e2e_tap_shapes.rs.
Standard library only.

  shapes_server.py                 stdio: newline-delimited JSON-RPC on stdin/stdout
  shapes_server.py --http PORT_FILE streamable HTTP on a free loopback port (POST /mcp, JSON
                                   bodies), the port written to PORT_FILE

  initialize        -> a result
  tools/call zeros  -> {"structuredContent": {"id": "1", "pad": [0, 0, ... 7 000 000 zeros]}} (14 MB)
  tools/call deep   -> {"structuredContent": {"id": "1", "pad": [[[... 0 ...]]]}}: one million
                       nested one-element arrays
  tools/call echo, echo_pad -> {"structuredContent": {"id": "1"}}, whatever the arguments (the client
                       sends the shapes above as arguments)
  ping              -> {}
  anything else     -> -32601

Requests are read by their head only (a million nested arrays is past Python's recursion limit):
the client writes `{"jsonrpc": "2.0", "id": N, "method": M, "params": {"name": T, ...` in that
order.
"""

import re
import sys

ZEROS = "[" + "0," * 6_999_999 + "0]"
DEEP = "[" * 1_000_000 + "0" + "]" * 1_000_000
HEAD = re.compile(rb'"id":\s*(\d+)\s*,\s*"method":\s*"([^"]+)"(?:\s*,\s*"params":\s*\{\s*"name":\s*"([^"]*)")?')


def answer(message: bytes):
    """The answer to one message (bytes), or None for a notification."""
    m = HEAD.search(message[:512])
    if not m:
        return None
    mid, method, tool = int(m.group(1)), m.group(2).decode(), (m.group(3) or b"").decode()
    if method == "initialize":
        result = '{"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "shapes", "version": "1"}}'
    elif method == "ping":
        result = "{}"
    elif method == "tools/call" and tool == "zeros":
        result = '{"structuredContent": {"id": "1", "pad": %s}}' % ZEROS
    elif method == "tools/call" and tool == "deep":
        result = '{"structuredContent": {"id": "1", "pad": %s}}' % DEEP
    elif method == "tools/call" and tool in ("echo", "echo_pad"):
        result = '{"structuredContent": {"id": "1"}}'
    else:
        return ('{"jsonrpc": "2.0", "id": %d, "error": {"code": -32601, "message": "no"}}' % mid).encode()
    return ('{"jsonrpc": "2.0", "id": %d, "result": %s}' % (mid, result)).encode()


def stdio():
    for line in sys.stdin.buffer:
        out = answer(line)
        if out is not None:
            sys.stdout.buffer.write(out + b"\n")
            sys.stdout.buffer.flush()


def http(port_file):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            out = answer(body)
            if out is None:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file, "w") as f:
        f.write(str(srv.server_address[1]))
    srv.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        http(sys.argv[2])
    else:
        stdio()
