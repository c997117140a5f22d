//! Trajectory recording, the file format, Algorithm 1's examples and the collection directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use spot_core::toy::{ToyConfig, ToyModel};
use spot_core::{DecodeConfig, DraftFreeDecoder, TokenId};
use spot_drafter::features::MARGIN_CAP;
use spot_drafter::features::StoredPosition;
use spot_drafter::{N_FEATURES, write_features};
use spot_train::trajectory::FORMAT_VERSION;
use spot_train::{CollectError, Manifest, TrajectoryDir};
use spot_train::{Trajectory, TrajectoryError, examples, record};

fn toy(seed: u64) -> ToyModel {
    ToyModel::new(ToyConfig {
        vocab_size: 64,
        mask_id: 63,
        seed,
        stop_ids: vec![1],
        ..ToyConfig::default()
    })
}

fn cfg(block: usize, t: f32, n: usize) -> DecodeConfig {
    DecodeConfig {
        block_size: block,
        max_new_tokens: n,
        temperature: t,
        seed: 5,
        stop_ids: vec![1],
        early_stop: false,
        ..DecodeConfig::default()
    }
}

fn sample(seed: u64, block: usize, t: f32) -> Trajectory {
    let mut m = toy(seed);
    record(&mut m, &[3, 4, 5], &cfg(block, t, 2 * block), "p")
        .unwrap()
        .1
}

/// Recording is draft-free decoding: same output, and the stored steps replay it exactly.
#[test]
fn recording_is_draft_free_decoding_and_replays() {
    let mut moved = 0;
    for (seed, block, t) in [(1, 8, 0.0), (2, 16, 1.0), (3, 4, 0.5), (4, 32, 0.0)] {
        let prompt: Vec<TokenId> = (2..13).collect();
        let c = cfg(block, t, 3 * block);
        let mut m = toy(seed);
        let want = DraftFreeDecoder::new().decode(&mut m, &prompt, &c).unwrap();
        let mut m = toy(seed);
        let (out, traj) = record(&mut m, &prompt, &c, "x").unwrap();
        assert_eq!(out.tokens, want.tokens);
        assert_eq!(out.stats, want.stats);
        assert_eq!(traj.blocks.len() as u64, want.stats.blocks);
        let mut generated = Vec::new();
        let tail = prompt.len() % block;
        for (bi, b) in traj.blocks.iter().enumerate() {
            let mut state = b.initial.clone();
            for step in &b.steps {
                let masked: Vec<u32> = (0..block as u32)
                    .filter(|&s| state[s as usize] == 63)
                    .collect();
                let stored: Vec<u32> = step.positions.iter().map(|p| p.position).collect();
                assert_eq!(stored, masked);
                let [c] = step.commits.as_slice() else {
                    panic!("exact decoding commits one position per step")
                };
                // The committed position is the most confident stored one (ties: lowest).
                let best = step
                    .positions
                    .iter()
                    .fold(
                        None::<&spot_drafter::features::StoredPosition>,
                        |b, p| match b {
                            Some(b) if b.confidence >= p.confidence => Some(b),
                            _ => Some(p),
                        },
                    )
                    .unwrap();
                assert_eq!(best.position as usize, c.position);
                assert_eq!(best.token, c.token);
                assert_eq!(step.positions[0].top_probs.len(), traj.top_k);
                for p in &step.positions {
                    check_hedge(p, t, &mut moved);
                }
                state[c.position] = c.token;
            }
            assert!(state.iter().all(|&x| x != 63));
            let skip = if bi == 0 { tail } else { 0 };
            generated.extend_from_slice(&state[skip..]);
        }
        assert_eq!(generated, out.generated);
    }
    // Under T > 0 the noise moves the hedge off the probability runner-up for some positions.
    assert!(moved > 0);
}

/// The stored hedge is the runner-up of the decoder's own rule and the margin its lead: at
/// T = 0 the probability runner-up and ln p1 − ln p2; always in [0, cap].
fn check_hedge(p: &StoredPosition, t: f32, moved: &mut usize) {
    assert!((0.0..=MARGIN_CAP).contains(&p.margin), "{}", p.margin);
    assert!(p.hedge_prob <= p.top_probs[0] + 1e-6);
    if p.hedge_prob == 0.0 {
        assert_eq!((p.hedge, p.margin), (p.token, MARGIN_CAP));
        return;
    }
    assert_ne!(p.hedge, p.token);
    if t == 0.0 {
        assert_eq!(p.hedge, p.runner_up);
        let want = (p.confidence.ln() - p.hedge_prob.ln()).clamp(0.0, MARGIN_CAP);
        assert!((p.margin - want).abs() < 1e-5, "{} vs {want}", p.margin);
    } else {
        *moved += usize::from(p.hedge != p.runner_up);
    }
}

#[test]
fn file_round_trip_and_every_truncation_is_an_error() {
    let traj = sample(7, 4, 1.0);
    let bytes = traj.to_bytes();
    let p = std::path::Path::new("t.trj");
    assert_eq!(Trajectory::from_bytes(&bytes, p).unwrap(), traj);
    for cut in 0..bytes.len() {
        let e = Trajectory::from_bytes(&bytes[..cut], p).unwrap_err();
        assert!(
            matches!(
                e,
                TrajectoryError::BadMagic { .. }
                    | TrajectoryError::Truncated { .. }
                    | TrajectoryError::Corrupt { .. }
            ),
            "cut {cut}: {e}"
        );
        assert!(e.to_string().contains("t.trj"));
    }
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        assert!(
            Trajectory::from_bytes(&b, p).is_err(),
            "flipped byte {i} accepted"
        );
    }
    let mut b = bytes.clone();
    b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        Trajectory::from_bytes(&b, p).unwrap_err(),
        TrajectoryError::Version { found, .. } if found == FORMAT_VERSION + 1
    ));
}

/// With hidden states asked for, every stored position carries the model's hidden state at
/// the step's state (bf16-rounded), the output is still draft-free decoding's, the file
/// round-trips, and a version-2 file (no hidden states) still reads.
#[test]
fn hidden_states_are_recorded_and_version_two_still_reads() {
    use spot_core::toy::TOY_HIDDEN_DIM;
    use spot_core::{BlockState, MeteredModel, StatsQuery};
    use spot_drafter::features::bf16_round;
    use spot_train::trajectory::{Recorder, record_with};
    let c = cfg(8, 1.0, 16);
    let prompt: Vec<TokenId> = (2..13).collect();
    let want = DraftFreeDecoder::new()
        .decode(&mut toy(3), &prompt, &c)
        .unwrap();
    let (out, traj) = record_with(
        &mut toy(3),
        &prompt,
        &c,
        "h",
        Recorder::with_hidden_states(),
    )
    .unwrap();
    assert_eq!(out.tokens, want.tokens);
    assert_eq!(traj.hidden_dim, TOY_HIDDEN_DIM);
    // The first step of the first block: the model's hidden states at its initial state.
    let b = &traj.blocks[0];
    let mut m = toy(3);
    let mut m = MeteredModel::new(&mut m);
    let aligned = prompt.len() / 8 * 8;
    m.reset_prefix(&prompt[..aligned], 8, aligned + 8).unwrap();
    let q = StatsQuery {
        hidden_states: true,
        ..c.query()
    };
    let st = m
        .forward(&[BlockState::from_tokens(b.initial.clone(), 63)], &q)
        .unwrap();
    for p in &b.steps[0].positions {
        let h = st[0].hidden_at(p.position as usize).unwrap();
        let rounded: Vec<f32> = h.iter().map(|&v| bf16_round(v)).collect();
        assert_eq!(p.hidden, rounded);
        assert_eq!(p.top_ids, st[0].top(p.position as usize).0);
    }
    assert!(
        traj.blocks
            .iter()
            .flat_map(|b| &b.steps)
            .flat_map(|s| &s.positions)
            .all(|p| p.hidden.len() == TOY_HIDDEN_DIM)
    );
    let path = std::path::Path::new("h.trj");
    let bytes = traj.to_bytes();
    assert_eq!(Trajectory::from_bytes(&bytes, path).unwrap(), traj);
    // Version 2: no hidden_dim field, no top ids, no hidden values (a top-0 trajectory, so
    // that its version-3 bytes differ only by the hidden_dim field).
    let mut plain = sample(7, 4, 1.0);
    plain.top_k = 0;
    for p in plain
        .blocks
        .iter_mut()
        .flat_map(|b| &mut b.steps)
        .flat_map(|s| &mut s.positions)
    {
        p.top_probs.clear();
        p.top_ids.clear();
    }
    let v3 = plain.to_bytes();
    let mut v2 = v3[..36].to_vec();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    v2.extend_from_slice(&v3[40..v3.len() - 8]);
    let sum = v2.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    v2.extend_from_slice(&sum.to_le_bytes());
    assert_eq!(Trajectory::from_bytes(&v2, path).unwrap(), plain);
}

/// Algorithm 1: for step t ≥ 1 and depth d, the root after t steps plus d true commits, the
/// stale statistics of step t - 1, and step t + d's position as the target.
#[test]
fn examples_follow_algorithm_one() {
    let traj = sample(9, 8, 0.0);
    let max_depth = 7;
    let mut seen = 0;
    let n = examples(&traj, max_depth, |ex| {
        seen += 1;
        assert!(ex.depth <= max_depth);
        assert_eq!(ex.state[ex.target], 63, "target must be masked in y");
        // The stale statistics hold every position masked in y.
        for (s, &tok) in ex.state.iter().enumerate() {
            if tok == 63 {
                assert!(ex.stale.positions.iter().any(|p| p.position as usize == s));
            }
        }
        let mut f = vec![0.0f32; ex.state.len() * N_FEATURES];
        write_features(ex.stale, ex.state, 63, ex.depth, traj.temperature, &mut f);
        assert!(f.iter().all(|v| v.is_finite()));
    });
    assert_eq!(n, seen);
    let want: usize = traj
        .blocks
        .iter()
        .map(|b| {
            let k = b.steps.len();
            (1..k).map(|t| (k - t).min(max_depth + 1)).sum::<usize>()
        })
        .sum();
    assert_eq!(n, want);
    assert!(n > 0);
    // Depth-0 targets are exactly the commits of steps 1.. of each block.
    let mut d0 = Vec::new();
    examples(&traj, 0, |ex| d0.push(ex.target));
    let commits: Vec<usize> = traj
        .blocks
        .iter()
        .flat_map(|b| b.steps.iter().skip(1).map(|s| s.commits[0].position))
        .collect();
    assert_eq!(d0, commits);
}

#[test]
fn directory_resumes_and_refuses_other_settings() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = spot_core::DecodeConfig {
        block_size: 8,
        max_new_tokens: 16,
        early_stop: false,
        ..Default::default()
    };
    let m = Manifest::for_decode("model", "p.jsonl", "prompt", &cfg);
    let d = TrajectoryDir::create_or_resume(dir.path(), m.clone()).unwrap();
    assert!(!d.has(2).unwrap());
    let t = sample(1, 8, 0.0);
    d.write(2, &t).unwrap();
    d.write(0, &t).unwrap();
    assert!(d.has(2).unwrap());
    let d = TrajectoryDir::create_or_resume(dir.path(), m.clone()).unwrap();
    let all = d.read_all().unwrap();
    assert_eq!(all.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(all[1].1, t);
    let mut other = m.clone();
    other.temperature = 1.0;
    let e = TrajectoryDir::create_or_resume(dir.path(), other).unwrap_err();
    assert!(
        matches!(&e, CollectError::ManifestMismatch { field, .. } if field == "temperature"),
        "{e}"
    );
    // The decode settings older manifests did not record: transition, rule, layout.
    let refused = |cfg: spot_core::DecodeConfig| {
        let other = Manifest::for_decode("model", "p.jsonl", "prompt", &cfg);
        TrajectoryDir::create_or_resume(dir.path(), other).unwrap_err()
    };
    let e = refused(spot_core::DecodeConfig {
        layout: spot_core::BlockLayout::AfterPrompt,
        ..cfg.clone()
    });
    assert!(
        matches!(&e, CollectError::ManifestMismatch { field, existing, .. }
            if field == "layout" && existing == "\"aligned\""),
        "{e}"
    );
    let e = refused(spot_core::DecodeConfig {
        transition: spot_core::Transition::Scheduled {
            steps: 4,
            tau: None,
        },
        ..cfg.clone()
    });
    assert!(e.to_string().contains("scheduled(steps=4)"), "{e}");
    // A manifest written before the transition was recorded reads, and differs from one
    // that records it (so it is not resumed with settings it cannot vouch for).
    let mut old = m.clone();
    (
        old.transition,
        old.confidence,
        old.layout,
        old.stop_ids,
        old.top_k,
    ) = (None, None, None, None, None);
    let text = serde_json::to_string(&old).unwrap();
    assert!(!text.contains("transition"), "{text}");
    let back: Manifest = serde_json::from_str(&text).unwrap();
    assert_eq!(back, old);
    assert!(TrajectoryDir::open(dir.path()).is_ok());
    // A damaged sample is an error naming it, not a silent skip.
    let p = d.sample_path(2);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = d.has(2).unwrap_err().to_string();
    assert!(e.contains("000002.trj"), "{e}");
    std::fs::write(dir.path().join("manifest.json"), "{\"format\": 1}").unwrap();
    assert!(matches!(
        TrajectoryDir::open(dir.path()).unwrap_err(),
        CollectError::BadManifest { .. }
    ));
}
