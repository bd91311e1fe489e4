#!/usr/bin/env python3
"""Send recorded OTLP/JSON traces (one ExportTraceServiceRequest a line, as tests/fixtures/*.jsonl)
to an OTLP/HTTP receiver as an application would, moved to the present.

The fixtures are dated when they were recorded; a trace UI searches the last hour by default, so
every span time is shifted by one offset (the latest end becomes now; the order and durations of
the spans are kept) and every trace id is replaced by a fresh random one (consistently within the
run), so a second run makes new traces instead of revising the first run's.

  python3 scripts/send_fixture.py [--endpoint http://127.0.0.1:14318] [FILE...]

Standard library only (docker-compose.yml runs it in a plain Python image). Waits up to --wait
seconds for the receiver to answer, retries 429/502/503/504, and exits non-zero when a request is
refused for good.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

TIME_KEYS = ("startTimeUnixNano", "endTimeUnixNano", "timeUnixNano")


def walk(v, fn):
    if isinstance(v, dict):
        for k in list(v):
            v[k] = fn(k, v[k])
            walk(v[k], fn)
    elif isinstance(v, list):
        for x in v:
            walk(x, fn)


def latest_end(requests):
    latest = 0

    def see(k, x):
        nonlocal latest
        if k in TIME_KEYS:
            latest = max(latest, int(x))
        return x

    for r in requests:
        walk(r, see)
    return latest


def to_now(requests, now_ns):
    shift = now_ns - latest_end(requests)
    ids = {}

    def move(k, x):
        if k in TIME_KEYS and int(x) > 0:
            return str(int(x) + shift)
        if k == "traceId" and isinstance(x, str) and x:
            return ids.setdefault(x, os.urandom(16).hex())
        return x

    for r in requests:
        walk(r, move)
    return requests


def post(endpoint, body, wait):
    url = endpoint.rstrip("/") + "/v1/traces"
    deadline = time.monotonic() + wait
    while True:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
                return
        except urllib.error.HTTPError as e:
            if e.code not in (429, 502, 503, 504) or time.monotonic() > deadline:
                raise SystemExit(f"{url}: HTTP {e.code} {e.read()[:200]!r}")
        except (urllib.error.URLError, OSError) as e:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url}: {e}")
        time.sleep(1)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", default=os.environ.get("OTLP_HTTP_ENDPOINT", "http://127.0.0.1:14318"))
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the receiver")
    p.add_argument("files", nargs="*", default=[os.path.join(here, "..", "tests", "fixtures", "eight_calls.jsonl")])
    a = p.parse_args()
    requests = []
    for f in a.files:
        with open(f, encoding="utf-8") as fh:
            requests += [json.loads(line) for line in fh if line.strip()]
    to_now(requests, time.time_ns())
    spans = 0
    for r in requests:
        post(a.endpoint, json.dumps(r).encode(), a.wait)
        spans += sum(len(ss.get("spans", [])) for rs in r.get("resourceSpans", []) for ss in rs.get("scopeSpans", []))
    print(f"sent {spans} spans in {len(requests)} requests to {a.endpoint}, moved to now")


if __name__ == "__main__":
    sys.exit(main())
