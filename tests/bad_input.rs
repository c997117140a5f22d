//! Bad input gets a typed error naming what is wrong, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use spot_dlm::core::stats::{PositionStats, ReduceScratch, reduce_logits};
use spot_dlm::core::{Error as CoreError, PrefixUpdate};
use spot_dlm::toy::{ToyConfig, ToyModel};
use spot_dlm::{
    BlockDiffusionModel, BlockState, BlockStats, DecodeConfig, DraftFreeDecoder, Error, ModelInfo,
    SpotDecoder, StatsQuery, TokenId, Transition, TreeError,
};
use spot_dlm::{CacheSlot, CacheUsage, GroupScores, Prefix, ScoreGroup};

fn toy() -> ToyModel {
    ToyModel::new(ToyConfig {
        max_positions: 128,
        ..ToyConfig::default()
    })
}

fn cfg() -> DecodeConfig {
    DecodeConfig {
        block_size: 8,
        max_new_tokens: 16,
        ..DecodeConfig::default()
    }
}

/// Runs both decoders and returns both errors (they must agree on input validation).
fn both(
    model: &mut dyn BlockDiffusionModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
) -> (CoreError, Error) {
    let a = DraftFreeDecoder::new()
        .decode(model, prompt, cfg)
        .expect_err("draft-free must fail");
    let b = SpotDecoder::builder()
        .build()
        .unwrap()
        .decode(model, prompt, cfg)
        .expect_err("spot must fail");
    (a, b)
}

fn config_field(e: &CoreError) -> &'static str {
    match e {
        CoreError::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn invalid_temperatures() {
    for t in [-0.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let c = DecodeConfig {
            temperature: t,
            ..cfg()
        };
        let (a, b) = both(&mut toy(), &[1, 2], &c);
        assert_eq!(config_field(&a), "temperature");
        assert!(
            matches!(
                b,
                Error::InvalidConfig {
                    field: "temperature",
                    ..
                }
            ),
            "{b}"
        );
        assert!(a.to_string().contains("temperature"));
    }
}

#[test]
fn invalid_block_sizes() {
    let (a, _) = both(
        &mut toy(),
        &[1],
        &DecodeConfig {
            block_size: 0,
            ..cfg()
        },
    );
    assert_eq!(config_field(&a), "block_size");
    let (a, _) = both(
        &mut toy(),
        &[1],
        &DecodeConfig {
            block_size: 256,
            ..cfg()
        },
    );
    assert_eq!(config_field(&a), "block_size");
    assert!(a.to_string().contains("128 positions"), "{a}");
}

#[test]
fn invalid_lengths_and_thresholds() {
    let (a, _) = both(
        &mut toy(),
        &[1],
        &DecodeConfig {
            max_new_tokens: 0,
            ..cfg()
        },
    );
    assert_eq!(config_field(&a), "max_new_tokens");
    let (a, _) = both(&mut toy(), &[1], &DecodeConfig { top_k: 0, ..cfg() });
    assert_eq!(config_field(&a), "top_k");
    let c = DecodeConfig {
        transition: Transition::Threshold { tau: f32::NAN },
        ..cfg()
    };
    let (a, _) = both(&mut toy(), &[1], &c);
    assert_eq!(config_field(&a), "threshold");
}

#[test]
fn empty_and_invalid_prompts() {
    let (a, _) = both(&mut toy(), &[], &cfg());
    assert!(matches!(a, CoreError::EmptyPrompt));
    let mask = toy().info().mask_id;
    let (a, _) = both(&mut toy(), &[1, mask], &cfg());
    assert!(
        matches!(a, CoreError::InvalidPromptToken { index: 1, .. }),
        "{a}"
    );
    let (a, _) = both(&mut toy(), &[1, 2, 1000], &cfg());
    assert!(
        matches!(
            a,
            CoreError::InvalidPromptToken {
                index: 2,
                token: 1000,
                ..
            }
        ),
        "{a}"
    );
}

#[test]
fn prompt_longer_than_the_model_allows() {
    let prompt = vec![1; 120];
    let (a, _) = both(&mut toy(), &prompt, &cfg());
    match a {
        CoreError::SequenceTooLong {
            prompt_len: 120,
            needed: 136,
            max_positions: 128,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    // Overflow-sized requests are rejected, not wrapped.
    let (a, _) = both(
        &mut toy(),
        &[1],
        &DecodeConfig {
            max_new_tokens: usize::MAX,
            ..cfg()
        },
    );
    assert!(matches!(a, CoreError::SequenceTooLong { .. }), "{a}");
}

#[test]
fn invalid_tree_limits() {
    for (b, field) in [
        (SpotDecoder::builder().budget(0), "budget"),
        (SpotDecoder::builder().max_depth(0), "max_depth"),
        (SpotDecoder::builder().gamma(f32::NAN), "gamma"),
        (SpotDecoder::builder().gamma(-1.0), "gamma"),
        (SpotDecoder::builder().hedge(Some(2.0)), "hedge"),
    ] {
        match b.build() {
            Err(e) => match e.drafter_error::<TreeError>() {
                Some(TreeError::InvalidConfig { field: f, .. }) => assert_eq!(*f, field),
                other => panic!("{field}: {other:?}"),
            },
            Ok(_) => panic!("{field}: built"),
        }
    }
}

/// A model whose statistics can be corrupted on purpose.
struct Faulty {
    inner: ToyModel,
    fault: Fault,
    /// The one slot whose groups are corrupted (`None`: every group).
    only: Option<CacheSlot>,
}

#[derive(Clone, Copy)]
enum Fault {
    NanConfidence,
    InfConfidence,
    NanTokenProb,
    MaskToken,
    TokenOutOfVocab,
    WrongBatch,
    WrongPositions,
    NanLogits,
    ModelFailure,
}

fn row(token: TokenId, c: f32, p: f32) -> (TokenId, f32, f32) {
    (token, c, p)
}

impl BlockDiffusionModel for Faulty {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn open_slot(&mut self) -> spot_dlm::core::Result<CacheSlot> {
        self.inner.open_slot()
    }
    fn close_slot(&mut self, slot: CacheSlot) {
        self.inner.close_slot(slot)
    }
    fn cache_usage(&self) -> CacheUsage {
        self.inner.cache_usage()
    }
    fn prefix_len(&self, slot: CacheSlot) -> usize {
        self.inner.prefix_len(slot)
    }
    fn reset_prefix(
        &mut self,
        slot: CacheSlot,
        prefix: Prefix<'_>,
    ) -> spot_dlm::core::Result<PrefixUpdate> {
        self.inner.reset_prefix(slot, prefix)
    }
    /// The toy's forward (its appends and counters), each group's statistics then replaced
    /// by the fault's.
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> spot_dlm::core::Result<Vec<GroupScores>> {
        let mut out = self.inner.forward(groups)?;
        for (g, scores) in groups.iter().zip(&mut out) {
            if self.only.is_none_or(|slot| slot == g.slot) {
                scores.stats = self.faulty(g.states, g.query)?;
            }
        }
        Ok(out)
    }
}

impl Faulty {
    fn faulty(
        &self,
        states: &[BlockState],
        q: &StatsQuery,
    ) -> spot_dlm::core::Result<Vec<BlockStats>> {
        let mask = self.info().mask_id;
        let (tok, c, p) = match self.fault {
            Fault::NanConfidence => row(1, f32::NAN, 0.5),
            Fault::InfConfidence => row(1, f32::INFINITY, 0.5),
            Fault::NanTokenProb => row(1, 0.5, f32::NAN),
            Fault::MaskToken => row(mask, 0.5, 0.5),
            Fault::TokenOutOfVocab => row(5000, 0.5, 0.5),
            Fault::WrongBatch => return Ok(Vec::new()),
            Fault::WrongPositions => return Ok(vec![BlockStats::new(1); states.len()]),
            Fault::NanLogits => {
                let mut out = BlockStats::new(1);
                let q1 = StatsQuery { top_k: 1, ..*q };
                let mut logits = vec![0.0f32; 48];
                logits[3] = f32::NAN;
                reduce_logits(
                    &logits,
                    7,
                    &q1,
                    mask,
                    &mut ReduceScratch::default(),
                    &mut out,
                )?;
                return Ok(vec![out]);
            }
            Fault::ModelFailure => return Err(CoreError::model("device lost")),
        };
        let mut st = BlockStats::new(1);
        for s in 0..states[0].len() {
            // Only position 2 is corrupted; the others are valid.
            let (t, c, p) = if s == 2 { (tok, c, p) } else { (1, 0.1, 0.1) };
            st.push(PositionStats {
                token: t,
                confidence: c,
                token_prob: p,
                entropy: 0.5,
                tail_mass: 0.0,
                top_ids: &[t],
                top_probs: &[p.clamp(0.0, 1.0)],
            })
            .unwrap();
        }
        Ok(vec![st; states.len()])
    }
}

#[test]
fn corrupt_statistics_are_typed_errors() {
    let cases: [(Fault, &str); 5] = [
        (Fault::NanConfidence, "confidence"),
        (Fault::InfConfidence, "confidence"),
        (Fault::NanTokenProb, "token_prob"),
        (Fault::MaskToken, "token"),
        (Fault::TokenOutOfVocab, "token"),
    ];
    for (fault, field) in cases {
        let mut m = Faulty {
            inner: toy(),
            fault,
            only: None,
        };
        let (a, b) = both(&mut m, &[1, 2, 3], &cfg());
        match a {
            CoreError::InvalidStatistics {
                field: f,
                position: 2,
                ..
            } => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
        assert!(
            matches!(b, Error::InvalidStatistics { position: 2, .. }),
            "{b}"
        );
    }
}

#[test]
fn wrong_shapes_nan_logits_and_model_failures() {
    let mut m = Faulty {
        inner: toy(),
        fault: Fault::WrongBatch,
        only: None,
    };
    let (a, _) = both(&mut m, &[1], &cfg());
    assert!(
        matches!(
            a,
            CoreError::ShapeMismatch {
                what: "statistics per batch",
                expected: 1,
                actual: 0
            }
        ),
        "{a}"
    );
    let mut m = Faulty {
        inner: toy(),
        fault: Fault::WrongPositions,
        only: None,
    };
    let (a, _) = both(&mut m, &[1], &cfg());
    assert!(
        matches!(
            a,
            CoreError::ShapeMismatch {
                expected: 8,
                actual: 0,
                ..
            }
        ),
        "{a}"
    );
    let mut m = Faulty {
        inner: toy(),
        fault: Fault::NanLogits,
        only: None,
    };
    let (a, _) = both(&mut m, &[1], &cfg());
    assert!(
        matches!(a, CoreError::NonFiniteLogits { position: 7, .. }),
        "{a}"
    );
    let mut m = Faulty {
        inner: toy(),
        fault: Fault::ModelFailure,
        only: None,
    };
    let (a, b) = both(&mut m, &[1], &cfg());
    assert!(a.to_string().contains("device lost"));
    assert!(b.to_string().contains("device lost"));
}

#[test]
fn all_infinite_logits_are_rejected() {
    let mut out = BlockStats::new(1);
    let q = StatsQuery {
        top_k: 1,
        ..StatsQuery::new(1.0, 0)
    };
    let logits = [f32::NEG_INFINITY; 4];
    let e = reduce_logits(&logits, 3, &q, 0, &mut ReduceScratch::default(), &mut out).unwrap_err();
    assert!(matches!(e, CoreError::NonFiniteLogits { position: 3, .. }));
}

#[test]
fn mask_outside_vocabulary_is_an_error() {
    let mut m = ToyModel::new(ToyConfig {
        vocab_size: 10,
        mask_id: 10,
        ..ToyConfig::default()
    });
    let e = DraftFreeDecoder::new()
        .decode(&mut m, &[1], &cfg())
        .unwrap_err();
    assert_eq!(config_field(&e), "mask_id");
    assert!(e.to_string().contains("mask id 10"), "{e}");
}

/// The learned set drafter on a model whose hidden states have another width is a typed
/// error naming both widths, not a wrong tree.
#[test]
fn a_set_network_of_another_hidden_width_is_an_error() {
    use spot_dlm::sets::net::{SetsNet, SetsNetConfig};
    let cfg = DecodeConfig {
        transition: Transition::Threshold { tau: 0.5 },
        ..cfg()
    };
    let e = SpotDecoder::builder()
        .sets(
            SetsNet::init(SetsNetConfig::new(5), 1),
            spot_dlm::StaleConfidenceScorer,
            spot_dlm::SetTreeConfig::default(),
        )
        .build()
        .unwrap()
        .decode(&mut toy(), &[1, 2, 3], &cfg)
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("hidden states of width 5") && text.contains("width 8"),
        "{text}"
    );
}

/// Through a `BatchDriver` (one merged forward per step), a model's bad answer for one
/// request's group fails that request only, with the typed error naming the field; the other
/// request decodes exactly as it does alone.
#[test]
fn a_bad_answer_fails_only_its_request_in_a_batch() {
    use spot_dlm::{BatchDriver, Request};
    let cfg = cfg();
    let mut m = Faulty {
        inner: toy(),
        fault: Fault::NanConfidence,
        only: Some(CacheSlot(1)),
    };
    let info = m.info().clone();
    let alone = DraftFreeDecoder::new()
        .decode(&mut m.inner, &[4, 5, 6], &cfg)
        .unwrap();
    let mut driver = BatchDriver::new(2).unwrap();
    // The first request gets slot 1 (the driver opens a slot per request), the second slot 2.
    for prompt in [[1, 2, 3], [4, 5, 6]] {
        driver.submit(Request::new(&prompt, &cfg, &info, DraftFreeDecoder::new()).unwrap());
    }
    let mut done = driver.run(&mut m).unwrap();
    done.sort_by_key(|f| f.id);
    match &done[0].output {
        Err(CoreError::InvalidStatistics {
            field: "confidence",
            position: 2,
            ..
        }) => {}
        other => panic!("the corrupted request: {other:?}"),
    }
    let good = done[1].output.as_ref().unwrap();
    assert_eq!(good.tokens, alone.tokens);
    assert_eq!(good.stats.work, alone.stats.work);
}
