#!/usr/bin/env python3
"""Writes the drafter's training prompt file (JSONL, field `prompt`).

MBPP tasks 601-974 (MBPP's training split) written as a Python signature plus the task text as
docstring -- the shape of a HumanEval prompt, without using HumanEval -- interleaved with GSM8K
*train* questions. Never add evaluation prompts (HumanEval, GSM8K test, MBPP 11-510, MATH-500).

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
    a = ap.parse_args()
    mbpp = [json.loads(line) for line in (a.data / "mbpp.jsonl").open()]
    gsm = [json.loads(line) for line in (a.data / "gsm8k_train.jsonl").open()]
    out = []
    for i, r in enumerate(mbpp[600:974]):
        code = r["code"].replace("\r\n", "\n").replace("\t", "    ")
        sig = next((line for line in code.split("\n") if line.startswith("def ")), None)
        if sig is None:
            continue
        text = r["text"].strip()
        out.append({"id": f"mbpp/{r.get('task_id', 601 + i)}", "prompt": f'{sig.rstrip()}\n    """{text}\n    """\n'})
        if i < len(gsm):
            out.append({"id": f"gsm8k-train/{i}", "prompt": gsm[i]["question"]})
    with a.out.open("w") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")
    print(f"{len(out)} prompts -> {a.out}")


if __name__ == "__main__":
    main()
