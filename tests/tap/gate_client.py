"""A test command for the CI gate's end-to-end test (tests/ci_gate.rs): an MCP client that calls
the tools named on the command line.

    python3 gate_client.py echo get-sum no-such-tool

With $MCP_HEALTH_TAP_URL (the gate's HTTP mode) it speaks streamable HTTP to the tap at
$MCP_HEALTH_TAP_URL/mcp; otherwise stdio, starting its server with $MCP_HEALTH_SERVER_COMMAND (the
gate's server command behind the tap), as a client's MCP configuration would.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

ARGS = {
    "echo": {"message": "sk-PLANTED-ARGUMENT-0c1d2e3f4a5b6c7d8e9f"},
    "get-sum": {"a": 2, "b": 3},
}


def http_main():
    url = os.environ["MCP_HEALTH_TAP_URL"] + "/mcp"
    session = {}

    def post(msg):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        headers.update(session)
        req = urllib.request.Request(url, data=json.dumps(msg).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            if "Mcp-Session-Id" in resp.headers:
                session["Mcp-Session-Id"] = resp.headers["Mcp-Session-Id"]
            body = resp.read().decode()
        if "id" not in msg:
            return None
        # A JSON body, or an event stream whose data lines carry the response.
        for chunk in [body] + [l[5:].strip() for l in body.splitlines() if l.startswith("data:")]:
            try:
                m = json.loads(chunk)
            except ValueError:
                continue
            if isinstance(m, dict) and m.get("id") == msg["id"]:
                return m
        sys.exit("no response to %s in %r" % (msg["method"], body[:300]))

    post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "gate-client", "version": "1"}}})
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    # The tools may be registered just after `initialized`: list until they are there.
    for attempt in range(50):
        listed = post({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        if any(t.get("name") == "echo" for t in listed.get("result", {}).get("tools", [])):
            break
        time.sleep(0.1)
    for n, tool in enumerate(sys.argv[1:], start=2):
        print(json.dumps(post({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": ARGS.get(tool, {})}})))


def main():
    if os.environ.get("MCP_HEALTH_TAP_URL"):
        return http_main()
    server = subprocess.Popen(
        ["bash", "-c", os.environ["MCP_HEALTH_SERVER_COMMAND"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )

    def send(msg):
        server.stdin.write((json.dumps(msg) + "\n").encode())
        server.stdin.flush()

    def wait(pred):
        while True:
            line = server.stdout.readline()
            if not line:
                sys.exit("the server closed its output")
            msg = json.loads(line)
            if pred(msg):
                return msg

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "gate-client", "version": "1"}}})
    wait(lambda m: m.get("id") == 0)
    # server-everything registers its tools after `initialized` and says so.
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    wait(lambda m: m.get("method") == "notifications/tools/list_changed")
    send({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    wait(lambda m: m.get("id") == 1)
    for n, tool in enumerate(sys.argv[1:], start=2):
        send({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": ARGS.get(tool, {})}})
        print(json.dumps(wait(lambda m: m.get("id") == n)))
    server.stdin.close()
    sys.exit(server.wait())


if __name__ == "__main__":
    main()
