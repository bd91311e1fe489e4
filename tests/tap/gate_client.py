"""A test command for the CI gate's end-to-end test (tests/ci_gate.rs): an MCP client over stdio
that starts its server with $MCP_HEALTH_SERVER_COMMAND (the gate's server command behind the tap),
as a client's MCP configuration would, and calls the tools named on the command line.

    python3 gate_client.py echo get-sum no-such-tool
"""

import json
import os
import subprocess
import sys

ARGS = {
    "echo": {"message": "sk-PLANTED-ARGUMENT-0c1d2e3f4a5b6c7d8e9f"},
    "get-sum": {"a": 2, "b": 3},
}


def main():
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
