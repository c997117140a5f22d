//! The classic acceptance rule (`min(1, p/q)`, residual resampling) preserves the target's
//! distribution, though not its tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use spot_core::{ArConfig, Error, decode_autoregressive};
use spot_specdiff::toy::{ToyCausalModel, ToyDrafter};
use spot_specdiff::{
    Acceptance, DiffusionDrafter, Marginals, SpecDiffConfig, SpecDiffDecoder, sample_drafts,
};

const VOCAB: usize = 6;
const SAMPLES: u64 = 20_000;

/// `softmax(logits / t)` of the toy target after `context`.
fn target_probs(target: &ToyCausalModel, context: &[u32], t: f32) -> Vec<f64> {
    let mut logits = Vec::new();
    target.logits(context, &mut logits);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| f64::from((l - max) / t).exp())
        .collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

/// Total-variation distance between the exact distribution of the first two generated tokens
/// and the frequencies of `pairs`.
fn tv(exact: &[f64], pairs: &[(u32, u32)]) -> f64 {
    let mut counts = vec![0.0; VOCAB * VOCAB];
    for &(a, b) in pairs {
        counts[a as usize * VOCAB + b as usize] += 1.0;
    }
    let n = pairs.len() as f64;
    exact
        .iter()
        .zip(&counts)
        .map(|(p, c)| (p - c / n).abs())
        .sum::<f64>()
        / 2.0
}

/// Two tokens after `[1, 2]` at T = 1, drafted by a drafter that is wrong with weight 0.6:
/// over 20,000 seeds the classic rule's pairs follow the target's exact distribution (greedy
/// and sampled drafts alike), as plain sampling's do; a rule that accepted every drafted
/// token would follow the drafter's and is measured far off; and the classic rule's tokens
/// are not plain sampling's seed by seed.
#[test]
fn the_classic_rule_preserves_the_target_distribution() {
    let t = 1.0;
    let prompt = [1u32, 2];
    let mut target = ToyCausalModel::new(VOCAB, 3);
    let first = target_probs(&target, &prompt, t);
    let exact: Vec<f64> = (0..VOCAB)
        .flat_map(|a| {
            let pa = first[a];
            let second = target_probs(&target, &[1, 2, a as u32], t);
            second.into_iter().map(move |p| pa * p)
        })
        .collect();
    let cfg = |seed| ArConfig {
        max_new_tokens: 2,
        temperature: t,
        seed,
        early_stop: false,
        ..ArConfig::default()
    };
    let plain: Vec<(u32, u32)> = (0..SAMPLES)
        .map(|s| {
            let o = decode_autoregressive(&mut target, &prompt, &cfg(s)).unwrap();
            (o.tokens[0], o.tokens[1])
        })
        .collect();
    let noise = tv(&exact, &plain);
    let mut drafter = ToyDrafter::new(target.clone(), 0.6, 5);
    let mut drafted_only = Vec::new();
    for greedy_first in [true, false] {
        let sd = SpecDiffConfig {
            k: 1,
            gamma: 2,
            greedy_first,
            drafter_temperature: 1.0,
            acceptance: Acceptance::Classic,
            ..SpecDiffConfig::default()
        };
        let mut dec = SpecDiffDecoder::new(sd).unwrap();
        let mut pairs = Vec::new();
        let (mut same, mut accepted) = (0, 0u64);
        for s in 0..SAMPLES {
            let o = dec
                .decode(&mut target, &mut drafter, &prompt, &cfg(s))
                .unwrap();
            pairs.push((o.tokens[0], o.tokens[1]));
            same += usize::from(pairs.last() == plain.get(s as usize));
            accepted += o.report.accepted.iter().skip(1).sum::<u64>();
        }
        let d = tv(&exact, &pairs);
        eprintln!(
            "greedy_first {greedy_first}: TV {d:.4} (plain sampling {noise:.4}); \
             {same} of {SAMPLES} equal to plain sampling; {accepted} rounds accepted drafts"
        );
        assert!(d < 0.03, "TV {d} (plain sampling: {noise})");
        assert!(same < SAMPLES as usize * 9 / 10, "{same}");
        assert!(accepted > SAMPLES / 10, "{accepted}");
    }
    // The drafts themselves (sampled at the drafter's temperature 1): what a rule that
    // accepted every drafted token would give.
    let mut m = Marginals::default();
    for s in 0..SAMPLES {
        drafter.propose(&prompt, 2, &mut m).unwrap();
        let mut d = Vec::new();
        sample_drafts(&m, 1, 1.0, false, (s, prompt.len()), &mut d);
        drafted_only.push((d[0][0], d[0][1]));
    }
    let off = tv(&exact, &drafted_only);
    eprintln!("accepting every draft: TV {off:.4}");
    assert!(
        off > 0.1,
        "the test must be able to tell the drafter from the target: {off}"
    );
}

/// At T = 0 the classic rule is the coupled one: the tokens of greedy decoding.
#[test]
fn the_classic_rule_at_t0_is_greedy_decoding() {
    let mut target = ToyCausalModel::new(24, 7);
    let mut drafter = ToyDrafter::new(target.clone(), 0.3, 1);
    let cfg = ArConfig {
        max_new_tokens: 60,
        early_stop: false,
        ..ArConfig::default()
    };
    let sd = SpecDiffConfig {
        k: 1,
        gamma: 6,
        acceptance: Acceptance::Classic,
        ..SpecDiffConfig::default()
    };
    let out = SpecDiffDecoder::new(sd)
        .unwrap()
        .decode(&mut target, &mut drafter, &[4, 5], &cfg)
        .unwrap();
    let plain = decode_autoregressive(&mut target, &[4, 5], &cfg).unwrap();
    assert_eq!(out.tokens, plain.tokens);
    assert!(out.forwards < plain.forwards);
}

#[test]
fn the_classic_rule_takes_one_draft() {
    let sd = SpecDiffConfig {
        k: 2,
        acceptance: Acceptance::Classic,
        ..SpecDiffConfig::default()
    };
    let e = SpecDiffDecoder::new(sd).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { field, .. } if *field == "acceptance"),
        "{e}"
    );
}
