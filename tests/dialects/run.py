"""Run every scenario of one instrumentation stack against real client and server processes.

  run.py STACK OTLP_ENDPOINT

STACK is `sdk` (mcp 2.x built-in tracing), `fastmcp` (FastMCP native tracing), `traceloop`
(opentelemetry-instrumentation-mcp on mcp 1.x) or `logfire` (logfire.instrument_mcp on mcp 1.x).
Each client process has its own `service.name` (the verdict's `agent`), so the test can tell the
scenarios apart:

  STACK-stdio            over stdio: initialize, paginated tools/list, echo (success), fails
                         (isError), explodes (raised exception), missing (unknown tool), slow
                         (progress notifications), mutate (list-changed notification), re-list
  STACK-http-ok          streamable HTTP, good token: one successful call
  STACK-http-none        no token (401)
  STACK-http-bad         unknown token (401)
  STACK-http-noscope     token without the required scope (403)

The HTTP scenarios run twice: against a server with HTTP server tracing (`POST /mcp` spans,
agents `…-traced`) and one without. Prints one JSON object: agent -> what the client saw.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

SCRIPTS = {"sdk": "stack_sdk.py", "fastmcp": "stack_fastmcp.py", "traceloop": "stack_v1.py", "logfire": "stack_v1.py"}


def run_client(script, env):
    out = subprocess.run([sys.executable, script, "client"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, timeout=120, check=True)
    lines = [line for line in out.stdout.decode().splitlines() if line.startswith("[")]
    return json.loads(lines[-1]) if lines else []


def main():
    stack, endpoint = sys.argv[1], sys.argv[2]
    script = os.path.join(HERE, SCRIPTS[stack])
    base = dict(os.environ, MCP_DIALECT_OTLP=endpoint, MCP_DIALECT_STACK=stack, PYTHONUNBUFFERED="1")
    manifest = {}

    agent = f"{stack}-stdio"
    manifest[agent] = run_client(script, dict(base, MCP_DIALECT_AGENT=agent, MCP_DIALECT_SESSION="stdio"))

    for traced in (True, False):
        port = common.free_port()
        env = dict(base, MCP_DIALECT_HTTP_TRACING="1" if traced else "0")
        server = common.start_http_server(script, port, env)
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            for label, token in (("ok", common.GOOD_TOKEN), ("none", ""), ("bad", common.BAD_TOKEN), ("noscope", common.NOSCOPE_TOKEN)):
                agent = f"{stack}-http-{label}" + ("-traced" if traced else "")
                manifest[agent] = run_client(script, dict(env, MCP_DIALECT_AGENT=agent, MCP_DIALECT_SESSION=label, MCP_DIALECT_URL=url, MCP_DIALECT_TOKEN=token))
        finally:
            common.stop_server(server)
    print(json.dumps(manifest), flush=True)


if __name__ == "__main__":
    main()
