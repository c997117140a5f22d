#!/usr/bin/env python3
"""Environment report of the GPU recipe; exits non-zero, saying why, if something it needs is missing."""
from __future__ import annotations

import importlib
import os
import platform
import sys

need_cuda = "--cuda" in sys.argv
bad = []
print("python", platform.python_version(), sys.executable)
for mod in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        bad.append(f"cannot import {mod}: {e}")
try:
    from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: F401
except Exception as e:  # noqa: BLE001
    bad.append(f"transformers has no Qwen3 (need >= 4.51): {e}")
try:
    import torch

    print("torch cuda build", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", "bf16", torch.cuda.is_bf16_supported())
    elif need_cuda:
        bad.append("no CUDA device visible to torch")
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 1):
        bad.append(f"torch {torch.__version__} is older than 2.1")
except ImportError:
    pass
print("cpus", os.cpu_count())
if bad:
    print("ENVIRONMENT NOT USABLE:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(3)
print("environment OK")
