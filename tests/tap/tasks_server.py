#!/usr/bin/env python3
"""A small MCP server (revision 2026-07-28) with the tasks extension, over stdio: newline-delimited
JSON-RPC 2.0 on stdin/stdout, standard library only, no SDK. Driven by tasks_through_tap.py.

  tasks_server.py                 serve until EOF on stdin

Methods:
  server/discover   {resultType "complete", supportedVersions ["2026-07-28"],
                     capabilities {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}}}
  tools/list        the six tools below, one page, ttlMs 0, resultType "complete"
  tools/call        with "io.modelcontextprotocol/tasks" in
                    _meta["io.modelcontextprotocol/clientCapabilities"]["extensions"]: a CreateTaskResult
                    {resultType "task", task {taskId, status "working", createdAt, lastUpdatedAt, ttlMs,
                    pollIntervalMs}}. Without it: build_ok / build_fails / build_tool_error answer at
                    once, synchronously (a CallToolResult / a JSON-RPC error / an isError result); the
                    others answer -32021 (missing required client capability: the tasks extension).
  tasks/get {taskId}     {resultType "complete", taskId, status, createdAt, lastUpdatedAt, ttlMs,
                          pollIntervalMs, + "result": CallToolResult when completed,
                          + "error": {code, message} when failed}; an unknown or expired task: JSON-RPC
                          error -32602 "task not found"
  tasks/cancel {taskId}  {resultType "complete"}; the task becomes "cancelled" (a task already in a
                          terminal state: -32602)
  initialize             -32022 (this server speaks 2026-07-28 only)
  anything else          -32601; notifications are ignored

Tools (how their task behaves):
  build_ok          working for ~2.5 s, then completed with a normal result
  build_fails       working for ~1 s, then failed with error {code -32603, message "build failed"}
  build_cancel      working until tasks/cancel
  build_silent      working; every tasks/get for it is read and never answered
  build_expires     ttlMs 1500, working forever; once the TTL has passed, tasks/get answers -32602
  build_tool_error  working for ~1 s, then completed with an isError: true result

Status changes are computed from the clock when a request arrives, so no threads are needed.
Task ids are deterministic ("task-<n>-<tool>"); timestamps are real ISO 8601 UTC times.
"""

import json
import sys
import time
from datetime import datetime, timezone

REV = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"

WORK_SECONDS = 1.0
OK_WORK_SECONDS = 2.5
DEFAULT_TTL_MS = 60_000
POLL_MS = 300
EXPIRES_TTL_MS = 1500

TOOLS = ["build_ok", "build_fails", "build_cancel", "build_silent", "build_expires", "build_tool_error"]
TERMINAL = ("completed", "failed", "cancelled")


def tool_def(name):
    return {"name": name, "description": f"build scenario {name}",
            "inputSchema": {"type": "object", "properties": {"target": {"type": "string"}}}}


def iso(t):
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_result(text, is_error=False):
    return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": is_error}


class Task:
    def __init__(self, n, tool):
        self.id = f"task-{n}-{tool}"
        self.tool = tool
        self.created = time.time()
        self.updated = self.created
        self.ttl_ms = EXPIRES_TTL_MS if tool == "build_expires" else DEFAULT_TTL_MS
        self.poll_ms = POLL_MS
        self.cancelled_at = None

    def expired(self, now):
        return now > self.created + self.ttl_ms / 1000.0

    def status(self, now):
        if self.cancelled_at is not None:
            return "cancelled", self.cancelled_at
        # build_ok works longer: long enough for the service to report it `working` (its clocks
        # are looked at once a second) before it completes.
        work = OK_WORK_SECONDS if self.tool == "build_ok" else WORK_SECONDS
        if self.tool in ("build_ok", "build_fails", "build_tool_error") and now >= self.created + work:
            done = self.created + work
            return ("failed" if self.tool == "build_fails" else "completed"), done
        return "working", self.updated

    def view(self, now):
        status, updated = self.status(now)
        return {"taskId": self.id, "status": status, "createdAt": iso(self.created), "lastUpdatedAt": iso(updated),
                "ttlMs": self.ttl_ms, "pollIntervalMs": self.poll_ms}


class Server:
    def __init__(self):
        self.tasks = {}
        self.n = 0

    def handle(self, msg):
        """The response to one message, or None (a notification, or a request left unanswered)."""
        method, mid = msg.get("method"), msg.get("id")
        if method is None or "id" not in msg:
            return None
        params = msg.get("params") or {}
        ok = lambda result: {"jsonrpc": "2.0", "id": mid, "result": result}  # noqa: E731
        err = lambda code, message, data=None: {"jsonrpc": "2.0", "id": mid, "error": dict(  # noqa: E731
            {"code": code, "message": message}, **({"data": data} if data is not None else {}))}
        meta = params.get("_meta") or {}
        now = time.time()

        if method == "server/discover":
            return ok({"resultType": "complete", "supportedVersions": [REV],
                       "capabilities": {"tools": {}, "extensions": {TASKS_EXT: {}}},
                       "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "tasks-server", "version": "1.0.0"}}})
        if method == "initialize":
            return err(-32022, "Unsupported protocol version", {"supported": [REV], "requested": params.get("protocolVersion")})
        if method == "tools/list":
            return ok({"resultType": "complete", "tools": [tool_def(t) for t in TOOLS], "ttlMs": 0})
        if method == "tools/call":
            name = params.get("name")
            if name not in TOOLS:
                return err(-32602, f"Unknown tool: {name}")
            caps = meta.get(CAPS_KEY) or {}
            if TASKS_EXT not in (caps.get("extensions") or {}):
                if name == "build_ok":
                    return ok(text_result("build succeeded"))
                if name == "build_fails":
                    return err(-32603, "build failed")
                if name == "build_tool_error":
                    return ok(text_result("compiler reported errors", is_error=True))
                return err(-32021, f"Client did not declare required extension {TASKS_EXT!r}",
                           {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})
            self.n += 1
            task = Task(self.n, name)
            self.tasks[task.id] = task
            return ok({"resultType": "task", "task": task.view(now)})
        if method == "tasks/get":
            task = self.tasks.get(params.get("taskId"))
            if task is None or task.expired(now):
                return err(-32602, "task not found")
            if task.tool == "build_silent":
                return None  # read, never answered
            body = dict(task.view(now), resultType="complete")
            if body["status"] == "completed":
                body["result"] = (text_result("compiler reported errors", is_error=True) if task.tool == "build_tool_error"
                                  else text_result("build succeeded"))
            elif body["status"] == "failed":
                body["error"] = {"code": -32603, "message": "build failed"}
            return ok(body)
        if method == "tasks/cancel":
            task = self.tasks.get(params.get("taskId"))
            if task is None or task.expired(now):
                return err(-32602, "task not found")
            if task.status(now)[0] in TERMINAL:
                return err(-32602, "task is already in a terminal state")
            task.cancelled_at = now
            return ok({"resultType": "complete"})
        return err(-32601, "Method not found")


def main():
    server = Server()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            out = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        else:
            out = server.handle(msg) if isinstance(msg, dict) else None
        if out is not None:
            sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
