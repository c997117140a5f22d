//! Structural properties of the tree builders, checked against a brute-force enumeration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use proptest::prelude::*;
use spot_core::stats::PositionStats;
use spot_core::{BlockState, BlockStats, Commit, TokenId};
use spot_tree::{
    DraftTree, Expand, NodeBatch, OrderScorer, RandomScorer, ScoreContext, StaleConfidenceScorer,
    TreeBuilder, TreeConfig, TreeError,
};

const MASK: TokenId = 99;

fn cases() -> u32 {
    std::env::var("SPOT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Stale statistics with arbitrary probabilities; some positions share tokens and
/// probabilities so that different paths reach equal states and masses tie.
fn stale(len: usize) -> impl Strategy<Value = BlockStats> {
    prop::collection::vec(
        (0u32..4, prop_oneof![Just(0.5f32), Just(0.9), 0.01f32..1.0]),
        len,
    )
    .prop_map(|rows| {
        let mut st = BlockStats::new(2);
        for (tok, p) in rows {
            st.push(PositionStats {
                token: tok,
                confidence: p,
                token_prob: p,
                entropy: 1.0,
                tail_mass: 0.0,
                top_ids: &[tok, tok + 10],
                top_probs: &[p, (1.0 - p) * 0.9],
            })
            .unwrap();
        }
        st
    })
}

fn root(len: usize) -> impl Strategy<Value = BlockState> {
    prop::collection::vec(prop_oneof![3 => Just(MASK), 1 => 20u32..30], len)
        .prop_map(|t| BlockState::from_tokens(t, MASK))
}

fn cfg() -> impl Strategy<Value = TreeConfig> {
    cfg_with(3)
}

/// Limits with best-first batches of at most `max_batch` nodes (or layer by layer).
fn cfg_with(max_batch: usize) -> impl Strategy<Value = TreeConfig> {
    (
        1usize..=24,
        1usize..=5,
        prop_oneof![Just(0.0f32), Just(0.01), Just(0.1)],
        any::<bool>(),
        prop_oneof![
            Just(Expand::Layers),
            Just(Expand::BestFirst { batch: None }),
            (1usize..=max_batch).prop_map(|k| Expand::BestFirst { batch: Some(k) })
        ],
    )
        .prop_map(|(budget, max_depth, gamma, hedge, expand)| TreeConfig {
            budget,
            max_depth,
            gamma,
            hedge: hedge.then_some(0.6),
            sum_orders: false,
            expand,
        })
}

fn check_structure(tree: &DraftTree, cfg: &TreeConfig) -> Result<(), TestCaseError> {
    prop_assert!(tree.draft_count() <= cfg.budget);
    let mut seen = HashMap::new();
    for i in 0..tree.len() {
        prop_assert!(
            seen.insert(tree.state(i).to_vec(), i).is_none(),
            "duplicate state"
        );
        prop_assert!(tree.depth(i) <= cfg.max_depth);
        if let Some(p) = tree.parent(i) {
            prop_assert!(p < i);
            prop_assert!(tree.mass(i) <= tree.mass(p));
            prop_assert!(tree.mass(i) >= cfg.gamma);
            prop_assert_eq!(tree.depth(i), tree.depth(p) + 1);
            prop_assert_eq!(tree.edge(i).len(), 1);
            let e = tree.edge(i)[0];
            let expect = BlockState::from_tokens(tree.state(p).to_vec(), MASK)
                .with_commit(e)
                .unwrap();
            prop_assert_eq!(tree.state(i), expect.tokens());
            prop_assert_eq!(tree.find_successor(p, &[e]), Some(i));
        }
    }
    Ok(())
}

/// All states reachable within the limits with their depth, each with the largest mass over
/// its paths, or (`cfg.sum_orders`) the sum over every path, capped at its heaviest parent.
fn brute_force(
    root: &BlockState,
    stale: &BlockStats,
    cfg: &TreeConfig,
    scorer: &mut dyn OrderScorer,
) -> HashMap<Vec<TokenId>, (f32, usize)> {
    let ctx = ScoreContext {
        root,
        stale,
        block_start: 0,
        noise: None,
        temperature: 0.0,
    };
    let mut layer: HashMap<Vec<TokenId>, f32> = HashMap::new();
    layer.insert(root.tokens().to_vec(), 1.0);
    let mut all = HashMap::new();
    for depth in 0..cfg.max_depth {
        // Per state: (max or sum of path masses, heaviest parent).
        let mut next: HashMap<Vec<TokenId>, (f32, f32)> = HashMap::new();
        for (tokens, m) in &layer {
            let tree = DraftTree::new(&BlockState::from_tokens(tokens.clone(), MASK));
            let mut q = vec![0.0; root.len()];
            scorer
                .score(&ctx, &NodeBatch::new(&tree, &[0]), &mut q)
                .unwrap();
            for s in (0..root.len()).filter(|&s| tokens[s] == MASK) {
                let mut hyps = vec![(stale.token(s), stale.token_prob(s))];
                if cfg.hedge.is_some_and(|h| stale.token_prob(s) < h) {
                    let (ids, probs) = stale.top(s);
                    hyps.push((ids[1], probs[1]));
                }
                for (v, p) in hyps {
                    let mass = (m * q[s] * p).min(*m);
                    if mass <= 0.0 || mass < cfg.gamma {
                        continue;
                    }
                    let mut t = tokens.clone();
                    t[s] = v;
                    let e = next.entry(t).or_insert((0.0, 0.0));
                    e.0 = if cfg.sum_orders {
                        e.0 + mass
                    } else {
                        e.0.max(mass)
                    };
                    e.1 = e.1.max(*m);
                }
            }
        }
        layer = next
            .into_iter()
            .map(|(t, (m, parent))| (t, m.min(parent)))
            .collect();
        all.extend(layer.iter().map(|(t, &m)| (t.clone(), (m, depth + 1))));
    }
    all
}

/// The `D` heaviest of `all` as (mass, depth), heaviest first.
fn top_d(all: &HashMap<Vec<TokenId>, (f32, usize)>, budget: usize) -> Vec<(f32, usize)> {
    let mut v: Vec<(f32, usize)> = all.values().copied().collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    v.truncate(budget);
    v
}

/// The random control or stale confidence (two instances score alike).
fn scorer(random: bool, seed: u64) -> Box<dyn OrderScorer> {
    if random {
        Box::new(RandomScorer { seed })
    } else {
        Box::new(StaleConfidenceScorer)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The best-first builder keeps exactly the `D` heaviest states of the whole candidate
    /// tree (same masses and depths as an exhaustive search), with unique states, layer by
    /// layer and one node a call. (With more nodes a call, a state reached again through a
    /// node scored in the same call keeps its first path's mass: bounded below.)
    #[test]
    fn best_first_is_the_exact_top_d((root, stale) in (1usize..=7).prop_flat_map(|l| (root(l), stale(l))),
                                     cfg in cfg_with(1), random in any::<bool>(), seed in any::<u64>()) {
        let mut builder = TreeBuilder::new(cfg).unwrap();
        let ctx = ScoreContext { root: &root, stale: &stale, block_start: 0, noise: None, temperature: 0.0 };
        let (mut a, mut b) = (scorer(random, seed), scorer(random, seed));
        let tree = builder.build(&ctx, a.as_mut()).unwrap();
        check_structure(tree, &cfg)?;
        let mut got: Vec<(f32, usize)> = (1..tree.len()).map(|i| (tree.mass(i), tree.depth(i))).collect();
        got.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let want = top_d(&brute_force(&root, &stale, &cfg, b.as_mut()), cfg.budget);
        prop_assert_eq!(got, want);
    }

    /// With summed orders, every node's mass is at most the sum over every path to its state
    /// (the builder only sees paths through nodes it kept) and at most its parent's; without a
    /// mass floor the tree has as many nodes as without summing.
    #[test]
    fn summed_masses_are_bounded_by_all_paths((root, stale) in (1usize..=7).prop_flat_map(|l| (root(l), stale(l))),
                                              cfg in cfg(), random in any::<bool>(), seed in any::<u64>()) {
        let cfg = TreeConfig { sum_orders: true, ..cfg };
        let mut builder = TreeBuilder::new(cfg).unwrap();
        let ctx = ScoreContext { root: &root, stale: &stale, block_start: 0, noise: None, temperature: 0.0 };
        let (mut a, mut b) = (scorer(random, seed), scorer(random, seed));
        let tree = builder.build(&ctx, a.as_mut()).unwrap();
        check_structure(tree, &cfg)?;
        let summed = brute_force(&root, &stale, &cfg, b.as_mut());
        for i in 1..tree.len() {
            let (m, d) = (tree.mass(i), tree.depth(i));
            let hi = summed.get(tree.state(i)).copied();
            prop_assert!(hi.is_some(), "node {i}: a state no path reaches");
            let hi = hi.unwrap_or_default();
            prop_assert_eq!(hi.1, d);
            let p = tree.parent(i).unwrap();
            prop_assert!(m <= hi.0 * (1.0 + 1e-5), "node {i}: {m} above all paths' {}", hi.0);
            prop_assert!(m <= tree.mass(p));
            prop_assert!(m > 0.0 && m >= cfg.gamma);
        }
        // Without a mass floor, summing changes which states are kept, not how many.
        let count = tree.draft_count();
        let plain = TreeBuilder::new(TreeConfig { sum_orders: false, ..cfg }).unwrap().build(&ctx, a.as_mut()).unwrap().draft_count();
        if cfg.gamma == 0.0 {
            prop_assert_eq!(count, plain);
        }
    }

    /// The chain follows stale confidence order with stale tokens.
    #[test]
    fn chain_follows_stale_confidence((root, stale) in (1usize..=12).prop_flat_map(|l| (root(l), stale(l))),
                                      cfg in cfg()) {
        let mut builder = TreeBuilder::new(cfg).unwrap();
        let ctx = ScoreContext { root: &root, stale: &stale, block_start: 0, noise: None, temperature: 0.0 };
        let tree = builder.build_chain(&ctx).unwrap();
        check_structure(tree, &cfg)?;
        let mut prev = f32::INFINITY;
        for i in 1..tree.len() {
            prop_assert_eq!(tree.parent(i), Some(i - 1));
            prop_assert_eq!(tree.edge(i).len(), 1);
            let e = tree.edge(i)[0];
            prop_assert_eq!(e.token, stale.token(e.position));
            prop_assert!(stale.token_prob(e.position) <= prev);
            prev = stale.token_prob(e.position);
        }
        let expected = cfg.budget.min(cfg.max_depth).min(root.masked_count());
        if cfg.gamma == 0.0 {
            prop_assert_eq!(tree.draft_count(), expected);
        }
    }
}

/// Two commits in either order reach one state: the builder keeps one node, and the walk
/// finds it from either parent by value.
#[test]
fn identical_states_are_merged() {
    let mut st = BlockStats::new(1);
    for _ in 0..2 {
        st.push(PositionStats {
            token: 5,
            confidence: 0.9,
            token_prob: 0.9,
            entropy: 0.1,
            tail_mass: 0.0,
            top_ids: &[5],
            top_probs: &[0.9],
        })
        .unwrap();
    }
    let root = BlockState::masked(2, MASK);
    let ctx = ScoreContext {
        root: &root,
        stale: &st,
        block_start: 0,
        noise: None,
        temperature: 0.0,
    };
    // Layer by layer both orders are made in one call; best-first one node a call, so the
    // second order finds the state already kept (and not scored: it is complete).
    for expand in [
        Expand::Layers,
        Expand::BestFirst { batch: Some(1) },
        Expand::BestFirst { batch: Some(2) },
    ] {
        let mut b = TreeBuilder::new(TreeConfig {
            budget: 10,
            expand,
            ..TreeConfig::default()
        })
        .unwrap();
        let tree = b.build(&ctx, &mut StaleConfidenceScorer).unwrap();
        // root -> {[5,M], [M,5]} -> [5,5] once.
        assert_eq!(tree.draft_count(), 3);
        let full = (0..tree.len()).find(|&i| tree.is_complete(i)).unwrap();
        // Each order alone: 0.45 · 1 · 0.9 = 0.405; both: 0.81, capped at the parent's 0.45.
        assert_eq!(tree.mass(full), 0.45);
        let single = TreeBuilder::new(TreeConfig {
            budget: 10,
            sum_orders: false,
            expand,
            ..TreeConfig::default()
        })
        .unwrap()
        .build(&ctx, &mut StaleConfidenceScorer)
        .unwrap()
        .clone();
        let full1 = (0..single.len()).find(|&i| single.is_complete(i)).unwrap();
        assert_eq!(single.mass(full1), 0.45 * 0.9);
        let a = tree.find_successor(0, &[Commit::new(0, 5)]).unwrap();
        let c = tree.find_successor(0, &[Commit::new(1, 5)]).unwrap();
        assert_eq!(tree.find_successor(a, &[Commit::new(1, 5)]), Some(full));
        assert_eq!(tree.find_successor(c, &[Commit::new(0, 5)]), Some(full));
        assert_eq!(
            tree.find_successor(0, &[Commit::new(0, 5), Commit::new(1, 5)]),
            Some(full)
        );
    }
}

struct Bad(f32);
impl OrderScorer for Bad {
    fn name(&self) -> &str {
        "bad"
    }
    fn score(
        &mut self,
        _: &ScoreContext<'_>,
        _: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        out.fill(self.0);
        Ok(())
    }
}

#[test]
fn invalid_scores_and_limits_are_typed_errors() {
    let mut st = BlockStats::new(1);
    st.push(PositionStats {
        token: 1,
        confidence: 0.5,
        token_prob: 0.5,
        entropy: 0.0,
        tail_mass: 0.0,
        top_ids: &[1],
        top_probs: &[0.5],
    })
    .unwrap();
    let root = BlockState::masked(1, MASK);
    let ctx = ScoreContext {
        root: &root,
        stale: &st,
        block_start: 0,
        noise: None,
        temperature: 0.0,
    };
    let mut b = TreeBuilder::new(TreeConfig::default()).unwrap();
    for v in [f32::NAN, f32::INFINITY, -1.0] {
        assert!(matches!(
            b.build(&ctx, &mut Bad(v)),
            Err(TreeError::InvalidScore { position: 0, .. })
        ));
    }
    let short = BlockState::masked(3, MASK);
    let ctx = ScoreContext {
        root: &short,
        stale: &st,
        block_start: 0,
        noise: None,
        temperature: 0.0,
    };
    assert!(matches!(
        b.build(&ctx, &mut StaleConfidenceScorer),
        Err(TreeError::StaleShape {
            expected: 3,
            actual: 1
        })
    ));
    let bad = [
        (
            TreeConfig {
                budget: 0,
                ..TreeConfig::default()
            },
            "budget",
        ),
        (
            TreeConfig {
                max_depth: 0,
                ..TreeConfig::default()
            },
            "max_depth",
        ),
        (
            TreeConfig {
                gamma: f32::NAN,
                ..TreeConfig::default()
            },
            "gamma",
        ),
        (
            TreeConfig {
                gamma: 1.0,
                ..TreeConfig::default()
            },
            "gamma",
        ),
        (
            TreeConfig {
                gamma: -0.1,
                ..TreeConfig::default()
            },
            "gamma",
        ),
        (
            TreeConfig {
                hedge: Some(1.5),
                ..TreeConfig::default()
            },
            "hedge",
        ),
        (
            TreeConfig {
                hedge: Some(f32::NAN),
                ..TreeConfig::default()
            },
            "hedge",
        ),
    ];
    for (cfg, field) in bad {
        match TreeBuilder::new(cfg) {
            Err(TreeError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidConfig, got {other:?}"),
        }
    }
}

/// At `T > 0` the hedge is the runner-up of the target's own rule, `ln p~ + G`, among the stale
/// top-k; at `T = 0` the most probable other token.
#[test]
fn the_hedge_is_the_noised_runner_up() {
    use spot_core::GumbelNoise;
    let ids = [7u32, 3, 11, 5, MASK];
    let probs = [0.4f32, 0.3, 0.2, 0.05, 0.04];
    let mut st = BlockStats::new(ids.len());
    st.push(PositionStats {
        token: 7,
        confidence: 0.4,
        token_prob: 0.4,
        entropy: 1.0,
        tail_mass: 0.01,
        top_ids: &ids,
        top_probs: &probs,
    })
    .unwrap();
    let root = BlockState::masked(1, MASK);
    let mut ctx = ScoreContext {
        root: &root,
        stale: &st,
        block_start: 40,
        noise: None,
        temperature: 0.0,
    };
    assert_eq!(ctx.hedge_token(0, MASK), Some((3, 0.3)));
    let mut picked = std::collections::HashSet::new();
    for seed in 0..64 {
        let noise = GumbelNoise::new(seed);
        ctx.noise = Some(noise);
        let want = [(3u32, 0.3f32), (11, 0.2), (5, 0.05)]
            .into_iter()
            .max_by(|a, b| {
                (a.1.ln() + noise.value(40, a.0)).total_cmp(&(b.1.ln() + noise.value(40, b.0)))
            })
            .unwrap();
        assert_eq!(ctx.hedge_token(0, MASK), Some(want), "seed {seed}");
        picked.insert(want.0);
    }
    // The noise moves the hedge off the probability runner-up for some seeds.
    assert!(picked.len() > 1, "{picked:?}");
}

#[test]
fn expansions_parse_and_print() {
    for (text, want) in [
        ("layers", Expand::Layers),
        ("best-first", Expand::BestFirst { batch: None }),
        ("best-first:3", Expand::BestFirst { batch: Some(3) }),
    ] {
        let got: Expand = text.parse().unwrap();
        assert_eq!(got, want);
        assert_eq!(got.to_string(), text);
    }
    for bad in ["best-first:0", "best-first:x", "layer", "best-first:"] {
        assert!(bad.parse::<Expand>().is_err(), "{bad}");
    }
    let zero = TreeConfig {
        expand: Expand::BestFirst { batch: Some(0) },
        ..TreeConfig::default()
    };
    assert!(zero.validate().is_err());
}
