#!/usr/bin/env python3
"""Checks the workspace's `rust-version` against what actually builds it.

    python3 tools/check_msrv.py

Every member must inherit the one `rust-version` of `[workspace.package]`, and that version
must equal the newest of (a) the `rust-version` every resolved dependency declares, with all
features (flex, ndarray, wgpu, cuda) and dev-dependencies, and (b) OWN_FLOOR, what our own code
needs of the language (let-chains: 1.88). Standard-library APIs newer than the declared version
are caught separately by clippy's `incompatible_msrv` lint, which reads the same field.
Exit 1, naming the package that sets the floor, when they disagree. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import sys

# let-chains (`if let .. && let ..`) are stable from 1.88 in edition 2024; `is_multiple_of`
# needs 1.87.
OWN_FLOOR = ((1, 88), "our code (let-chains)")


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))[:2]


def main() -> int:
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = set(meta["workspace_members"])
    resolved = {node["id"] for node in meta["resolve"]["nodes"]}
    declared = {p["name"]: p.get("rust_version") for p in meta["packages"] if p["id"] in members}
    if len(set(declared.values())) != 1 or None in declared.values():
        print(f"check_msrv: members declare different rust-versions: {declared}", file=sys.stderr)
        return 1
    ours = version(next(iter(declared.values())))
    floor = OWN_FLOOR
    for p in meta["packages"]:
        if p["id"] in members or p["id"] not in resolved or not p.get("rust_version"):
            continue
        v = version(p["rust_version"])
        if v > floor[0]:
            floor = (v, f"{p['name']} {p['version']}")
    want = ".".join(map(str, floor[0]))
    have = ".".join(map(str, ours))
    if ours != floor[0]:
        print(f"check_msrv: rust-version is {have}, but the floor is {want}, set by {floor[1]}", file=sys.stderr)
        return 1
    print(f"check_msrv: rust-version {have} = the floor, set by {floor[1]} ({len(resolved)} packages resolved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
