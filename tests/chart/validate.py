#!/usr/bin/env python3
"""Validate every object of a YAML stream (render.py's output, on stdin) against the schemas in
schemas/: the Kubernetes v1.31 strict schemas of the kinds the chart uses and the
prometheus-operator CRDs (see schemas/make.py). A kind without a schema here is an error, so a new
kind in the chart cannot go unchecked. Prints one line per error; exit 1 when there is any.
"""
import json
import pathlib
import sys

import jsonschema
import yaml

HERE = pathlib.Path(__file__).parent / "schemas"


def schema_file(api_version, kind):
    group, _, version = api_version.rpartition("/")
    name = kind.lower() + (f"-{group.split('.')[0]}" if group else "") + f"-{version}.json"
    return HERE / name


def main():
    errors, count = [], 0
    for doc in yaml.safe_load_all(sys.stdin):
        if doc is None:
            continue
        count += 1
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        path = schema_file(str(doc.get("apiVersion", "")), str(doc.get("kind", "")))
        if not path.is_file():
            errors.append(f"{what}: no schema {path.name} in tests/chart/schemas")
            continue
        schema = json.loads(path.read_text())
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
        for e in sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.absolute_path)):
            at = "/".join(str(p) for p in e.absolute_path)
            errors.append(f"{what}: at /{at}: {e.message[:300]}")
    for e in errors:
        print(e)
    if count == 0:
        print("no objects on stdin")
        return 1
    print(f"{count} objects, {len(errors)} errors", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
