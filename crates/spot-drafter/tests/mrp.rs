//! The MRP baseline on the shipped target: the module reproduces its trainer's output, its
//! drafts under the shared verifier decode exactly what draft-free decoding does, and bad
//! files are typed errors naming the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spot_core::{
    BlockDiffusionModel, BlockState, ConfidenceRule, MeteredModel, StatsQuery, TokenId,
};
use spot_dlm::{DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer};
use spot_drafter::mrp::{DEFAULT_MRP, ModuleHead, Mrp, MrpFile, MrpScorer, MrpTokens};
use spot_drafter::{HostMrp, MrpBuffers, Precision};
use spot_models::{CpuBackend, ModelError, Sdar};
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError};

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code")
}

fn load_mrp() -> Mrp<CpuBackend> {
    let dir = model_dir();
    Mrp::<CpuBackend>::load(&dir, &dir.join(DEFAULT_MRP), &Default::default())
        .expect("the shipped MRP module loads")
}

/// One MRP step on the trainer's held-out state (the target's hidden states at a state of a
/// draft-free decode, the tokens one commit later) gives the trainer's corrected logits (top 5
/// ids and values at three masked positions).
#[test]
fn mrp_reproduces_its_trainer() {
    let dir = model_dir();
    let file: MrpFile =
        serde_json::from_str(&std::fs::read_to_string(dir.join(DEFAULT_MRP)).unwrap()).unwrap();
    let reference = file.reference.expect("mrp.json carries a reference");
    let mut target = Sdar::<CpuBackend>::load(&dir, &Default::default()).unwrap();
    let l = 32;
    let (prefix, block) = reference.ids.split_at(reference.ids.len() - l);
    let mask = target.info().mask_id;
    let mut target = MeteredModel::new(&mut target);
    target.reset_prefix(prefix, l, prefix.len() + l).unwrap();
    let query = StatsQuery {
        hidden_states: true,
        ..StatsQuery::new(0.0, 0)
    };
    let state = BlockState::from_tokens(block.to_vec(), mask);
    let stats = target.forward(&[state], &query).unwrap();
    let (dim, hidden) = stats[0].hidden().expect("hidden states");
    let mrp = load_mrp();
    assert_eq!(dim, mrp.hidden_size());
    assert_eq!(reference.next.len(), l);
    let hc = mrp.step(&reference.next, hidden, 1, l).unwrap();
    assert!(!reference.positions.is_empty());
    for p in &reference.positions {
        let s = p.position;
        let row: Vec<f32> = (0..dim)
            .map(|j| hidden[s * dim + j] + hc[s * dim + j])
            .collect();
        let logits = mrp.logits(&row, 1).unwrap();
        for (&id, &want) in p.ids.iter().zip(&p.logits) {
            let got = logits[id as usize];
            assert!(
                (got - want).abs() < 2e-3,
                "position {s}, token {id}: {got} vs the trainer's {want}"
            );
        }
        // The trainer's first id is the corrected argmax here too (the mask aside).
        let best = (0..logits.len())
            .filter(|&v| v != mask as usize)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        assert_eq!(best as u32, p.ids[0], "position {s}");
    }
}

/// `Mrp::load` reads the weights once and packs its int8 step from its `f32` one, sharing the
/// embedding: the same step, bit for bit, as packing int8 straight from the files.
#[test]
fn the_repacked_step_is_the_one_read_from_the_files() {
    let dir = model_dir();
    let mrp = load_mrp();
    let (cfg, _) = spot_models::DecoderConfig::read(&dir).unwrap();
    let weights = spot_models::hf::Weights::open(&dir)
        .unwrap()
        .with_file(&spot_drafter::mrp::mrp_weights_path(&dir.join(DEFAULT_MRP)))
        .unwrap();
    let layers = mrp.file().layers;
    let direct = HostMrp::load(&cfg, &weights, ("mrp.", layers), Precision::Int8).unwrap();
    let (h, l, n) = (mrp.hidden_size(), 32, 3);
    let mut rng = spot_tree::rng::SplitMix(5);
    let ids: Vec<TokenId> = (0..n * l)
        .map(|_| (rng.next_u64() % mrp.vocab_size() as u64) as TokenId)
        .collect();
    let hidden: Vec<f32> = (0..n * l * h).map(|_| rng.normal()).collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut buffers = MrpBuffers::default();
    let kept = mrp.host(Precision::Int8);
    kept.step(&mut buffers, (&ids, &hidden), (n, l), &mut a)
        .unwrap();
    direct
        .step(&mut buffers, (&ids, &hidden), (n, l), &mut b)
        .unwrap();
    assert!(!a.is_empty() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    // An int8 packing has no `f32` values left to pack from.
    assert!(kept.repacked(Precision::F32).is_none());
}

/// The packed host step computes burn's step: in `f32` within 2e-6 (relative to the largest
/// residual) on real and random states, in int8 close to it; a state's residuals in either
/// precision are the same bits whether it is stepped alone or in a batch.
#[test]
fn the_host_step_matches_burn() {
    let mrp = load_mrp();
    let (h, l) = (mrp.hidden_size(), 32);
    let file = mrp.file().clone();
    let reference = file.reference.expect("mrp.json carries a reference");
    // Hidden states: a fixed pseudo-random mix of unit-scale values (the target's final norm
    // leaves rows of about that size), and the trainer's tokens with random ones.
    let mut rng = spot_tree::rng::SplitMix(11);
    let n = 5;
    let mut ids: Vec<TokenId> = Vec::new();
    for state in 0..n {
        for s in 0..l {
            ids.push(if state == 0 {
                reference.next[s]
            } else {
                (rng.next_u64() % mrp.vocab_size() as u64) as TokenId
            });
        }
    }
    let hidden: Vec<f32> = (0..n * l * h).map(|_| rng.normal() * 1.5).collect();
    let want = mrp.step(&ids, &hidden, n, l).unwrap();
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.1, "residuals of size {scale}");
    let mut worst = [0.0f32; 2];
    for (k, precision) in [Precision::F32, Precision::Int8].into_iter().enumerate() {
        let host = mrp.host(precision);
        assert_eq!(host.precision(), precision);
        let mut buffers = MrpBuffers::default();
        let mut all = Vec::new();
        host.step(&mut buffers, (&ids, &hidden), (n, l), &mut all)
            .unwrap();
        worst[k] = all
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale;
        // Each state alone: the same bits as in the batch.
        let mut one = Vec::new();
        for state in 0..n {
            let rows = state * l..(state + 1) * l;
            host.step(
                &mut buffers,
                (&ids[rows.clone()], &hidden[rows.start * h..rows.end * h]),
                (1, l),
                &mut one,
            )
            .unwrap();
            assert!(
                one.iter()
                    .zip(&all[rows.start * h..rows.end * h])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{precision}: state {state} alone differs from the batch"
            );
        }
    }
    assert!(
        worst[0] < 2e-6,
        "f32: worst relative difference {}",
        worst[0]
    );
    assert!(
        worst[1] < 5e-2,
        "int8: worst relative difference {}",
        worst[1]
    );
    assert!(worst[1] > worst[0], "int8 did not quantise: {worst:?}");
    // Bad inputs: typed errors, no panic.
    let host = mrp.host(Precision::F32);
    let mut buffers = MrpBuffers::default();
    let mut out = Vec::new();
    let short = host.step(&mut buffers, (&ids[..l], &hidden[..h]), (1, l), &mut out);
    assert!(matches!(short, Err(ModelError::Request(_))), "{short:?}");
    let mut bad = ids[..l].to_vec();
    bad[3] = mrp.vocab_size() as TokenId;
    let outside = host.step(&mut buffers, (&bad, &hidden[..l * h]), (1, l), &mut out);
    assert!(
        matches!(outside, Err(ModelError::Request(_))),
        "{outside:?}"
    );
}

/// MRP's chain, a tree whose tokens the module writes and the module's own tree (`tree()`)
/// under the shared verifier return draft-free decoding's tokens: the chain at T = 0, 1 and 2,
/// the module's tokens in a stale-order tree at T = 0, the module's tree on one block at T = 2
/// under the margin rule with top-k truncation (the scorers follow the decode's rule). The
/// chain takes fewer forwards at T = 0.
#[test]
fn mrp_drafting_equals_draft_free() {
    let dir = model_dir();
    let mut target = Sdar::<CpuBackend>::load(&dir, &Default::default()).unwrap();
    let mrp = Arc::new(load_mrp());
    let prompt: Vec<u32> = (40..75).collect();
    let settings = [
        (0.0, ConfidenceRule::Probability, None, 48),
        (1.0, ConfidenceRule::Probability, None, 48),
        (2.0, ConfidenceRule::Margin, Some(8), 32),
    ];
    for (temperature, confidence, sample_top_k, max_new_tokens) in settings {
        let cfg = DecodeConfig {
            block_size: 32,
            max_new_tokens,
            temperature,
            seed: 5,
            confidence,
            sample_top_k,
            ..DecodeConfig::default()
        };
        let df = DraftFreeDecoder::new()
            .decode(&mut target, &prompt, &cfg)
            .unwrap();
        let scorer = || MrpScorer::new(Arc::clone(&mrp)).with_rule(confidence, sample_top_k);
        let mut spec = SpotDecoder::builder()
            .scorer(scorer())
            .budget(8)
            .max_depth(8)
            .hedge(None)
            .build()
            .unwrap();
        let out = spec.decode(&mut target, &prompt, &cfg).unwrap();
        assert_eq!(out.tokens, df.tokens, "chain, T = {temperature}");
        if temperature == 0.0 {
            // A best-first tree whose tokens the module writes (stale-confidence order here);
            // each token the lazy path reduces (only the nodes and positions the builder
            // asks) is the one the module's full pass over every masked position gives.
            // With the shortlist, each token is the eager choice wherever that choice is in
            // the position's stale top list.
            for head in [ModuleHead::Full, ModuleHead::Shortlist] {
                let both = Both {
                    lazy: MrpTokens::new(StaleConfidenceScorer, Arc::clone(&mrp)).with_head(head),
                    eager: MrpScorer::new(Arc::clone(&mrp)),
                    head,
                    scratch: Vec::new(),
                    checked: 0,
                };
                let mut tree = SpotDecoder::builder()
                    .scorer(both)
                    .budget(8)
                    .build()
                    .unwrap();
                let tree_out = tree.decode(&mut target, &prompt, &cfg).unwrap();
                assert_eq!(
                    tree_out.tokens, df.tokens,
                    "tokens, {head}, T = {temperature}"
                );
            }
        }
        if temperature == 2.0 {
            // The module's own tree over its corrected statistics.
            let mut tree = SpotDecoder::builder()
                .scorer(scorer().tree())
                .budget(8)
                .build()
                .unwrap();
            let tree_out = tree.decode(&mut target, &prompt, &cfg).unwrap();
            assert_eq!(tree_out.tokens, df.tokens, "mrp tree, T = {temperature}");
        }
        if temperature == 0.0 {
            assert!(
                out.stats.work.block_forwards < df.stats.work.block_forwards,
                "{} vs {}",
                out.stats.work.block_forwards,
                df.stats.work.block_forwards
            );
        }
    }
}

/// Damaged or foreign files are typed errors naming the file.
/// `MrpTokens` (lazy) beside an eager `MrpScorer` on the same batches: every token hypothesis
/// the lazy path gives must be the eager pass's choice at that node and position (with the
/// shortlist: wherever the eager choice is in the position's stale top list).
struct Both {
    lazy: MrpTokens<StaleConfidenceScorer, CpuBackend>,
    eager: MrpScorer<CpuBackend>,
    head: ModuleHead,
    scratch: Vec<f32>,
    checked: usize,
}

impl Drop for Both {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(self.checked > 0, "no token hypothesis was compared");
        }
    }
}

impl OrderScorer for Both {
    fn name(&self) -> &str {
        "both"
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        self.scratch.clear();
        self.scratch.resize(out.len(), 0.0);
        self.eager.score(ctx, nodes, &mut self.scratch)?;
        self.lazy.score(ctx, nodes, out)
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        self.lazy.prepare_hypotheses(ctx, nodes, wanted)
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        let mut eager = Vec::new();
        let has = self
            .eager
            .token_hypotheses(ctx, nodes, i, position, &mut eager);
        let start = out.len();
        let lazy = self.lazy.token_hypotheses(ctx, nodes, i, position, out);
        assert_eq!(lazy, has, "node {i} position {position}");
        match self.head {
            ModuleHead::Full => {
                assert_eq!(&out[start..], &eager[..], "node {i} position {position}");
                self.checked += 1;
            }
            ModuleHead::Shortlist => {
                let listed = ctx.stale.top(position).0;
                if eager.iter().all(|e| listed.contains(&e.0)) {
                    let tokens = |v: &[(TokenId, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
                    assert_eq!(
                        tokens(&out[start..]),
                        tokens(&eager),
                        "node {i} position {position}"
                    );
                    self.checked += 1;
                }
            }
        }
        lazy
    }
}

#[test]
fn bad_mrp_files_are_named_errors() {
    let dir = model_dir();
    let tmp = std::env::temp_dir().join(format!("spot-mrp-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let good = std::fs::read_to_string(dir.join(DEFAULT_MRP)).unwrap();
    let weights = std::fs::read(dir.join("mrp.safetensors")).unwrap();
    let device = Default::default();
    let load = |json: &str, w: Option<&[u8]>| {
        let file = tmp.join(DEFAULT_MRP);
        std::fs::write(&file, json).unwrap();
        let wpath = tmp.join("mrp.safetensors");
        let _ = std::fs::remove_file(&wpath);
        if let Some(w) = w {
            std::fs::write(&wpath, w).unwrap();
        }
        Mrp::<CpuBackend>::load(&dir, &file, &device).map(|_| ())
    };
    let edit = |field: &str, value: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v[field] = value;
        v.to_string()
    };
    let field = |e: ModelError| match e {
        ModelError::InvalidConfig { field, path, .. } => {
            assert!(path.ends_with(DEFAULT_MRP));
            field
        }
        other => panic!("expected InvalidConfig, got {other}"),
    };
    assert!(load(&good, Some(&weights)).is_ok());
    assert_eq!(
        field(load(&edit("format", "x".into()), Some(&weights)).unwrap_err()),
        "format"
    );
    assert_eq!(
        field(load(&edit("version", 2.into()), Some(&weights)).unwrap_err()),
        "version"
    );
    assert_eq!(
        field(load(&edit("layers", 0.into()), Some(&weights)).unwrap_err()),
        "layers"
    );
    // An unknown field, a missing weights file, truncated weights, too many layers for the
    // weights: each names its file or tensor.
    let msg = load(&edit("surprise", 1.into()), Some(&weights))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("surprise") && msg.contains(DEFAULT_MRP),
        "{msg}"
    );
    let msg = load(&good, None).unwrap_err().to_string();
    assert!(msg.contains("mrp.safetensors"), "{msg}");
    let msg = load(&good, Some(&weights[..weights.len() / 2]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("mrp.safetensors"), "{msg}");
    let msg = load(&edit("layers", 3.into()), Some(&weights))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("mrp.layers.1."), "{msg}");
    std::fs::remove_dir_all(&tmp).unwrap();
}
