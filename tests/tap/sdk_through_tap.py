"""The `mcp` SDK 2.x client and server of the dialect scenarios (tests/dialects/stack_sdk.py) with
their own tracing switched off (OTEL_SDK_DISABLED=true) and `mcp-health tap` in the path: every
span the service gets comes from the tap. Neither program is changed: the client's stdio server
command is prefixed with the tap, and its HTTP URL points at a tap in front of the server.

  sdk_through_tap.py TAP_BINARY OTLP_ENDPOINT

Scenarios (agent = the tap's --service-name):
  tap-sdk-stdio              initialize, paginated tools/list, echo, fails (isError), explodes
                             (raised exception), missing (unknown tool), slow (progress), mutate
                             (list-changed notification), re-list
  tap-sdk-http-ok            streamable HTTP, good token: one successful call
  tap-sdk-http-none          no token (401)
  tap-sdk-http-bad           unknown token (401)
  tap-sdk-http-noscope       token without the required scope (403)

Prints one JSON object: agent -> what the client saw. Run with the .venv-mcp interpreter.
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dialects"))
import common  # noqa: E402
import stack_sdk  # noqa: E402

# The SDK's own tracing is off; its exporter is given a port nobody listens on all the same.
os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["MCP_DIALECT_OTLP"] = "http://127.0.0.1:9"


async def stdio_session(tap, endpoint, log):
    from mcp import Client, StdioServerParameters

    args = ["tap", "--otlp-endpoint", endpoint, "--service-name", "tap-sdk-stdio", "--server-address", "sdk-server", "--",
            sys.executable, os.path.abspath(stack_sdk.__file__), "server", "stdio"]
    params = StdioServerParameters(command=tap, args=args, env=dict(os.environ))
    async with Client(params, mode="legacy") as client:
        log.append({"step": "initialize", "ok": True})
        await stack_sdk.list_all(client, log)
        await stack_sdk.call(client, log, "echo", {"text": "SECRET-SDK-ARGUMENT"})
        await stack_sdk.call(client, log, "fails", {})
        await stack_sdk.call(client, log, "explodes", {})
        await stack_sdk.call(client, log, "missing", {})
        got = []

        async def on_progress(progress, total, message):
            got.append(progress)

        await stack_sdk.call(client, log, "slow", {}, progress_callback=on_progress)
        log[-1]["progress"] = len(got)
        await stack_sdk.call(client, log, "mutate", {})
        await asyncio.sleep(0.2)
        await stack_sdk.list_all(client, log)


def start_tap(tap, upstream, endpoint, service):
    proc = subprocess.Popen([tap, "tap", "--listen", "127.0.0.1:0", "--upstream", upstream, "--otlp-endpoint", endpoint, "--service-name", service],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode()
    m = re.search(r"listening on (http://[0-9.:]+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"the tap said {line!r}")
    return proc, m.group(1)


def stop_tap(proc):
    proc.terminate()  # SIGTERM: the HTTP tap flushes its spans and exits
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main():
    tap, endpoint = sys.argv[1], sys.argv[2]
    manifest = {}
    log = []
    asyncio.run(stdio_session(tap, endpoint, log))
    manifest["tap-sdk-stdio"] = log

    port = common.free_port()
    server = common.start_http_server(os.path.abspath(stack_sdk.__file__), port, {"MCP_DIALECT_HTTP_TRACING": "0"})
    try:
        for label, token in (("ok", common.GOOD_TOKEN), ("none", ""), ("bad", common.BAD_TOKEN), ("noscope", common.NOSCOPE_TOKEN)):
            agent = f"tap-sdk-http-{label}"
            proc, url = start_tap(tap, f"http://127.0.0.1:{port}", endpoint, agent)
            log = []
            try:
                asyncio.run(stack_sdk.http_session(f"{url}/mcp", token or None, log, label))
            finally:
                stop_tap(proc)
            manifest[agent] = log
    finally:
        common.stop_server(server)
    print(json.dumps(manifest), flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"sdk_through_tap: {time.time() - t0:.1f}s", file=sys.stderr)
