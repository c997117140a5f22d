"""Dream's own sampler on the dream-tiny fixture: the ground truth that `Transition::Timesteps`
must reproduce for Dream-format folders.

Dream's published `diffusion_generate` (re-implemented here from its description, not copied)
has no blocks: it places `max_new_tokens` masks right after the prompt and runs `steps`
iterations over the whole sequence (bidirectional attention, logits shifted right by one). With
`timesteps = torch.linspace(1, eps, steps + 1)` (float32), iteration `i` transfers
`int(m * (1 - t[i + 1] / t[i]))` of the `m` masked positions (float32 arithmetic; the last
iteration transfers all that are left): the `n` positions with the largest confidence, where the
confidence is `alg`'s: `maskgit_plus` the probability of the argmax, `topk_margin` the top-1 minus
top-2 probability, `entropy` the negative entropy (SPOT's `probability`, `margin` and
`negative-entropy` rules). An iteration that transfers nothing leaves the sequence as it was;
SPOT skips it without a forward (the tokens are the same, and `forwards` counts the
iterations that transfer something). `alg = "origin"` draws the positions with torch's RNG and
is not reproduced; nor is `alg_temp > 0`.

Declined on purpose, as for the other families: the confidence is SPOT's, with the mask token
left out of the softmax (Dream keeps it in; the steps where that would have transferred other
positions are counted per case as `mask_mass_changes`), and Dream's entropy adds 1e-10 inside
the logarithm. Cases whose argmax is the mask id or that come within 1e-4 of a tie are redrawn.
Temperature 0 only: Dream's categorical draw at T > 0 is replaced by SPOT's coupled noise.

Writes `crates/spot-models/tests/fixtures/dream-tiny/sampler.json`: the decode cases, and
`schedules`, the per-iteration transfer counts (space-separated) torch computes for a grid of
lengths and steps (the float32 rounding is part of the procedure, so the Rust schedule is
checked against it).

    python tools/oracle/dream_sampler.py [--check]
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_oracle as fo  # noqa: E402
import oracle_common as oc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "../../crates/spot-models/tests/fixtures/dream-tiny")
OUT = os.path.join(FIXTURE, "sampler.json")
EPS = 1e-3
RULES = {"maskgit_plus": "probability", "topk_margin": "margin", "entropy": "negative-entropy"}


def transfer_counts(masked: int, steps: int, eps: float = EPS) -> list[int]:
    """Positions Dream transfers at each iteration when `masked` masks remain at the start
    and every iteration transfers what it asks for, in torch's float32 arithmetic."""
    timesteps = torch.linspace(1, eps, steps + 1)
    counts = []
    m = masked
    for i in range(steps):
        t, s = timesteps[i], timesteps[i + 1]
        num_mask_token = torch.tensor([m]).sum() / 1
        n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        counts.append(n)
        m -= n
    return counts


def confidences(row: np.ndarray, alg: str) -> tuple[int, float]:
    """(argmax, confidence under `alg`) of one position's float64 logits (mask excluded by
    the caller when it wants SPOT's view)."""
    finite = np.isfinite(row)
    p = np.zeros_like(row)
    p[finite] = np.exp(row[finite] - np.logaddexp.reduce(row[finite]))
    top = int(np.argmax(row))
    if alg == "maskgit_plus":
        return top, float(p[top])
    if alg == "topk_margin":
        two = np.sort(p)[-2:]
        return top, float(two[1] - two[0])
    q = p[p > 0]
    return top, float(np.sum(q * np.log(q)))


def sampler(forward, prompt, gen_length, steps, alg, mask_id):
    """Dream at temperature 0; returns (tokens, gaps, forwards, mask_mass_changes)."""
    p = len(prompt)
    x = list(prompt) + [mask_id] * gen_length
    gaps = dict(conf=np.inf, logit=np.inf)
    forwards = changes = 0
    for n in transfer_counts(gen_length, steps):
        masked = [i for i in range(p, len(x)) if x[i] == mask_id]
        if n == 0 or not masked:
            continue
        logits = forward([x])[0].astype(np.float64)
        forwards += 1
        spot, own, choice = {}, {}, {}
        for i in masked:
            if int(np.argmax(logits[i])) == mask_id:
                gaps["logit"] = 0.0  # redraw: Dream could write the mask id
            row = logits[i].copy()
            row[mask_id] = -np.inf
            two = np.sort(row)[-2:]
            gaps["logit"] = min(gaps["logit"], float(two[1] - two[0]))
            choice[i], spot[i] = confidences(row, alg)
            own[i] = confidences(logits[i], alg)[1]

        def transfer(c):
            ranked = sorted(masked, key=lambda i: -c[i])
            return ranked, sorted(ranked[:n])

        ranked, chosen = transfer(spot)
        changes += int(transfer(own)[1] != chosen)
        if n < len(ranked):
            gaps["conf"] = min(gaps["conf"], spot[ranked[n - 1]] - spot[ranked[n]])
        for i in chosen:
            x[i] = choice[i]
    return x[p:], gaps, forwards, changes


def build():
    from safetensors.torch import load_file

    _cfg, golden, _tok = oc.read_fixture(FIXTURE)
    mask_id = golden["mask_id"]
    model = fo.load_hf_model("dream", load_file(os.path.join(FIXTURE, "model.safetensors")))

    def forward(rows):
        return fo.hf_logits("dream", model, rows)

    rng = np.random.default_rng(20261204)
    cases = []
    # (prompt length, max_new_tokens, steps, alg): one transfer per iteration (steps = tokens,
    # where the first iteration transfers nothing and the last two), several per iteration,
    # and more iterations than tokens.
    plan = [(6, 16, 16, "entropy"), (9, 24, 8, "entropy"), (4, 20, 5, "entropy"), (12, 16, 32, "entropy"),
            (7, 16, 16, "maskgit_plus"), (5, 24, 6, "maskgit_plus"), (10, 32, 12, "maskgit_plus"),
            (8, 16, 16, "topk_margin"), (3, 24, 4, "topk_margin"), (11, 20, 7, "topk_margin")]
    for plen, gen, steps, alg in plan:
        for _attempt in range(300):
            prompt = [int(t) for t in rng.integers(0, 360, size=plen)]
            tokens, gaps, forwards, changes = sampler(forward, prompt, gen, steps, alg, mask_id)
            if min(gaps.values()) >= fo.MIN_GAP:
                break
        else:
            raise SystemExit(f"no prompt for {(plen, gen, steps, alg)} clear of ties")
        cases.append(dict(prompt=prompt, max_new_tokens=gen, steps=steps, eps=EPS, alg=alg,
                          confidence=RULES[alg], temperature=0.0, tokens=tokens, forwards=forwards,
                          mask_mass_changes=changes,
                          min_gaps={k: (None if v == np.inf else v) for k, v in gaps.items()}))
    several = sum(c["forwards"] < len(c["tokens"]) for c in cases)
    assert several >= 5, "too few cases transfer several positions per iteration"
    lengths = [1, 2, 3, 5, 8, 13, 16, 31, 32, 64, 100, 128, 256, 512]
    step_counts = [1, 2, 3, 4, 7, 8, 16, 31, 32, 64, 100, 128, 256, 512]
    schedules = [dict(masked=m, steps=s, eps=EPS, counts=" ".join(map(str, transfer_counts(m, s)))) for m in lengths for s in step_counts]
    return dict(
        generator=dict(tool="tools/oracle/dream_sampler.py", procedure="Dream diffusion_generate(), "
                       "linear timesteps, maskgit_plus / topk_margin / entropy, temperature 0 (argmax), "
                       "confidence without the mask token's mass", torch=torch.__version__),
        mask_id=mask_id, cases=cases, schedules=schedules)


def main(argv=None):
    oc.sampler_main(__doc__, OUT, build, argv)


if __name__ == "__main__":
    main()
