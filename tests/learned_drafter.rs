//! The learned drafter inside the speculative decoder: output identical to draft-free decoding
//! with untrained and trained networks, at T = 0 and T = 1, budgets 4 and 12. (Whether the
//! drafter saves forwards is measured on the shipped model by `spot bench`, not asserted on a
//! toy whose commit order is mostly hash noise.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn_autodiff::Autodiff;
use burn_flex::Flex;
use spot_core::toy::{ToyConfig, ToyModel};
use spot_dlm::{DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer};
use spot_drafter::{
    Calibrated, LearnedScorer, OrderModel, OrderModelConfig, PriorWeight, RankTilt, SpiffyGraph,
    SpiffyScorer, TokenCalibration,
};
use spot_train::{CalibrateSpiffy, FitCalibration, TrainConfig, record, train};

type B = Flex<f32>;

fn toy(seed: u64) -> ToyModel {
    ToyModel::new(ToyConfig {
        vocab_size: 64,
        mask_id: 63,
        seed,
        stability: 0.6,
        peak: 4.0,
        ..ToyConfig::default()
    })
}

fn cfg(t: f32) -> DecodeConfig {
    DecodeConfig {
        block_size: 16,
        max_new_tokens: 48,
        temperature: t,
        seed: 9,
        early_stop: false,
        ..DecodeConfig::default()
    }
}

fn net_cfg() -> OrderModelConfig {
    OrderModelConfig {
        block_size: 16,
        d_model: 32,
        heads: 4,
        ffn: 64,
        layers: 2,
        ..OrderModelConfig::default()
    }
}

fn total_nfe(model: &OrderModel<B>, seeds: std::ops::Range<u64>, t: f32, budget: usize) -> u64 {
    let make = || {
        SpotDecoder::builder()
            .budget(budget)
            .scorer(LearnedScorer::new(model.clone()))
            .build()
            .unwrap()
    };
    nfe_checked(&make, seeds, t, &format!("spot D={budget}"))
}

/// Decodes each seed's prompt with a fresh decoder from `make` and draft-free; asserts equal
/// output and no more NFE; returns the total NFE.
fn nfe_checked(
    make: &dyn Fn() -> SpotDecoder,
    seeds: std::ops::Range<u64>,
    t: f32,
    label: &str,
) -> u64 {
    let mut nfe = 0;
    for seed in seeds {
        let prompt: Vec<u32> = (1..8).map(|x| (x + seed as u32) % 60 + 1).collect();
        let mut m = toy(seed);
        let want = DraftFreeDecoder::new()
            .decode(&mut m, &prompt, &cfg(t))
            .unwrap();
        let got = make().decode(&mut m, &prompt, &cfg(t)).unwrap();
        assert_eq!(got.tokens, want.tokens, "seed {seed} T={t} {label}");
        assert_eq!(got.generated, want.generated, "seed {seed} T={t} {label}");
        assert!(got.stats.work.nfe <= want.stats.work.nfe);
        nfe += got.stats.work.nfe;
    }
    nfe
}

#[test]
fn learned_drafter_is_exact() {
    let untrained = OrderModel::<B>::init(net_cfg(), 4, &Default::default());
    // Half at T = 0, half at T = 1: one token calibration per temperature.
    let trajs: Vec<_> = (100..130u64)
        .map(|seed| {
            let prompt: Vec<u32> = (1..8).map(|x| (x + seed as u32) % 60 + 1).collect();
            let t = (seed % 2) as f32;
            record(&mut toy(seed), &prompt, &cfg(t), "t").unwrap().1
        })
        .collect();
    let tc = TrainConfig {
        epochs: 3,
        batch_size: 64,
        lr: 2e-3,
        holdout: 0.1,
        seed: 1,
        ..TrainConfig::default()
    };
    let (trained, reports) =
        train::<Autodiff<B>>(&trajs, net_cfg(), &tc, &Default::default(), &mut ()).unwrap();
    let acc = &reports.last().unwrap().heldout;
    let cals = &trained.config().token_calibration_by_temperature;
    let temps: Vec<_> = cals.iter().map(|c| c.temperature).collect();
    assert_eq!(temps, [Some(0.0), Some(1.0)]);
    // The baselines with the same calibration (only the order differs from SPOT's) are exact.
    for t in [0.0, 1.0] {
        let make = || {
            SpotDecoder::builder()
                .budget(8)
                .scorer(Calibrated::new(StaleConfidenceScorer, cals.clone()))
                .build()
                .unwrap()
        };
        let nfe = nfe_checked(&make, 0..6, t, "calibrated blockspec D=8");
        eprintln!("T={t} D=8: calibrated blockspec NFE {nfe}");
    }
    // Leaning the order towards the stale ranking changes the tree, never the output.
    let mut tilted = trained.clone();
    tilted.set_rank_tilts(vec![
        RankTilt {
            temperature: 0.0,
            tilt: 0.3,
        },
        RankTilt {
            temperature: 1.0,
            tilt: 1.5,
        },
    ]);
    depth0_hits_are_evaluate_ons(&trained, &tilted, &trajs);
    for t in [0.0, 1.0] {
        let nfe = total_nfe(&tilted, 0..6, t, 8);
        eprintln!("T={t} D=8: tilted spot NFE {nfe}");
    }
    // So does mixing the order with a rank-path prior.
    let mut mixed = tilted.clone();
    mixed.set_rank_prior(
        Some(SpiffyGraph::calibrate(&trajs, 6, 64).unwrap()),
        vec![
            PriorWeight {
                temperature: 0.0,
                weight: 0.5,
            },
            PriorWeight {
                temperature: 1.0,
                weight: 0.8,
            },
        ],
    );
    for t in [0.0, 1.0] {
        let nfe = total_nfe(&mixed, 0..6, t, 8);
        eprintln!("T={t} D=8: spot with the rank-path prior NFE {nfe}");
    }
    for t in [0.0, 1.0] {
        for budget in [4, 12] {
            let before = total_nfe(&untrained, 0..6, t, budget);
            let after = total_nfe(&trained, 0..6, t, budget);
            eprintln!(
                "T={t} D={budget}: NFE untrained {before}, trained {after} (held-out accuracy {:.3}, stale confidence {:.3})",
                acc.drafter(),
                acc.confidence()
            );
        }
    }
}

/// The Spiffy-style static graph, calibrated on other prompts' trajectories, is exact too.
#[test]
fn spiffy_graph_is_exact() {
    let trajs: Vec<_> = (200..220u64)
        .map(|seed| {
            let prompt: Vec<u32> = (1..8).map(|x| (x + seed as u32) % 60 + 1).collect();
            record(&mut toy(seed), &prompt, &cfg(0.0), "t").unwrap().1
        })
        .collect();
    let graph = SpiffyGraph::calibrate(&trajs, 6, 64).unwrap();
    // With and without token calibration (none: Spiffy's own weight-1 stale tokens).
    let refs: Vec<_> = trajs.iter().collect();
    let fitted =
        TokenCalibration::fit_per_temperature(&refs, 7, spot_drafter::CalibrationPaths::Drafted);
    for (cals, t) in [
        (Vec::new(), 0.0),
        (Vec::new(), 1.0),
        (fitted.clone(), 0.0),
        (fitted, 1.0),
    ] {
        for budget in [4, 12] {
            let make = || {
                SpotDecoder::builder()
                    .budget(budget)
                    .max_depth(graph.max_depth)
                    .scorer(Calibrated::new(SpiffyScorer::new(&graph), cals.clone()))
                    .build()
                    .unwrap()
            };
            let nfe = nfe_checked(&make, 0..6, t, &format!("spiffy D={budget}"));
            eprintln!(
                "T={t} D={budget}: spiffy NFE {nfe} ({} calibrations)",
                cals.len()
            );
        }
    }
}

/// Replaying a recorded trajectory counts exactly the forwards, accepted nodes and prefetched
/// block starts of a live speculative decode without draft refresh, with the same builder and scorer, for the
/// learned order (tilted), calibrated BlockSpec and the stale-confidence tree.
#[test]
fn replay_counts_what_a_live_decode_does() {
    let mut net = OrderModel::<B>::init(net_cfg(), 4, &Default::default());
    net.set_rank_tilts(vec![RankTilt {
        temperature: 1.0,
        tilt: 0.5,
    }]);
    let fit: Vec<_> = (300..306u64)
        .map(|seed| {
            let prompt: Vec<u32> = (1..8).map(|x| (x + seed as u32) % 60 + 1).collect();
            record(&mut toy(seed), &prompt, &cfg(1.0), "t").unwrap().1
        })
        .collect();
    let cals = TokenCalibration::fit_per_temperature(
        &fit.iter().collect::<Vec<_>>(),
        7,
        spot_drafter::CalibrationPaths::Drafted,
    );
    let mut mixed = net.clone();
    mixed.set_rank_prior(
        Some(SpiffyGraph::calibrate(&fit, 6, 64).unwrap()),
        vec![PriorWeight {
            temperature: 0.0,
            weight: 0.7,
        }],
    );
    for t in [0.0, 1.0] {
        replay_matches(t, "spot", || LearnedScorer::new(net.clone()));
        replay_matches(t, "spot with a prior", || LearnedScorer::new(mixed.clone()));
        replay_matches(t, "blockspec", || {
            Calibrated::new(StaleConfidenceScorer, cals.clone())
        });
        replay_matches(t, "stale", || StaleConfidenceScorer);
    }
}

fn replay_matches<S: spot_dlm::OrderScorer + Send + 'static>(
    t: f32,
    name: &str,
    make: impl Fn() -> S,
) {
    use spot_dlm::BlockEnds;
    use spot_dlm::{TreeBuilder, TreeConfig};
    use spot_train::replay::replay;
    for fill in [0, 8] {
        let (mut live, mut replayed) = ((0, 0, 0), (0, 0, 0));
        for seed in 0..4u64 {
            let prompt: Vec<u32> = (1..8).map(|x| (x + seed as u32) % 60 + 1).collect();
            let mut m = toy(seed);
            let (_, traj) = record(&mut m, &prompt, &cfg(t), "r").unwrap();
            let got = SpotDecoder::builder()
                .budget(6)
                .block_ends(BlockEnds {
                    fill,
                    refresh: false,
                })
                .scorer(make())
                .build()
                .unwrap()
                .decode(&mut m, &prompt, &cfg(t))
                .unwrap();
            live.0 += got.stats.work.block_forwards;
            live.1 += got.stats.accepted_nodes;
            live.2 += got.stats.prefetched_forwards;
            let mut b = TreeBuilder::new(TreeConfig {
                budget: 6,
                ..TreeConfig::default()
            })
            .unwrap();
            let n = replay(&traj, &mut b, &mut make(), fill).unwrap();
            replayed.0 += n.forwards as u64;
            replayed.1 += n.accepted as u64;
            replayed.2 += n.prefetched as u64;
        }
        assert_eq!(
            live, replayed,
            "T={t} {name} fill {fill}: (forwards, accepted, prefetched)"
        );
        assert!(live.1 > 0, "T={t} {name}: no node accepted");
        assert!(live.2 > 0, "T={t} {name}: no block start prefetched");
    }
}

/// `replay::depth0_hits` (what `spot eval-drafter` reports "as SPOT decodes") counts the
/// depth-0 hits `evaluate_on` counts: stale confidence's, and the raw network's when it
/// decodes without tilt or prior; a large tilt brings the order to stale confidence's pick.
fn depth0_hits_are_evaluate_ons(
    trained: &OrderModel<B>,
    tilted: &OrderModel<B>,
    trajs: &[spot_train::Trajectory],
) {
    use spot_train::replay::depth0_hits;
    let hits = |scorer: &mut dyn spot_dlm::OrderScorer| {
        trajs.iter().fold((0, 0), |(h, n), t| {
            let (a, b) = depth0_hits(t, scorer).unwrap();
            (h + a, n + b)
        })
    };
    let acc = spot_train::evaluate_on(trained, trajs, 0);
    let stale = hits(&mut StaleConfidenceScorer);
    assert_eq!(stale, (acc.confidence_hits[0], acc.count[0]));
    let mut raw = trained.clone();
    raw.set_rank_tilts(Vec::new());
    let net = hits(&mut LearnedScorer::new(raw));
    assert_eq!(net, (acc.drafter_hits[0], acc.count[0]));
    assert_ne!(
        net.0, stale.0,
        "the trained order should differ from stale confidence's"
    );
    let mut steep = tilted.clone();
    steep.set_rank_tilts(vec![RankTilt {
        temperature: 0.0,
        tilt: 1000.0,
    }]);
    assert_eq!(hits(&mut LearnedScorer::new(steep)), stale);
    let mid = hits(&mut LearnedScorer::new(tilted.clone()));
    eprintln!(
        "depth 0 over {} examples: stale {}, network {}, tilted {}",
        acc.count[0], stale.0, net.0, mid.0
    );
}

/// The shipped drafter scores through its packed host path (`LearnedScorer::new`) and through
/// burn (`LearnedScorer::burn`) to the same trees: on toy prompts (a block of 32) at T = 0
/// and 1, D = 8 and 20, layer by layer and best-first two nodes a call, both decode
/// draft-free's tokens with the same forwards, accepted-node histogram, round ends and drafter
/// counts. `spot-reuse`'s approximate order (nodes below
/// depth 1 take their parent's) and the int8 products (`Precision::Int8`) may change trees,
/// never the output.
#[test]
fn the_host_path_drafts_the_trees_burn_drafts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = root.join("models/sdar-tiny-code/spot-drafter.safetensors");
    let net = spot_drafter::checkpoint::load::<B>(&shipped, &Default::default()).unwrap();
    let cfg32 = |t: f32| DecodeConfig {
        block_size: 32,
        max_new_tokens: 32,
        ..cfg(t)
    };
    let expansions = [
        spot_dlm::Expand::Layers,
        spot_dlm::Expand::BestFirst { batch: Some(2) },
    ];
    for (t, expand) in [0.0, 1.0].into_iter().zip(expansions) {
        for budget in [8, 20] {
            let mut scored = 0;
            for seed in 0..(if budget == 8 { 2u64 } else { 1 }) {
                let prompt: Vec<u32> = (1..8).map(|x| (x * 7 + seed as u32) % 60 + 1).collect();
                let want = DraftFreeDecoder::new()
                    .decode(&mut toy(seed), &prompt, &cfg32(t))
                    .unwrap();
                let run = |scorer: LearnedScorer<B>| {
                    let mut d = SpotDecoder::builder()
                        .budget(budget)
                        .expand(expand)
                        .scorer(scorer)
                        .build()
                        .unwrap();
                    let out = d.decode(&mut toy(seed), &prompt, &cfg32(t)).unwrap();
                    assert_eq!(out.tokens, want.tokens, "seed {seed} T={t} D={budget}");
                    let mut r = d.report().clone();
                    (r.draft_time, r.verify_time) = Default::default();
                    r.round_draft.clear();
                    (out.stats.work, r)
                };
                let host = run(LearnedScorer::new(net.clone()));
                let burn = run(LearnedScorer::burn(net.clone()));
                assert_eq!(host, burn, "seed {seed} T={t} D={budget}");
                run(LearnedScorer::new(net.clone()).reuse_below(1));
                let int8 = run(LearnedScorer::with_precision(
                    net.clone(),
                    spot_drafter::Precision::Int8,
                ));
                assert!(int8.1.drafter.scored_nodes > 0);
                scored += host.1.drafter.scored_nodes;
            }
            assert!(scored > 0, "T={t} D={budget}: nothing was scored");
        }
    }
}
