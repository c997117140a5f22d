#!/usr/bin/env python3
"""How well can *any* ranker of the target's stale outputs predict the next commit?

Issue 15 asks the commit-order drafter for a held-out next-commit accuracy at depth 0 of at
least stale confidence + 0.10 at T = 1 and 2. This tool measures the headroom: it fits a
gradient-boosted ranker (LightGBM lambdarank, far more flexible than the 0.62M drafter) on
training-side trajectories and scores it on held-out ones, next to stale confidence. If a
ranker that sees every stale statistic the drafter sees, plus the target's hidden states,
cannot get far above stale confidence, the accuracy target is bounded by the target model
and not by the drafter.

Examples are those of `spot eval-drafter` at depth 0 (`spot_drafter::trajectory::examples`):
for step t >= 1 of a block with a single commit, the stale statistics of step t - 1, the
root (the block after steps < t) and the position step t commits. Candidates are the
positions masked at the root; stale confidence picks the most confident, ties to the lower
index, as the drafter's baseline does.

Per candidate the ranker reads: ln stale confidence, ln stale top-1 probability, whether the
(noised) choice is the top-1 token, ln hedge probability, noised margin, entropy, tail mass,
confidence rank, signed and absolute distance to the last commit, distance to the nearest
unmasked position on each side, masked count, relative position, ln confidence minus the
block's best, the change of ln confidence since the step before (the trend), and whether the
hedge is the top-1 token. With `--hidden` (trajectories from `spot collect --hidden-states`)
it also reads 16 principal components of the candidate's and the last commit's final hidden
states (fitted on the training side) and their cosine.

    tools/order_ceiling.py --train DIR... --test DIR... [--hidden] [--json]

Needs numpy, scikit-learn and lightgbm (tested with numpy 2.4.6, scikit-learn 1.8.0,
lightgbm 4.7.0); not used by the tests. Prints Markdown tables: depth-0 accuracy of the
position (what `spot eval-drafter` reports) and of position and stale token together, on
the training side and held out, for stale confidence, a conditional logit of the same
features fitted by cross-entropy, and rankers of two sizes; held out, how often the
committed position is among each scorer's top 1-4 candidates (alone, with its stale token,
with its stale token or hedge) and the cross-entropy of the softmax scorers; and, on the
training side, the depth-0 commits by their offset from the last commit with how often the
stale choice or the hedge is the committed token.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = b"SPOTTRJ\0"

# Names of the per-candidate features, in column order (`--drop` takes these).
FEATURES = [
    "ln_conf", "ln_top1", "choice_is_top1", "ln_hedge", "margin", "entropy", "tail", "rank",
    "from_last", "dist_last", "left", "right", "masked", "rel_pos", "gap_to_best", "trend",
    "hedge_is_top1",
]


def read_trajectory(path):
    """Parses a `spot collect` trajectory file (format version 2 or 3)."""
    b = Path(path).read_bytes()
    if b[:8] != MAGIC:
        raise ValueError(f"{path}: not a SPOT trajectory")
    o = 8
    version, bs, topk, _mask = struct.unpack_from("<IIII", b, o)
    o += 16
    if version not in (2, 3):
        raise ValueError(f"{path}: format version {version} (2 or 3 read)")
    (temperature,) = struct.unpack_from("<f", b, o)
    o += 4 + 8
    (hidden_dim,) = struct.unpack_from("<I", b, o)
    o += 4
    (id_len,) = struct.unpack_from("<I", b, o)
    o += 4 + id_len
    (n_blocks,) = struct.unpack_from("<I", b, o)
    o += 4
    blocks = []
    for _ in range(n_blocks):
        o += 8  # start
        o += 4 * bs  # initial tokens
        (n_steps,) = struct.unpack_from("<I", b, o)
        o += 4
        steps = []
        for _ in range(n_steps):
            (n_commits,) = struct.unpack_from("<I", b, o)
            o += 4
            commits = struct.unpack_from(f"<{2 * n_commits}I", b, o)
            o += 8 * n_commits
            (n_masked,) = struct.unpack_from("<I", b, o)
            o += 4
            stats = {}
            for _ in range(n_masked):
                pos, tok, _runner_up = struct.unpack_from("<III", b, o)
                conf, ent, tail = struct.unpack_from("<fff", b, o + 12)
                (hedge,) = struct.unpack_from("<I", b, o + 24)
                hedge_prob, margin = struct.unpack_from("<ff", b, o + 28)
                o += 36
                probs = np.frombuffer(b, "<f4", topk, o)
                o += 4 * topk
                ids, hidden = None, None
                if version >= 3:
                    ids = np.frombuffer(b, "<u4", topk, o)
                    o += 4 * topk
                    if hidden_dim:
                        raw = np.frombuffer(b, "<u2", hidden_dim, o).astype(np.uint32)
                        hidden = (raw << 16).view(np.float32)
                    o += 2 * hidden_dim
                stats[pos] = {
                    "tok": tok,
                    "conf": conf,
                    "ent": ent,
                    "tail": tail,
                    "hedge": hedge,
                    "hedge_prob": hedge_prob,
                    "margin": margin,
                    "probs": probs,
                    "ids": ids,
                    "hidden": hidden,
                }
            steps.append((list(zip(commits[::2], commits[1::2])), stats))
        blocks.append(steps)
    if o + 8 != len(b):
        raise ValueError(f"{path}: {len(b) - o - 8} bytes left after the last block")
    return {"temperature": temperature, "block_size": bs, "blocks": blocks}


def load(dirs):
    trajs = []
    for d in dirs:
        files = sorted(Path(d, "samples").glob("*.trj"))
        if not files:
            sys.exit(f"{d}: no trajectories (samples/*.trj); write them with `spot collect`")
        trajs += [read_trajectory(f) for f in files]
    return trajs


def ln(x):
    return float(np.log(max(x, 1e-10)))


def top1_token(s):
    return int(s["ids"][0]) if s["ids"] is not None else s["tok"]


def examples(trajs, hidden):
    """Depth-0 examples: rows of features, hidden pairs, group sizes and the truths."""
    rows, hid, groups, truths = [], [], [], []
    for traj in trajs:
        bs = traj["block_size"]
        for steps in traj["blocks"]:
            for t in range(1, len(steps)):
                if len(steps[t][0]) != 1 or len(steps[t - 1][0]) != 1:
                    continue
                stale = steps[t - 1][1]
                before = steps[t - 2][1] if t >= 2 else stale
                last = steps[t - 1][0][0][0]
                target = steps[t][0][0]
                cand = [p for p in sorted(stale) if p != last]
                if not cand:
                    continue
                masked = set(cand)
                confs = np.array([stale[p]["conf"] for p in cand])
                rank = np.empty(len(cand))
                rank[np.argsort(-confs, kind="stable")] = np.arange(len(cand))
                best = ln(confs.max())
                h_last = stale[last]["hidden"] if hidden else None
                for i, p in enumerate(cand):
                    s = stale[p]
                    left = next((k for k in range(1, bs + 1) if p - k not in masked), bs)
                    right = next((k for k in range(1, bs + 1) if p + k not in masked), bs)
                    trend = ln(s["conf"]) - ln(before[p]["conf"]) if p in before else 0.0
                    rows.append([
                        ln(s["conf"]), ln(s["probs"][0]), float(s["tok"] == top1_token(s)),
                        ln(s["hedge_prob"]), min(s["margin"], 20.0), s["ent"], s["tail"],
                        rank[i], p - last, abs(p - last), left, right, len(cand), p / bs,
                        ln(s["conf"]) - best, trend, float(s["hedge"] == top1_token(s)),
                    ])
                    if hidden:
                        if s["hidden"] is None or h_last is None:
                            sys.exit("--hidden needs trajectories from `spot collect --hidden-states`")
                        hid.append((s["hidden"], h_last))
                groups.append(len(cand))
                truths.append((cand, [stale[p]["tok"] for p in cand], target,
                               [stale[p]["hedge"] for p in cand]))
    return np.array(rows), hid, np.array(groups), truths


def accuracy(scores, groups, truths):
    """(position, position and stale token) accuracy of the top-scored candidate."""
    o, pos, joint = 0, 0, 0
    for n, (cand, toks, (tp, tt), _) in zip(groups, truths):
        i = int(np.argmax(scores[o:o + n]))  # first maximum: ties to the lower index
        o += n
        pos += cand[i] == tp
        joint += cand[i] == tp and toks[i] == tt
    return pos / len(groups), joint / len(groups)


def coverage(scores, groups, truths, ks=(1, 2, 3, 4)):
    """Share of examples whose committed position is among the `k` top-scored candidates, for
    each `k`: (position; position with its stale token; position with its stale token or its
    hedge)."""
    o, hit = 0, np.zeros((3, len(ks)))
    for n, (cand, toks, (tp, tt), hedges) in zip(groups, truths):
        order = np.argsort(-scores[o:o + n], kind="stable")
        o += n
        for j, k in enumerate(ks):
            top = [i for i in order[:k] if cand[i] == tp]
            hit[0, j] += bool(top)
            hit[1, j] += any(toks[i] == tt for i in top)
            hit[2, j] += any(tt in (toks[i], hedges[i]) for i in top)
    return hit / len(groups)


def by_offset(x, groups, truths):
    """Rows (offset, share of commits, stale choice right, hedge right): the examples' commits
    grouped by their offset from the last commit (|offset| > 3 pooled as "far"), read from the
    committed candidate's `from_last` feature (`x` with every column of FEATURES)."""
    col, o, count = FEATURES.index("from_last"), 0, {}
    for n, (cand, toks, (tp, tt), hedges) in zip(groups, truths):
        i = cand.index(tp)
        off = int(x[o + i, col])
        o += n
        c = count.setdefault(off if abs(off) <= 3 else "far", [0, 0, 0])
        c[0] += 1
        c[1] += toks[i] == tt
        c[2] += hedges[i] == tt
    total = sum(c[0] for c in count.values())
    return [(k, c[0] / total, c[1] / c[0], c[2] / c[0])
            for k in [-3, -2, -1, 1, 2, 3, "far"] if (c := count.get(k))]


def group_nll(scores, groups, y):
    """Mean cross-entropy of the committed position under a softmax of `scores` per example."""
    starts = np.r_[0, np.cumsum(groups)[:-1]]
    s = scores - np.repeat(np.maximum.reduceat(scores, starts), groups)
    lse = np.log(np.add.reduceat(np.exp(s), starts))
    return float(np.mean(lse - np.add.reduceat(s * y, starts)))


def fit_logit(x, groups, y, steps=1500, l2=1e-4):
    """A conditional logit (softmax over each example's candidates) of standardised features,
    fitted by Adam on the cross-entropy of the committed position; starts from the stale
    confidence ranking (weight 1 on ln_conf, column 0). Returns a scoring function."""
    mu, sd = x.mean(0), x.std(0) + 1e-6
    mu[0], sd[0] = 0.0, 1.0
    z = (x - mu) / sd
    starts = np.r_[0, np.cumsum(groups)[:-1]]
    w = np.zeros(z.shape[1])
    w[0] = 1.0
    m, v = np.zeros_like(w), np.zeros_like(w)
    for it in range(1, steps + 1):
        s = z @ w
        e = np.exp(s - np.repeat(np.maximum.reduceat(s, starts), groups))
        p = e / np.repeat(np.add.reduceat(e, starts), groups)
        g = z.T @ (p - y) / len(groups) + l2 * w
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        w -= 0.03 * (m / (1 - 0.9**it)) / (np.sqrt(v / (1 - 0.999**it)) + 1e-8)
    return lambda xs: ((xs - mu) / sd) @ w


def labels(truths, joint):
    out = []
    for cand, toks, (tp, tt), _ in truths:
        out += [int(c == tp and (not joint or k == tt)) for c, k in zip(cand, toks)]
    return np.array(out)


def with_hidden(x, hid, pca):
    h = np.array([a for a, _ in hid])
    h_last = np.array([b for _, b in hid])
    cos = np.sum(h * h_last, 1) / (np.linalg.norm(h, axis=1) * np.linalg.norm(h_last, axis=1) + 1e-9)
    return np.hstack([x, pca.transform(h), pca.transform(h_last), cos[:, None]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", nargs="+", required=True, help="training-side trajectory dirs")
    ap.add_argument("--test", nargs="+", required=True, help="held-out trajectory dirs")
    ap.add_argument("--hidden", action="store_true", help="also read the hidden states")
    ap.add_argument("--drop", default="", help="comma-separated feature names to leave out "
                    "(an ablation; ln_conf stays, stale confidence reads it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import lightgbm as lgb
    from sklearn.decomposition import PCA

    train, test = load(args.train), load(args.test)
    temps = sorted({t["temperature"] for t in train + test})
    xa, ha, ga, ta = examples(train, args.hidden)
    xb, hb, gb, tb = examples(test, args.hidden)
    offsets = by_offset(xa, ga, ta)
    if args.hidden:
        pca = PCA(16, random_state=0).fit(np.array([a for a, _ in ha]))
        xa, xb = with_hidden(xa, ha, pca), with_hidden(xb, hb, pca)
    drop = [f for f in args.drop.split(",") if f]
    unknown = [f for f in drop if f not in FEATURES or f == "ln_conf"]
    if unknown:
        sys.exit(f"--drop: unknown or required feature(s) {unknown}; names: {FEATURES[1:]}")
    keep = [i for i, f in enumerate(FEATURES) if f not in drop]
    keep += list(range(len(FEATURES), xa.shape[1]))
    xa, xb = xa[:, keep], xb[:, keep]
    ya, yb = labels(ta, False), labels(tb, False)
    results = [("stale confidence", accuracy(xa[:, 0], ga, ta), accuracy(xb[:, 0], gb, tb),
                coverage(xb[:, 0], gb, tb), group_nll(xb[:, 0], gb, yb))]
    logit = fit_logit(xa, ga, ya)
    results.append(("conditional logit (cross-entropy)", accuracy(logit(xa), ga, ta),
                    accuracy(logit(xb), gb, tb), coverage(logit(xb), gb, tb),
                    group_nll(logit(xb), gb, yb)))
    sizes = [("small", 7, 200, 200), ("large", 15, 400, 100)]
    for label_joint in (False, True):
        y = labels(ta, label_joint)
        for name, leaves, trees, min_child in sizes:
            model = lgb.LGBMRanker(
                n_estimators=trees, learning_rate=0.05, num_leaves=leaves,
                min_child_samples=min_child, subsample=0.8, subsample_freq=1,
                colsample_bytree=0.8, random_state=0, verbose=-1,
            )
            model.fit(xa, y, group=ga)
            what = "position and token" if label_joint else "position"
            results.append((
                f"ranker {name} (label: {what})",
                accuracy(model.predict(xa), ga, ta),
                accuracy(model.predict(xb), gb, tb),
                coverage(model.predict(xb), gb, tb),
                None,
            ))
    if args.json:
        print(json.dumps({
            "temperatures": temps, "train_examples": len(ga), "test_examples": len(gb),
            "hidden": args.hidden, "dropped": drop,
            "rows": [{"scorer": n, "train": list(a), "test": list(b),
                      "test_coverage": c.tolist(), "test_nll": nll}
                     for n, a, b, c, nll in results],
            "by_offset": offsets,
        }))
        return
    print(f"T {temps}, {len(ga)} training and {len(gb)} held-out depth-0 examples, "
          f"hidden states {'read' if args.hidden else 'not read'}"
          + (f", without {', '.join(drop)}" if drop else ""))
    print()
    print("| scorer | train: position | train: position + token | held out: position "
          "| held out: position + token |")
    print("|---|---|---|---|---|")
    for n, (pa, ja), (pb, jb), _, _ in results:
        print(f"| {n} | {pa:.3f} | {ja:.3f} | {pb:.3f} | {jb:.3f} |")
    print()
    print("Held out: the committed position among the top 1 / 2 / 3 / 4 candidates; with its "
          "stale token; with its stale token or hedge; cross-entropy of the position")
    print()
    print("| scorer | position | + stale token | + token or hedge | cross-entropy |")
    print("|---|---|---|---|---|")
    for n, _, _, c, nll in results:
        cells = [" / ".join(f"{v:.3f}" for v in row) for row in c]
        print(f"| {n} | {' | '.join(cells)} | {'-' if nll is None else f'{nll:.4f}'} |")
    print()
    print("Training side: depth-0 commits by offset from the last commit")
    print()
    print("| offset | share of commits | stale choice is the token | hedge is the token |")
    print("|---|---|---|---|")
    for k, share, choice, hedge in offsets:
        print(f"| {k} | {share:.3f} | {choice:.3f} | {hedge:.3f} |")


if __name__ == "__main__":
    main()
