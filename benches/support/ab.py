#!/usr/bin/env python3
"""Interleaved A/B of two mcp-health builds under the same load: spans per service CPU-second,
rounds alternating A and B so that background load on a shared machine falls on both alike.
usage: ab.py BIN_A BIN_B [rounds] [secs]"""
import os, socket, subprocess, sys, tempfile, time, re, statistics
A, B = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
secs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0
def start(binary):
    d = tempfile.mkdtemp(); g, pr, h = port(), port(), port()
    cfg = f"""receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{g}
processors:
  mcp_health:
    decision_wait: 1s
    max_wait: 5s
    max_chains: 2000000
    max_bytes: 4294967296
    queue_size: 64
    max_decided: 0
exporters:
  prometheus:
    endpoint: 127.0.0.1:{pr}
extensions:
  health_check:
    endpoint: 127.0.0.1:{h}
service:
  telemetry:
    logs:
      level: warn
"""
    open(f"{d}/c.yaml", "w").write(cfg)
    p = subprocess.Popen([binary, "serve", "--config", f"{d}/c.yaml"], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", h), 0.2).close(); break
        except OSError:
            time.sleep(0.05)
    return p, g
def load(binary, g, s):
    out = subprocess.run([binary, "loadgen", "--endpoint", f"127.0.0.1:{g}", "--seconds", str(s)], capture_output=True, text=True).stdout
    m = re.search(r"(\d+) spans", out.replace(",", ""))
    return int(m.group(1)) if m else 0, out
svcs = {"A": start(A), "B": start(B)}
for k, (p, g) in svcs.items():
    load(A, g, 2)
time.sleep(2.5)
res = {"A": [], "B": []}
for r in range(rounds):
    for k in (["A", "B"] if r % 2 == 0 else ["B", "A"]):
        p, g = svcs[k]
        # The window's spans are decided up to decision_wait (1 s) after the load stops: its CPU
        # is read once they are, so each window carries its own tail and starts from rest.
        c0 = cpu(p.pid); n, out = load(A, g, secs); time.sleep(2.5); c1 = cpu(p.pid)
        res[k].append(n / max(c1 - c0, 1e-9))
        print(f"round {r+1} {k}: {n} spans, {c1-c0:.2f} CPU-s, {n/max(c1-c0,1e-9):.0f} spans per CPU-second", flush=True)
for k in svcs:
    svcs[k][0].kill()
ma, mb = statistics.median(res["A"]), statistics.median(res["B"])
print(f"median spans per CPU-second: A {ma:.0f}, B {mb:.0f}, B/A {mb/ma:.3f}")
