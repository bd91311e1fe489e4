#!/usr/bin/env python3
"""`helm template` for tests/chart.rs, without the helm binary (none is installable here).

helm-python-sdk (PyPI) binds Helm v4's own Go SDK (chart loader, values coalescing, schema check,
engine) in its wheel's libhelm_c.so, so this renders as `helm template` does:
    render.py CHART [--name R] [--namespace N] [-f VALUES.yaml]... [--set K=V]...
prints the manifests as one YAML stream with `# Source:` lines; a bad value or template: the
error on stderr, exit 1. `--set` and `-f` are applied in order, `--set` last, as helm does.
`--notes` prints the rendered NOTES.txt instead; `--lint` runs `helm lint --strict` (Kubernetes
1.31) with the values and fails on any warning or error.
"""
import argparse
import sys

import helm_python as helm


def merge(dst, src):
    """Helm's merge of one values layer over another: maps deep, everything else replaced."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def main():
    p = argparse.ArgumentParser()
    p.add_argument("chart")
    p.add_argument("--name", default="mcp-health")
    p.add_argument("--namespace", default="observability")
    p.add_argument("-f", "--values", action="append", default=[])
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--notes", action="store_true")
    p.add_argument("--lint", action="store_true")
    a = p.parse_args()
    values = {}
    for f in a.values:
        with open(f, encoding="utf-8") as fh:
            merge(values, helm.values_from_yaml(fh.read()))
    for s in a.set:
        merge(values, helm.parse_set_string(s))
    if a.lint:
        report = helm.lint(a.chart, values, strict=True, namespace=a.namespace, kube_version="v1.31.0")
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        for m in bad:
            print(f"render.py --lint: {m}", file=sys.stderr)
        return 1 if bad else 0
    try:
        with helm.Chart.load(a.chart) as chart:
            # helm template checks the coalesced values (defaults + overrides) against
            # values.schema.json before it renders; so does this.
            chart.validate_schema(chart.merge_values(values))
            manifests = chart.render(values, name=a.name, namespace=a.namespace, is_install=True)
    except helm.HelmError as e:  # values, schema, template and load errors alike
        print(f"render.py: {e}", file=sys.stderr)
        return 1
    if a.notes:
        sys.stdout.write(next(v for k, v in manifests.items() if k.endswith("/NOTES.txt")))
        return 0
    for path in sorted(manifests):
        body = manifests[path].strip()
        if not body or path.endswith("NOTES.txt"):
            continue
        for doc in body.split("\n---\n"):
            if doc.strip():
                sys.stdout.write(f"---\n# Source: {path}\n{doc.strip()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
