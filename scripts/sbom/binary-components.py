#!/usr/bin/env python3
"""Narrow cdxgen's CycloneDX document of the Cargo workspace to the crates of the shipped binary.

cdxgen reads Cargo.lock, which lists every crate of the workspace: the tests' dev-dependencies and
crates for other platforms too. An SBOM describes what ships, so this keeps the components that
`cargo metadata --filter-platform TRIPLE` reaches from the root package through normal and build
dependencies (the build dependencies generate code that is compiled into the binary), drops the
rest from `components` and `dependencies`, and fills in each kept crate's license expression from
the crate's own manifest where cdxgen gave none. cdxgen's `evidence` (the lock file's absolute path
on the build machine, at a fixed confidence) is dropped: a published SBOM names no build paths.

    binary-components.py CDXGEN_JSON CARGO_METADATA_JSON OUT_JSON
"""
import json
import sys


def reachable(metadata):
    """The package ids the root package reaches through normal and build dependency edges."""
    root = metadata["resolve"]["root"]
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    seen, todo = {root}, [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if (None in kinds or "build" in kinds) and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return root, seen


def main(bom_path, metadata_path, out_path):
    with open(bom_path) as f:
        bom = json.load(f)
    with open(metadata_path) as f:
        metadata = json.load(f)
    root, ids = reachable(metadata)
    packages = {p["id"]: p for p in metadata["packages"]}
    wanted = {(packages[i]["name"], packages[i]["version"]): packages[i] for i in ids if i != root}

    kept, dropped = [], 0
    for c in bom.get("components", []):
        pkg = wanted.get((c.get("name"), c.get("version")))
        if pkg is None:
            dropped += 1
            continue
        if not c.get("licenses") and pkg.get("license"):
            c["licenses"] = [{"expression": pkg["license"]}]
        c.pop("evidence", None)
        kept.append(c)
    missing = set(wanted) - {(c["name"], c["version"]) for c in kept}
    if missing:
        sys.exit(f"binary-components: cdxgen listed no component for {sorted(missing)[:5]} …")
    bom["components"] = kept

    refs = {c["bom-ref"] for c in kept}
    refs.add(bom["metadata"]["component"]["bom-ref"])
    deps = []
    for d in bom.get("dependencies", []):
        if d["ref"] in refs:
            d["dependsOn"] = [r for r in d.get("dependsOn", []) if r in refs]
            deps.append(d)
    bom["dependencies"] = deps
    with open(out_path, "w") as f:
        json.dump(bom, f, indent=2)
        f.write("\n")
    print(f"binary-components: {len(kept)} crates of the binary kept, {dropped} dropped", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
