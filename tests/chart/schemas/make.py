#!/usr/bin/env python3
"""Regenerate the Kubernetes schemas in this directory (kept in the repository so the chart test
runs offline; run this only to move to another Kubernetes version or add a kind).

Source: the strict schemas of Kubernetes v1.31 in the wheel of PyPI's kubernetes-validate 1.37.0
(`pip download --no-deps kubernetes-validate==1.37.0`, unzip), passed as WHEEL_DIR. Each kind the
chart renders becomes one standalone file: the kind's schema with the definitions it uses, moved
from the shared `_definitions.json` into its own `$defs` (refs rewritten to `#/$defs/…`), so a file
is validated alone and only the kinds used are kept. Strict: unknown fields are errors, as
`kubectl apply --validate=strict` makes them.

The prometheus-operator kinds (podmonitor-monitoring-v1.json, prometheusrule-monitoring-v1.json)
are the CRD schemas of the datreeio/CRDs-catalog repository (monitoring.coreos.com/
podmonitor_v1.json, prometheusrule_v1.json at commit 7b1e26ef), copied as they are.

    python3 make.py WHEEL_DIR
"""
import json
import pathlib
import sys

VERSION = "v1.31.0-local-strict"
# (file in the wheel, name here): the kinds templates/ render.
KINDS = [
    ("configmap-v1.json", "configmap-v1.json"),
    ("service-v1.json", "service-v1.json"),
    ("serviceaccount-v1.json", "serviceaccount-v1.json"),
    ("deployment-apps-v1.json", "deployment-apps-v1.json"),
    ("statefulset-apps-v1.json", "statefulset-apps-v1.json"),
    ("poddisruptionbudget-policy-v1.json", "poddisruptionbudget-policy-v1.json"),
]
PREFIX = "/api/_definitions.json#/$defs/"


def refs(node, out):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                out.append(v)
            else:
                refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


def rewrite(node):
    if isinstance(node, dict):
        return {k: ("#/$defs/" + v[len(PREFIX):] if k == "$ref" and v.startswith(PREFIX) else
                    "#/$defs/" + v[len("#/$defs/"):] if k == "$ref" else rewrite(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [rewrite(v) for v in node]
    return node


def main(wheel):
    src = pathlib.Path(wheel) / "kubernetes_validate" / "kubernetes-json-schema" / VERSION
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    here = pathlib.Path(__file__).parent
    for name, out in KINDS:
        schema = json.loads((src / name).read_text())
        want, seen = [], set()
        refs(schema, want)
        while want:
            r = want.pop()
            key = r.split("/$defs/", 1)[1]
            if key in seen:
                continue
            seen.add(key)
            refs(defs[key], want)
        schema = rewrite(schema)
        schema["$defs"] = {k: rewrite(defs[k]) for k in sorted(seen)}
        schema.pop("$id", None)
        (here / out).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"{out}: {len(seen)} definitions")


if __name__ == "__main__":
    main(sys.argv[1])
