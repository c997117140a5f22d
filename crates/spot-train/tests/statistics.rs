//! Trajectory statistics: the Spiffy graph (calibration, file), token hit rates and the token
//! calibration of the learned scorer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use spot_core::DecodeConfig;
use spot_core::toy::{ToyConfig, ToyModel};
use spot_drafter::spiffy::SpiffyGraph;
use spot_drafter::{DrafterError, GraphError, StaleSource};
use spot_train::fit::{CalibrateSpiffy, FitCalibration};
use spot_train::{Trajectory, examples, record, token_hits};

fn toy(seed: u64, stability: f32) -> ToyModel {
    ToyModel::new(ToyConfig {
        vocab_size: 64,
        mask_id: 63,
        seed,
        stability,
        stop_ids: vec![1],
        ..ToyConfig::default()
    })
}

fn trajectories(n: u64, stability: f32, t: f32) -> Vec<Trajectory> {
    (0..n)
        .map(|seed| {
            let cfg = DecodeConfig {
                block_size: 8,
                max_new_tokens: 24,
                temperature: t,
                seed,
                stop_ids: vec![1],
                early_stop: false,
                ..DecodeConfig::default()
            };
            let prompt = [2, 3, 4 + seed as u32];
            record(&mut toy(seed, stability), &prompt, &cfg, "p")
                .unwrap()
                .1
        })
        .collect()
}

/// The graph counts exactly the rank paths the draft-free decoder followed.
#[test]
fn calibration_counts_the_true_rank_paths() {
    let trajs = trajectories(12, 0.5, 0.0);
    let g = SpiffyGraph::calibrate(&trajs, 3, 10_000).unwrap();
    // Independent count of depth-0 examples and of those whose target is the most confident
    // masked position (ties by position).
    let (mut seqs, mut top) = (0u64, 0u64);
    for t in &trajs {
        examples(t, 0, |ex| {
            seqs += 1;
            let conf = |s: usize| ex.stale.position(s).map_or(0.0, |p| p.confidence);
            let best = (0..ex.state.len())
                .filter(|&s| ex.state[s] == 63)
                .fold(None, |b: Option<usize>, s| match b {
                    Some(x) if conf(x) >= conf(s) => Some(x),
                    _ => Some(s),
                })
                .unwrap();
            top += u64::from(best == ex.target);
        });
    }
    assert!(seqs > 50, "{seqs} sequences");
    assert_eq!(g.sequences, seqs);
    let count = |r: &[u16]| g.paths.iter().find(|p| p.ranks == r).map_or(0, |p| p.count);
    assert_eq!(count(&[0]), top);
    let depth1: u64 = g
        .paths
        .iter()
        .filter(|p| p.ranks.len() == 1)
        .map(|p| p.count)
        .sum();
    assert_eq!(depth1, seqs);
    for p in &g.paths {
        assert!(p.ranks.len() <= 3);
        let parent = &p.ranks[..p.ranks.len() - 1];
        if !parent.is_empty() {
            assert!(count(parent) >= p.count, "{:?}", p.ranks);
        }
    }
}

/// Keeping only the most frequent paths keeps every prefix of a kept path.
#[test]
fn truncated_graphs_are_closed_under_prefixes() {
    let trajs = trajectories(8, 0.5, 1.0);
    for keep in [1, 2, 5, 9, 20] {
        let g = SpiffyGraph::calibrate(&trajs, 6, keep).unwrap();
        assert_eq!(g.paths.len(), keep);
        for p in &g.paths {
            for k in 1..p.ranks.len() {
                assert!(
                    g.paths.iter().any(|q| q.ranks == p.ranks[..k]),
                    "keep {keep}: prefix of {:?} missing",
                    p.ranks
                );
            }
        }
    }
    assert!(SpiffyGraph::calibrate(&[], 6, 10).is_err());
}

/// The graph file round-trips; damaged files are typed errors naming the file.
#[test]
fn graph_file_round_trip_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spiffy-graph.json");
    let g = SpiffyGraph::calibrate(&trajectories(6, 0.5, 0.0), 4, 32).unwrap();
    g.save(&path).unwrap();
    assert_eq!(SpiffyGraph::load(&path).unwrap(), g);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    type Edit<'a> = Box<dyn Fn(&mut serde_json::Value) + 'a>;
    let cases: Vec<(&str, Edit)> = vec![
        ("version", Box::new(|v| v["version"] = 2.into())),
        ("format", Box::new(|v| v["format"] = "other".into())),
        ("unknown field", Box::new(|v| v["extra"] = 1.into())),
        (
            "too long",
            Box::new(|v| v["paths"][0]["ranks"] = vec![0, 0, 0, 0, 0].into()),
        ),
        (
            "beyond block",
            Box::new(|v| v["paths"][0]["ranks"] = vec![8].into()),
        ),
        (
            "count",
            Box::new(|v| v["paths"][0]["count"] = (g.sequences + 1).into()),
        ),
        ("block size", Box::new(|v| v["block_size"] = 0.into())),
    ];
    for (what, edit) in cases {
        let mut w = v.clone();
        edit(&mut w);
        std::fs::write(&path, w.to_string()).unwrap();
        match SpiffyGraph::load(&path) {
            Err(GraphError::Invalid { path: p, reason }) => {
                assert_eq!(p, path, "{what}");
                assert!(!reason.is_empty());
            }
            other => panic!("{what}: expected a config error, got {other:?}"),
        }
    }
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    assert!(matches!(
        SpiffyGraph::load(&path),
        Err(GraphError::Invalid { .. })
    ));
    v["version"] = 1.into();
    assert!(matches!(
        SpiffyGraph::load(&dir.path().join("absent.json")),
        Err(GraphError::Io { .. })
    ));
}

/// Token hits: on a target whose logits ignore the block state the stale token is always the
/// committed one; on an unstable one it is not.
#[test]
fn token_hits_measure_staleness() {
    let stable = token_hits(&trajectories(6, 1.0, 0.0), 4);
    for d in 0..=4 {
        assert!(stable.count[d] > 0);
        assert_eq!(stable.top1_rate(d), 1.0, "depth {d}");
    }
    let unstable = token_hits(&trajectories(6, 0.0, 0.0), 4);
    assert!(unstable.top1_rate(2) < 1.0, "{:?}", unstable);
}

/// The token calibration reproduces the hit rates it was fitted on, travels with a checkpoint,
/// and a damaged table is a typed error.
#[test]
fn token_calibration_fits_and_travels_with_the_checkpoint() {
    use spot_drafter::CalibrationPaths::All;
    use spot_drafter::{
        CalibrationKey, OrderModel, OrderModelConfig, TokenCalibration, checkpoint,
    };
    let stable = TokenCalibration::fit(
        &trajectories(6, 1.0, 0.0),
        3,
        CalibrationKey::Confidence,
        All,
    );
    stable.check().unwrap();
    assert_eq!(stable.top1.len(), 4);
    // Every populated bin of a stable target hits (smoothed towards 1/2 only when empty).
    assert!(
        stable.top1.iter().flatten().all(|&v| v >= 0.5),
        "{stable:?}"
    );
    assert!(stable.top1.iter().flatten().any(|&v| v > 0.9), "{stable:?}");
    let unstable = TokenCalibration::fit(
        &trajectories(6, 0.0, 0.0),
        3,
        CalibrationKey::Confidence,
        All,
    );
    let hits = token_hits(&trajectories(6, 0.0, 0.0), 3);
    assert!(hits.top1_rate(2) < 1.0);
    assert!(
        unstable.top1.iter().flatten().any(|&v| v < 0.9),
        "{unstable:?}"
    );
    // Deeper than the table: the last row.
    assert_eq!(unstable.top1(99, 0.5), unstable.top1(3, 0.5));

    type B = burn_flex::Flex<f32>;
    let cfg = OrderModelConfig {
        block_size: 8,
        d_model: 16,
        heads: 2,
        ffn: 32,
        layers: 1,
        ..OrderModelConfig::default()
    };
    let mut net = OrderModel::<B>::init(cfg, 1, &Default::default());
    net.set_token_calibration(Some(unstable.clone()));
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("d.safetensors");
    checkpoint::save(&net, &w).unwrap();
    let back = checkpoint::load::<B>(&w, &Default::default()).unwrap();
    assert_eq!(back.config().token_calibration.as_ref(), Some(&unstable));
    let json = std::fs::read_to_string(checkpoint::config_path(&w)).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["token_calibration"]["top1"][0][0] = 1.5.into();
    std::fs::write(checkpoint::config_path(&w), v.to_string()).unwrap();
    let e = checkpoint::load::<B>(&w, &Default::default()).unwrap_err();
    assert!(
        matches!(e, DrafterError::Config { .. }) && e.to_string().contains("top1"),
        "{e}"
    );

    // Rank tilts travel with the checkpoint; a negative one is refused naming the field.
    let tilts = vec![spot_drafter::RankTilt {
        temperature: 1.0,
        tilt: 0.3,
    }];
    net.set_rank_tilts(tilts.clone());
    checkpoint::save(&net, &w).unwrap();
    let back = checkpoint::load::<B>(&w, &Default::default()).unwrap();
    assert_eq!(back.config().rank_tilt_by_temperature, tilts);
    assert_eq!(back.config().rank_tilt_for(2.0), 0.3);
    let json = std::fs::read_to_string(checkpoint::config_path(&w)).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["rank_tilt_by_temperature"][0]["tilt"] = (-1.0).into();
    std::fs::write(checkpoint::config_path(&w), v.to_string()).unwrap();
    let e = checkpoint::load::<B>(&w, &Default::default()).unwrap_err();
    assert!(
        matches!(e, DrafterError::Config { .. }) && e.to_string().contains("rank_tilt"),
        "{e}"
    );

    // The rank-path prior (weights and the graph) travels with the checkpoint; a weight
    // outside [0, 1] or a graph of another block size is refused naming the field.
    let graph = spot_drafter::SpiffyGraph::calibrate(&trajectories(6, 0.3, 1.0), 4, 32).unwrap();
    assert_eq!(graph.block_size, 8);
    let weights = vec![spot_drafter::PriorWeight {
        temperature: 1.0,
        weight: 0.6,
    }];
    net.set_rank_tilts(Vec::new());
    net.set_rank_prior(Some(graph.clone()), weights.clone());
    checkpoint::save(&net, &w).unwrap();
    let back = checkpoint::load::<B>(&w, &Default::default()).unwrap();
    assert_eq!(back.config().rank_prior_by_temperature, weights);
    assert_eq!(back.config().rank_paths.as_ref(), Some(&graph));
    assert_eq!(back.config().rank_prior_for(0.0), 0.6);
    let json = std::fs::read_to_string(checkpoint::config_path(&w)).unwrap();
    for (field, value, want) in [
        (
            "weight",
            serde_json::json!(1.5),
            "rank_prior_by_temperature",
        ),
        ("block_size", serde_json::json!(16), "blocks of 16"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        match field {
            "weight" => v["rank_prior_by_temperature"][0]["weight"] = value,
            _ => v["rank_paths"]["block_size"] = value,
        }
        std::fs::write(checkpoint::config_path(&w), v.to_string()).unwrap();
        let e = checkpoint::load::<B>(&w, &Default::default()).unwrap_err();
        assert!(
            matches!(e, DrafterError::Config { .. }) && e.to_string().contains(want),
            "{e}"
        );
    }

    // Where the tokens come from travels with the checkpoint, nearest temperature first; a
    // negative temperature or an unknown field is refused naming the field.
    let at = |temperature, enabled| spot_drafter::ModuleTokens {
        temperature,
        enabled,
    };
    net.set_module_tokens(vec![at(0.0, true), at(1.0, false)]);
    checkpoint::save(&net, &w).unwrap();
    let back = checkpoint::load::<B>(&w, &Default::default()).unwrap();
    assert!(back.config().module_tokens_for(0.2));
    assert!(!back.config().module_tokens_for(2.0));
    let json = std::fs::read_to_string(checkpoint::config_path(&w)).unwrap();
    for (value, want) in [
        (
            serde_json::json!({"temperature": -1.0, "enabled": true}),
            "module_tokens_by_temperature",
        ),
        (
            serde_json::json!({"temperature": 0.0, "enabled": true, "on": 1}),
            "unknown field",
        ),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["module_tokens_by_temperature"][0] = value;
        std::fs::write(checkpoint::config_path(&w), v.to_string()).unwrap();
        let e = checkpoint::load::<B>(&w, &Default::default()).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
}

/// Under noise the calibration may bin by the noised margin: tables of either key are well
/// formed, `fit_best` keeps the one with the lower log-loss, a table without a key (an older
/// checkpoint) reads as the confidence, and a margin table need not end at 1.
#[test]
fn token_calibration_by_noised_margin() {
    use spot_drafter::CalibrationPaths::All;
    use spot_drafter::{CalibrationKey, TokenCalibration};
    let trajs = trajectories(8, 0.3, 1.0);
    let refs: Vec<&Trajectory> = trajs.iter().collect();
    let conf = TokenCalibration::fit(refs.iter().copied(), 3, CalibrationKey::Confidence, All);
    let margin = TokenCalibration::fit(refs.iter().copied(), 3, CalibrationKey::Margin, All);
    margin.check().unwrap();
    assert_eq!(
        margin.edges.last(),
        Some(&spot_drafter::features::MARGIN_CAP)
    );
    let (lc, lm) = (conf.log_loss(&refs, 3), margin.log_loss(&refs, 3));
    assert!(
        lc.is_finite() && lm.is_finite() && lc > 0.0 && lm > 0.0,
        "{lc} {lm}"
    );
    let best = TokenCalibration::fit_best(&refs, 3, All);
    assert_eq!(TokenCalibration::fit_scored(&refs, 3, All).1, [lc, lm]);
    assert_eq!(
        best.key,
        if lm < lc {
            CalibrationKey::Margin
        } else {
            CalibrationKey::Confidence
        }
    );
    assert_eq!(best.log_loss(&refs, 3), lc.min(lm));
    // The margin's hit rate rises with the margin (pooled where the data disagree).
    assert!(
        margin
            .top1
            .iter()
            .all(|row| row.windows(2).all(|w| w[0] <= w[1]))
    );
    // An older checkpoint's table has no key: the confidence.
    let mut v = serde_json::to_value(&conf).unwrap();
    v.as_object_mut().unwrap().remove("key");
    let old: TokenCalibration = serde_json::from_value(v).unwrap();
    assert_eq!(old, conf);
    // Non-finite edges are refused.
    let mut bad = margin.clone();
    bad.edges[3] = f32::NAN;
    let e = bad.check().unwrap_err();
    assert!(
        matches!(&e, spot_drafter::TableError::Field { field, .. } if field == "token_calibration.edges"),
        "{e}"
    );
}

/// An example is on a drafted path iff every commit before it on its replay put the stale
/// choice or the hedge; a table over drafted paths counts exactly those examples, agrees with
/// the table over all paths at depth 0, and says which it is in the checkpoint JSON (a table
/// without the field reads as all paths).
#[test]
fn token_calibration_over_drafted_paths() {
    use spot_drafter::{CalibrationKey, CalibrationPaths, TokenCalibration};
    let trajs = trajectories(10, 0.3, 1.0);
    let (mut drafted, mut total, mut prev): (usize, usize, Option<(usize, bool, bool)>) =
        (0, 0, None);
    for t in &trajs {
        examples(t, 4, |ex| {
            total += 1;
            drafted += usize::from(ex.drafted);
            let p = ex.stale.stored(ex.target).unwrap();
            let hit = p.token == ex.token || p.hedge == ex.token;
            if ex.depth == 0 {
                assert!(ex.drafted);
            } else if let Some((d, was, was_hit)) = prev {
                // Replays of one root come depth by depth (the commits of a step are single
                // here: no threshold), so the flag carries the previous example's.
                assert_eq!(d + 1, ex.depth);
                assert_eq!(ex.drafted, was && was_hit, "depth {}", ex.depth);
            }
            prev = Some((ex.depth, ex.drafted, hit));
        });
    }
    assert!(
        drafted < total && drafted > total / 4,
        "{drafted} of {total}"
    );
    let refs: Vec<&Trajectory> = trajs.iter().collect();
    let key = CalibrationKey::Confidence;
    let all = TokenCalibration::fit(refs.iter().copied(), 3, key, CalibrationPaths::All);
    let on = TokenCalibration::fit(refs.iter().copied(), 3, key, CalibrationPaths::Drafted);
    on.check().unwrap();
    assert_eq!(on.paths, CalibrationPaths::Drafted);
    assert_eq!(all.top1[0], on.top1[0]);
    assert_ne!(all.top1[1..], on.top1[1..]);
    let json = serde_json::to_value(&on).unwrap();
    assert_eq!(json["paths"], "drafted");
    let mut old = serde_json::to_value(&all).unwrap();
    old.as_object_mut().unwrap().remove("paths");
    let back: TokenCalibration = serde_json::from_value(old).unwrap();
    assert_eq!(back, all);
    let per_t = TokenCalibration::fit_per_temperature(&refs, 3, CalibrationPaths::Drafted);
    assert!(per_t.iter().all(|t| t.paths == CalibrationPaths::Drafted));
}
