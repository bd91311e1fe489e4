#!/usr/bin/env python3
"""Parse every PromQL expression of the operations package and check it against what mcp-health serves.

    check_promql.py [--rules FILE]... [--dashboard FILE]... [--promtool-rules OUT]

Expressions: each `expr` of the Prometheus rule files, each target `expr` and each query variable
of the Grafana dashboards (Grafana variables are substituted first: $__rate_interval and friends by
a duration, dashboard variables by `.*`; a variable the dashboard does not define is an error).
Each one is
  * parsed with promql-parser (a PromQL parser independent of Prometheus; promtool checks the rule
    files with Prometheus's own parser);
  * checked against tests/ops/metrics.json: only metrics mcp-health serves, only their labels in
    matchers, `by`, `without`, `on` and `ignoring` (plus labels made by label_replace/label_join),
    and rate/increase/irate/resets only over counters, *_over_time-free gauges never under rate().
With --promtool-rules OUT the dashboard expressions are also written as recording rules to OUT, so
`promtool check rules OUT` puts them through Prometheus's own parser as well.
Exit status 0 when all pass; every problem is printed with where it came from.
"""

import argparse
import json
import os
import re
import sys

import promql_parser as pp
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOGUE = json.load(open(os.path.join(HERE, "metrics.json")))
METRICS = CATALOGUE["metrics"]
COMMON = set(CATALOGUE["common_labels"])

# Grafana's global variables that stand for durations or numbers.
DURATION_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "6h"}
NUMBER_VARS = {"__interval_ms": "60000", "__range_s": "21600", "__range_ms": "21600000"}
VAR_RE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
COUNTER_FUNCS = {"rate", "increase", "irate", "resets"}


class Checker:
    def __init__(self):
        self.problems = []
        self.count = 0
        self.promtool_rules = []

    def problem(self, where, msg):
        self.problems.append(f"{where}: {msg}")

    # ------------------------------------------------------------------ substitution
    def substitute(self, where, expr, defined):
        def repl(m):
            name = m.group(1) or m.group(2) or m.group(3)
            if name in DURATION_VARS:
                return DURATION_VARS[name]
            if name in NUMBER_VARS:
                return NUMBER_VARS[name]
            if name in defined:
                return ".*"
            self.problem(where, f"uses ${name}, which the dashboard does not define")
            return ".*"

        return VAR_RE.sub(repl, expr)

    # ------------------------------------------------------------------ parsing and checks
    def check(self, where, expr):
        self.count += 1
        try:
            ast = pp.parse(expr)
        except Exception as e:  # promql_parser raises ValueError with the parser's message
            self.problem(where, f"does not parse: {e}\n    {expr}")
            return None
        self.check_tree(where, ast)
        return ast

    def selector_metrics(self, where, vs):
        """The catalogue entries a vector selector can match (several for a __name__ regex)."""
        matchers = list(vs.matchers.matchers) if vs.matchers is not None else []
        if vs.name:
            if vs.name not in METRICS:
                self.problem(where, f"metric {vs.name} is not served by mcp-health (tests/ops/metrics.json)")
                return []
            return [vs.name]
        names = []
        for m in matchers:
            if m.name == "__name__":
                op = str(m.op)
                if op.endswith("Equal") and "Not" not in op:
                    names = [m.value] if m.value in METRICS else []
                elif op.endswith("Re") and "Not" not in op:
                    rx = re.compile(f"^(?:{m.value})$")
                    names = [n for n in METRICS if rx.match(n)]
                if not names:
                    self.problem(where, f"__name__ {m.value!r} matches no metric mcp-health serves")
        return names

    def labels_of(self, names):
        out = set(COMMON) | {"__name__"}
        for n in names:
            out |= set(METRICS[n]["labels"])
        return out

    def check_tree(self, where, ast):
        """Walk bottom-up: return the set of labels the expression's series can carry."""
        if isinstance(ast, pp.VectorSelector):
            names = self.selector_metrics(where, ast)
            if not names:
                return set()
            labels = self.labels_of(names)
            for m in ast.matchers.matchers if ast.matchers is not None else []:
                if m.name not in labels:
                    self.problem(where, f"label {m.name!r} is not a label of {', '.join(names)}")
            return labels
        if isinstance(ast, pp.MatrixSelector):
            return self.check_tree(where, ast.vector_selector)
        if isinstance(ast, pp.Call):
            fname = ast.func.name
            arg_labels = [self.check_tree(where, a) for a in ast.args]
            labels = set().union(*arg_labels) if arg_labels else set()
            if fname in COUNTER_FUNCS and ast.args:
                for n in self.selected_names(ast.args[0]):
                    if METRICS[n]["type"] not in ("counter", "histogram"):
                        self.problem(where, f"{fname}() over {n}, which is a {METRICS[n]['type']}, not a counter")
            if fname in ("label_replace", "label_join") and len(ast.args) >= 2:
                dst = ast.args[1]
                if isinstance(dst, pp.StringLiteral):
                    labels.add(dst.val)
            if fname in ("vector", "time", "scalar"):
                labels = set()
            return labels
        if isinstance(ast, pp.AggregateExpr):
            inner = self.check_tree(where, ast.expr)
            if ast.param is not None:
                self.check_tree(where, ast.param)
            mod = ast.modifier
            if mod is not None:
                mod_labels = list(mod.labels)
                for lb in mod_labels:
                    if inner and lb not in inner:
                        self.problem(where, f"aggregates by {lb!r}, which no series under it carries ({', '.join(sorted(inner))})")
                if "By" in str(mod.type):
                    return set(mod_labels)
                return inner - set(mod_labels)
            return set()
        if isinstance(ast, pp.BinaryExpr):
            left = self.check_tree(where, ast.lhs)
            right = self.check_tree(where, ast.rhs)
            mod = ast.modifier
            both = left | right
            if mod is not None and mod.matching is not None:
                for lb in mod.matching.labels:
                    if lb not in both:
                        self.problem(where, f"matches on {lb!r}, which neither side carries")
                for lb in getattr(mod, "group_labels", None) or []:
                    if lb not in both:
                        self.problem(where, f"group_left/right copies {lb!r}, which neither side carries")
            return left or right
        if isinstance(ast, pp.ParenExpr):
            return self.check_tree(where, ast.expr)
        if isinstance(ast, pp.UnaryExpr):
            return self.check_tree(where, ast.expr)
        if isinstance(ast, pp.SubqueryExpr):
            return self.check_tree(where, ast.expr)
        return set()  # literals

    def selected_names(self, ast):
        """Metric names of the selector directly under a range-vector argument (a subquery's inner
        expression is checked on its own)."""
        if not isinstance(ast, pp.MatrixSelector):
            return []
        vs = ast.vector_selector
        if vs.name:
            return [vs.name] if vs.name in METRICS else []
        names = []
        for m in vs.matchers.matchers if vs.matchers is not None else []:
            op = str(m.op)
            if m.name == "__name__" and op.endswith("Re") and "Not" not in op:
                rx = re.compile(f"^(?:{m.value})$")
                names = [n for n in METRICS if rx.match(n)]
            elif m.name == "__name__" and op.endswith("Equal") and "Not" not in op:
                names = [m.value] if m.value in METRICS else []
        return names

    # ------------------------------------------------------------------ inputs
    def rules_file(self, path):
        doc = yaml.safe_load(open(path))
        for g in doc.get("groups", []):
            for i, r in enumerate(g.get("rules", [])):
                name = r.get("alert") or r.get("record") or f"rule {i}"
                self.check(f"{path}: group {g['name']}: {name} (#{i})", r["expr"])

    def dashboard(self, path):
        dash = json.load(open(path))
        variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
        defined = set(variables)
        for name, v in variables.items():
            if v.get("type") != "query":
                continue
            q = v.get("query")
            qs = q.get("query") if isinstance(q, dict) else q
            where = f"{path}: variable ${name}"
            m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*", qs or "")
            if m:
                ast = self.check(where, self.substitute(where, m.group(1), defined - {name}))
                if ast is not None:
                    labels = self.check_tree(where, ast)
                    if labels and m.group(2) not in labels:
                        self.problem(where, f"label_values of {m.group(2)!r}, which {m.group(1)} does not carry")
            elif qs:
                self.check(where, self.substitute(where, qs, defined - {name}))

        panels = []
        for p in dash.get("panels", []):
            panels.append(p)
            panels.extend(p.get("panels", []))
        for p in panels:
            for t in p.get("targets", []):
                if "expr" not in t:
                    continue
                where = f"{path}: panel {p.get('id')} {p.get('title')!r} query {t.get('refId')}"
                expr = self.substitute(where, t["expr"], defined)
                if self.check(where, expr) is not None:
                    self.promtool_rules.append(
                        {"record": f"dashboard:panel_{p.get('id')}_{t.get('refId')}", "expr": expr}
                    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rules", action="append", default=[])
    ap.add_argument("--dashboard", action="append", default=[])
    ap.add_argument("--promtool-rules")
    a = ap.parse_args()
    c = Checker()
    for f in a.rules:
        c.rules_file(f)
    for f in a.dashboard:
        c.dashboard(f)
    if a.promtool_rules:
        with open(a.promtool_rules, "w") as out:
            yaml.safe_dump({"groups": [{"name": "dashboard-expressions", "rules": c.promtool_rules}]}, out, sort_keys=False)
    if c.count == 0:
        c.problem("input", "no PromQL expression found")
    for p in c.problems:
        print(f"FAIL {p}", file=sys.stderr)
    print(f"{c.count} PromQL expressions checked, {len(c.problems)} problem(s)")
    return 1 if c.problems else 0


if __name__ == "__main__":
    sys.exit(main())
