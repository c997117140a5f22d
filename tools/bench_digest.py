#!/usr/bin/env python3
"""Digest of `spot bench` samples without timings, to show that two runs decoded the same.

    tools/bench_digest.py OUT_A/samples.jsonl [OUT_B/samples.jsonl]

Prints one SHA-256 per file over every sample's fields except wall, drafting and verification
times: the generated tokens (`tokens`, written since issue 46; older runs cover them by `equal`,
each speculative sample compared with draft-free's tokens) and the counters (forwards,
positions, accepted-node histogram, round ends). With two
files, also lists the samples whose fields differ and exits 1 when any do.
"""

import hashlib
import json
import sys

TIMINGS = {"wall_s", "draft_s", "verify_s"}


def load(path):
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            key = (r["set"], r["id"], r["temperature"], r["protocol"], r["method"], r["budget"])
            rows[key] = {k: v for k, v in r.items() if k not in TIMINGS}
    return rows


def digest(rows):
    h = hashlib.sha256()
    for key in sorted(rows, key=repr):
        h.update(json.dumps([key, rows[key]], sort_keys=True).encode())
    return h.hexdigest()


def main():
    if not 2 <= len(sys.argv) <= 3:
        sys.exit(__doc__)
    runs = [load(p) for p in sys.argv[1:]]
    for path, rows in zip(sys.argv[1:], runs):
        print(f"{digest(rows)}  {path} ({len(rows)} samples)")
    if len(runs) == 2:
        a, b = runs
        differ = [k for k in sorted(set(a) | set(b), key=repr) if a.get(k) != b.get(k)]
        for k in differ:
            fields = sorted(f for f in set(a.get(k, {})) | set(b.get(k, {}))
                            if a.get(k, {}).get(f) != b.get(k, {}).get(f))
            print(f"differs: {k}: {fields}")
        print(f"{len(differ)} of {len(set(a) | set(b))} samples differ")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
