#!/usr/bin/env python3
"""bf16 oracle: the logits cases of the LLaDA, Dream and LLaDA2.0-MoE fixtures computed by
transformers with the model in bfloat16.

The fixture's float32 weights are loaded into the same stock HuggingFace model as
families_oracle.py and the model is cast to bfloat16, except what transformers keeps in float32
when it loads a bf16 checkpoint: buffers the checkpoint does not hold (RoPE's `inv_freq`) and
Glm4Moe's `_keep_in_fp32_modules_strict` (the router weight and its score-correction bias). Each logits case of golden.json is run as families_oracle.py
runs it and the logits (bf16 values) are written as float32 tensors, under the same keys, to
golden_bf16.safetensors in the fixture folder. tests/suites/families.rs compares spot-models' bf16 path
with them.

  bf16_oracle.py --fixtures crates/spot-models/tests/fixtures
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_oracle as fo  # noqa: E402
import oracle_common as oc  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, help="the folder holding the fixture folders")
    a = ap.parse_args(argv)
    from safetensors.torch import load_file, save_file

    for name, f in fo.FAMILIES.items():
        kind = f["kind"]
        folder = os.path.join(a.fixtures, name)
        _, golden, _ = oc.read_fixture(folder)
        mask_id = golden["mask_id"]
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        model = fo.load_hf_model(kind, tensors)
        # What from_pretrained(dtype=bfloat16) leaves in float32: buffers that are not in the
        # checkpoint (RoPE's inv_freq) and Glm4Moe's router.
        kept = {n: b.clone() for n, b in model.named_buffers() if "inv_freq" in n}
        model = model.to(torch.bfloat16)
        for module_name, module in model.named_modules():
            if module_name.endswith("mlp.gate"):
                module.to(torch.float32)
            for buf_name, buf in list(module.named_buffers(recurse=False)):
                full = f"{module_name}.{buf_name}" if module_name else buf_name
                if full in kept:
                    setattr(module, buf_name, kept[full])

        def forward(rows, model=model, kind=kind):
            return fo.hf_logits(kind, model, rows)

        out = {}
        for case in golden["logits_cases"]:
            lg = fo.block_logits(kind, forward, case["prefix"], case["states"], case.get("end"), mask_id)
            out[case["key"]] = torch.from_numpy(lg).to(torch.float32).contiguous()
        path = os.path.join(folder, "golden_bf16.safetensors")
        save_file(out, path)
        print(f"{name}: {len(out)} cases -> {path}")


if __name__ == "__main__":
    main()
