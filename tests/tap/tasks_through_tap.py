"""The MCP 2026-07-28 tasks extension through `mcp-health tap` (stdio). A hand-written JSON-RPC client
(asyncio subprocess, newline-delimited JSON, standard library only) drives tasks_server.py through
the tap:

  tasks_through_tap.py TAP_BINARY OTLP_ENDPOINT

The server runs as `TAP tap --otlp-endpoint E --service-name tasks-stdio --server-address tasks-server
-- python tasks_server.py`. Every request carries the 2026-07-28 envelope in `_meta`
(io.modelcontextprotocol/protocolVersion "2026-07-28", clientInfo, and clientCapabilities
{"extensions": {"io.modelcontextprotocol/tasks": {}}}).

Sequence: server/discover, tools/list, then one tool at a time:
  tools/call TOOL -> {resultType "task", task {taskId, status "working", ttlMs, pollIntervalMs, ...}}
  then tasks/get {taskId} every pollIntervalMs until the status is terminal, except:
    build_cancel   two polls (working), tasks/cancel, one more poll (cancelled)
    build_silent   two polls the server never answers (sent pollIntervalMs apart), ~2 s wait, give up
                   (the two requests stay unanswered; the client sends nothing more for them)
    build_expires  poll until tasks/get answers the JSON-RPC error -32602 "task not found" (the task's
                   ttlMs of 1500 has passed)

Prints one JSON object on stdout: tool -> the final status the client saw, one of "completed",
"completed-is-error" (a completed task whose CallToolResult has isError: true), "failed", "cancelled",
"no-answer" (polls unanswered), "not-found" (-32602 from tasks/get), or "error <code>" for anything
unexpected. Never argument values. Poll counts go to stderr. Takes about 9 s.
"""

import asyncio
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "tasks_server.py")
REV = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"
TOOLS = ["build_ok", "build_fails", "build_cancel", "build_silent", "build_expires", "build_tool_error"]
TERMINAL = ("completed", "failed", "cancelled")
ANSWER_TIMEOUT = 5.0
SILENT_WAIT = 2.0


class RpcError(Exception):
    def __init__(self, error):
        super().__init__(error.get("message"))
        self.code = error.get("code")


class Conn:
    """One stdio connection: requests with ids, responses matched by id."""

    def __init__(self, proc):
        self.proc = proc
        self.ids = itertools.count(1)
        self.pending = {}
        self.reader = asyncio.create_task(self.read())

    async def read(self):
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            fut = self.pending.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in self.pending.values():
            fut.cancel()  # unanswered at EOF (build_silent's polls); awaiting one raises CancelledError

    def send(self, method, params=None):
        """Write a request; returns (id, future of its response)."""
        mid = next(self.ids)
        params = dict(params or {})
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": REV,
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-driver", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXT: {}}},
        }
        fut = asyncio.get_running_loop().create_future()
        self.pending[mid] = fut
        msg = {"jsonrpc": "2.0", "id": mid, "method": method, "params": params}
        self.proc.stdin.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())
        return mid, fut

    async def request(self, method, params=None, timeout=ANSWER_TIMEOUT):
        _, fut = self.send(method, params)
        await self.proc.stdin.drain()
        msg = await asyncio.wait_for(fut, timeout)
        if "error" in msg:
            raise RpcError(msg["error"])
        return msg["result"]


def final_of(task):
    status = task.get("status")
    if status == "completed" and (task.get("result") or {}).get("isError"):
        return "completed-is-error"
    return status


async def run_tool(conn, name, polls):
    created = await conn.request("tools/call", {"name": name, "arguments": {"target": "all"}})
    if created.get("resultType") != "task":
        return "completed-is-error" if created.get("isError") else "completed"
    task = created["task"]
    task_id, interval = task["taskId"], task.get("pollIntervalMs", 500) / 1000.0
    polls[name] = 0

    async def poll():
        polls[name] += 1
        await asyncio.sleep(interval)
        return await conn.request("tasks/get", {"taskId": task_id})

    if name == "build_silent":
        futs = []
        for _ in range(2):
            await asyncio.sleep(interval)
            polls[name] += 1
            futs.append(conn.send("tasks/get", {"taskId": task_id})[1])
            await conn.proc.stdin.drain()
        await asyncio.sleep(SILENT_WAIT)
        return "no-answer" if not any(f.done() for f in futs) else "answered"

    if name == "build_cancel":
        for _ in range(2):
            task = await poll()
        await conn.request("tasks/cancel", {"taskId": task_id})
        task = await poll()
        return final_of(task)

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            task = await poll()
        except RpcError as e:
            return "not-found" if e.code == -32602 else f"error {e.code}"
        if task.get("status") in TERMINAL:
            return final_of(task)
    return "still-" + str(task.get("status"))


async def session(tap, endpoint):
    args = ["tap", "--otlp-endpoint", endpoint, "--service-name", "tasks-stdio", "--server-address", "tasks-server", "--",
            sys.executable, SERVER]
    proc = await asyncio.create_subprocess_exec(tap, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    conn = Conn(proc)
    manifest, polls = {}, {}
    try:
        discover = await conn.request("server/discover", timeout=20)
        assert TASKS_EXT in discover["capabilities"].get("extensions", {}), "the server did not offer the tasks extension"
        listed = await conn.request("tools/list")
        names = [t["name"] for t in listed["tools"]]
        for name in TOOLS:
            if name not in names:
                manifest[name] = "not-listed"
                continue
            try:
                manifest[name] = await run_tool(conn, name, polls)
            except RpcError as e:
                manifest[name] = f"error {e.code}"
            except asyncio.TimeoutError:
                manifest[name] = "timeout"
    finally:
        proc.stdin.close()  # EOF: the server exits, the tap flushes its spans and exits
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        conn.reader.cancel()
    print(f"tasks_through_tap: polls {json.dumps(polls)}", file=sys.stderr)
    return manifest


def main():
    tap, endpoint = sys.argv[1], sys.argv[2]
    manifest = asyncio.run(session(tap, endpoint))
    print(json.dumps(manifest), flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"tasks_through_tap: {time.time() - t0:.1f}s", file=sys.stderr)
