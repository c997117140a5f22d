#!/usr/bin/env python3
"""Writes the drafter's training prompt file (JSONL, field `prompt`).

MBPP tasks 601-974 (MBPP's training split) written as a Python signature plus the task text as
docstring -- the shape of a HumanEval prompt, without using HumanEval -- interleaved with GSM8K
*train* questions. Never add evaluation prompts (HumanEval, GSM8K test, MBPP 11-510, MATH-500).
`--mbpp 511-600 --gsm-start 1000` writes the tuning set instead (MBPP's validation split and
GSM8K train questions the drafter never trained on), on which `tools/tune_tilt.sh` picks the
drafter's rank tilt.

    python3 tools/drafter_prompts.py --data ../shared/data --out /tmp/drafter_train2.jsonl
    spot collect --prompts /tmp/drafter_train2.jsonl --field prompt --out traj_t0 \
        --max-new-tokens 128 --no-early-stop --limit 110
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with mbpp.jsonl and gsm8k_train.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mbpp", default="601-974", help="MBPP task ids, first-last (default: the training split)")
    ap.add_argument("--gsm-start", type=int, default=0, help="first GSM8K train question")
    a = ap.parse_args()
    first, last = (int(x) for x in a.mbpp.split("-"))
    mbpp = [json.loads(line) for line in (a.data / "mbpp.jsonl").open()]
    gsm = [json.loads(line) for line in (a.data / "gsm8k_train.jsonl").open()]
    out = []
    for i, r in enumerate(mbpp[first - 1 : last]):
        code = r["code"].replace("\r\n", "\n").replace("\t", "    ")
        sig = next((line for line in code.split("\n") if line.startswith("def ")), None)
        if sig is None:
            continue
        text = r["text"].strip()
        out.append({"id": f"mbpp/{r.get('task_id', first + i)}", "prompt": f'{sig.rstrip()}\n    """{text}\n    """\n'})
        if a.gsm_start + i < len(gsm):
            j = a.gsm_start + i
            out.append({"id": f"gsm8k-train/{j}", "prompt": gsm[j]["question"]})
    with a.out.open("w") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")
    print(f"{len(out)} prompts -> {a.out}")


if __name__ == "__main__":
    main()
