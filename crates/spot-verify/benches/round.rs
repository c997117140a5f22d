//! One SPOT round without the model: draft-tree construction + verification walk, L = 32.
//!
//! The target's statistics (stale distribution of the root's parent, and every tree node's
//! statistics for the walk) are computed before timing with a toy model, so only tree and walk
//! time is measured. `stale-confidence` includes the (trivial) BlockSpec scorer;
//! `precomputed-scores` replaces it by a copy of its output, to exclude scorer time entirely.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use spot_core::toy::{ToyConfig, ToyModel};
use spot_core::{
    BlockState, BlockStats, Commit, MeteredModel, StatsQuery, Transition, exact_commit,
};
use spot_tree::{
    NodeBatch, OrderScorer, ScoreContext, StaleConfidenceScorer, TreeBuilder, TreeConfig,
    TreeError, fill_normalised,
};
use spot_verify::{MatchRule, NOT_IN_BATCH, Walk, walk};

const L: usize = 32;

/// Replays the stale-confidence scores, computed once, without recomputing them.
struct Replay {
    table: Vec<(u64, Vec<f32>)>,
}

impl OrderScorer for Replay {
    fn name(&self) -> &str {
        "replay"
    }
    fn score(
        &mut self,
        _: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        for i in 0..nodes.len() {
            let h = nodes.hash(i);
            if let Some((_, s)) = self.table.iter().find(|(k, _)| *k == h) {
                out[i * L..(i + 1) * L].copy_from_slice(s);
            }
        }
        Ok(())
    }
}

/// Stale confidence raised to the 8th power: a peaked order distribution, as a trained drafter
/// gives, so the tree grows deep instead of wide (the slow case for the builder).
struct Peaked;

impl OrderScorer for Peaked {
    fn name(&self) -> &str {
        "peaked"
    }
    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        fill_normalised(nodes, L, out, |_, s| ctx.stale.token_prob(s).powi(8));
        Ok(())
    }
}

struct Setup {
    root: BlockState,
    stale: BlockStats,
    node_stats: Vec<BlockStats>,
    batch_index: Vec<u32>,
    replay: Vec<(u64, Vec<f32>)>,
}

fn setup(budget: usize) -> Setup {
    let mut toy = ToyModel::new(ToyConfig {
        vocab_size: 512,
        mask_id: 511,
        stability: 0.9,
        peak: 10.0,
        ..ToyConfig::default()
    });
    let mut model = MeteredModel::new(&mut toy);
    model
        .reset_prefix(&(0..256).map(|i| i % 500).collect::<Vec<u32>>(), L, 256 + L)
        .unwrap();
    let q = StatsQuery::new(0.0, 0);
    // Advance 8 draft-free steps into the block: realistic mid-block state.
    let mut parent = BlockState::masked(L, 511);
    let mut stale = model.forward(&[parent.clone()], &q).unwrap().remove(0);
    let mut root = parent
        .with_commit(exact_commit(&parent, &stale).unwrap().unwrap())
        .unwrap();
    for _ in 0..7 {
        parent = root.clone();
        stale = model.forward(&[parent.clone()], &q).unwrap().remove(0);
        root = parent
            .with_commit(exact_commit(&parent, &stale).unwrap().unwrap())
            .unwrap();
    }
    let ctx = ScoreContext {
        root: &root,
        stale: &stale,
        block_start: 256,
        noise: None,
        temperature: 0.0,
    };
    let mut b = TreeBuilder::new(TreeConfig {
        budget,
        ..TreeConfig::default()
    })
    .unwrap();
    let tree = b.build(&ctx, &mut StaleConfidenceScorer).unwrap().clone();
    let mut states = Vec::new();
    let mut batch_index = Vec::new();
    let mut replay = Vec::new();
    for i in 0..tree.len() {
        let mut s = vec![0.0; L];
        let ids = [i as u32];
        StaleConfidenceScorer
            .score(&ctx, &NodeBatch::new(&tree, &ids), &mut s)
            .unwrap();
        replay.push((tree.hash(i), s));
        if tree.is_complete(i) {
            batch_index.push(NOT_IN_BATCH);
        } else {
            batch_index.push(states.len() as u32);
            states.push(tree.block_state(i));
        }
    }
    let node_stats = model.forward(&states, &q).unwrap();
    Setup {
        root,
        stale,
        node_stats,
        batch_index,
        replay,
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("round_L32");
    for budget in [8usize, 20] {
        let s = setup(budget);
        let ctx = ScoreContext {
            root: &s.root,
            stale: &s.stale,
            block_start: 256,
            noise: None,
            temperature: 0.0,
        };
        let mut builder = TreeBuilder::new(TreeConfig {
            budget,
            ..TreeConfig::default()
        })
        .unwrap();
        let mut out = Walk::default();
        let mut scratch: Vec<Commit> = Vec::new();
        let mut replay = Replay {
            table: s.replay.clone(),
        };
        let scorers: [(&str, &mut dyn OrderScorer); 2] = [
            ("stale-confidence", &mut StaleConfidenceScorer),
            ("precomputed-scores", &mut replay),
        ];
        for (name, scorer) in scorers {
            group.bench_function(BenchmarkId::new(name, format!("D{budget}")), |b| {
                b.iter(|| {
                    let tree = builder.build(&ctx, scorer).unwrap();
                    walk(
                        tree,
                        &s.batch_index,
                        &s.node_stats,
                        (Transition::Exact, 1),
                        MatchRule::Coupled,
                        &mut out,
                        &mut scratch,
                    )
                    .unwrap();
                    black_box(out.commit_count())
                })
            });
        }
        group.bench_function(
            BenchmarkId::new("peaked-scorer-build", format!("D{budget}")),
            |b| b.iter(|| black_box(builder.build(&ctx, &mut Peaked).unwrap().draft_count())),
        );
        let deep = builder.build(&ctx, &mut Peaked).unwrap();
        eprintln!(
            "D{budget}: peaked tree max depth {}",
            (0..deep.len()).map(|i| deep.depth(i)).max().unwrap_or(0)
        );
        group.bench_function(BenchmarkId::new("chain", format!("D{budget}")), |b| {
            b.iter(|| {
                let tree = builder.build_chain(&ctx).unwrap();
                black_box(tree.draft_count())
            })
        });
        let tree = builder.build(&ctx, &mut StaleConfidenceScorer).unwrap();
        walk(
            tree,
            &s.batch_index,
            &s.node_stats,
            (Transition::Exact, 1),
            MatchRule::Coupled,
            &mut out,
            &mut scratch,
        )
        .unwrap();
        eprintln!(
            "D{budget}: tree of {} nodes, max depth {}, walk accepted {} and committed {}",
            tree.draft_count(),
            (0..tree.len()).map(|i| tree.depth(i)).max().unwrap_or(0),
            out.accepted_nodes,
            out.commit_count()
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
