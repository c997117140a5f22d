#!/usr/bin/env python3
"""Reproduce everything from scratch: corpus -> tokenizer -> tokens -> train -> export -> sample.

  python3 tools/train_target/run_all.py --max-minutes 105         # the committed model
  python3 tools/train_target/run_all.py --smoke                   # ~3-4 min, everything under $TMPDIR/sdar_smoke
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(*args):
    t = time.time()
    print("+", " ".join(args), flush=True)
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT,
                   env={**os.environ, "RAYON_NUM_THREADS": "2"})
    print(f"  ({time.time() - t:.1f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-minutes", type=float, default=105.0)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    s = lambda p: os.path.join(HERE, p)  # noqa: E731
    run(s("corpus.py"), "docs")
    run(s("build_tokenizer.py"))
    run(s("corpus.py"), "tokenize")
    if a.smoke:
        smoke = os.path.join(tempfile.gettempdir(), "sdar_smoke")  # where train.py --smoke writes
        logs, out = os.path.join(smoke, "logs"), os.path.join(smoke, "model")
        os.makedirs(logs, exist_ok=True)
        import shutil
        shutil.copyfile(s("logs/corpus_stats.json"), os.path.join(logs, "corpus_stats.json"))
        run(s("train.py"), "--smoke")
        run(s("export.py"), "--ckpt", os.path.join(smoke, "ckpt", "model.pt"), "--out", out, "--log-dir", logs,
            "--command", "python3 tools/train_target/run_all.py --smoke")
        run(s("sample.py"), "--model", out, "--log-dir", logs, "--max-new-tokens", "32")
        run(s("export.py"), "--readme-only", "--out", out, "--log-dir", logs,
            "--command", "python3 tools/train_target/run_all.py --smoke")
        return
    cmd = f"python3 tools/train_target/run_all.py --max-minutes {a.max_minutes:g}"
    run(s("train.py"), "--max-minutes", str(a.max_minutes))
    run(s("export.py"), "--command", cmd)
    run(s("sample.py"))
    run(s("export.py"), "--readme-only", "--command", cmd)


if __name__ == "__main__":
    main()
