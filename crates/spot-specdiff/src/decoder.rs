//! The SpecDiff-2 round, and the decode loop around it.

use std::time::{Duration, Instant};

use spot_core::autoregressive::{check_inputs, check_stats};
use spot_core::{ArConfig, AutoregressiveModel, Error, Result, StatsQuery, TokenId};

use crate::drafter::{DiffusionDrafter, Marginals, sample_drafts};
use crate::select::{Scored, Selection, select};

/// Settings of [`SpecDiffDecoder`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecDiffConfig {
    /// Drafts per round `K` (1 to 64).
    pub k: usize,
    /// Drafted tokens per round `γ` (1 to 256).
    pub gamma: usize,
    /// The drafter's sampling temperature (finite, `>= 0`; 0 drafts its argmax only).
    pub drafter_temperature: f32,
    /// Draft 0 is the drafter's argmax; the other `K - 1` are sampled.
    pub greedy_first: bool,
    /// Which branch a round commits.
    pub selection: Selection,
    /// Seed of the drafts' sampling (independent of the target's noise).
    pub draft_seed: u64,
    /// Candidates per position in the target's statistics, for the expected streak.
    pub target_top_k: usize,
}

impl Default for SpecDiffConfig {
    fn default() -> Self {
        Self {
            k: 8,
            gamma: 16,
            drafter_temperature: 1.5,
            greedy_first: true,
            selection: Selection::LongestAccepted,
            draft_seed: 0,
            target_top_k: 8,
        }
    }
}

impl SpecDiffConfig {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<()> {
        if !(1..=64).contains(&self.k) {
            return Err(Error::config(
                "k",
                format!("must be in [1, 64], got {}", self.k),
            ));
        }
        if !(1..=256).contains(&self.gamma) {
            return Err(Error::config(
                "gamma",
                format!("must be in [1, 256], got {}", self.gamma),
            ));
        }
        let t = self.drafter_temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::config(
                "drafter_temperature",
                format!("must be finite and >= 0, got {t}"),
            ));
        }
        if self.target_top_k == 0 {
            return Err(Error::config("target_top_k", "must be at least 1, got 0"));
        }
        Ok(())
    }
}

/// Diagnostics of one decode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecDiffReport {
    /// Rounds (each one target forward).
    pub rounds: u64,
    /// `accepted[n]`: rounds whose committed branch had `n` drafted tokens accepted.
    pub accepted: Vec<u64>,
    /// Rounds where the committed branch was not draft 0.
    pub other_branch: u64,
    /// Target positions processed (shared tokens plus every branch's).
    pub positions: u64,
    /// Time in the drafter (proposing and sampling).
    pub draft_time: Duration,
    /// Time in the target's forwards.
    pub target_time: Duration,
}

impl SpecDiffReport {
    /// Mean tokens committed per round (accepted drafts plus the target's own token).
    pub fn tokens_per_round(&self) -> f64 {
        let tokens: u64 = self
            .accepted
            .iter()
            .enumerate()
            .map(|(n, &c)| (n as u64 + 1) * c)
            .sum();
        tokens as f64 / self.rounds.max(1) as f64
    }

    /// The drafter's share of the decode's time.
    pub fn draft_share(&self) -> f64 {
        let d = self.draft_time.as_secs_f64();
        let total = d + self.target_time.as_secs_f64();
        if total > 0.0 { d / total } else { 0.0 }
    }
}

/// What [`SpecDiffDecoder::decode`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecDiffOutput {
    /// Generated ids, including the stop id that ended them: exactly
    /// [`decode_autoregressive`](spot_core::decode_autoregressive)'s.
    pub tokens: Vec<TokenId>,
    /// Whether a stop id ended the decode.
    pub stopped: bool,
    /// Target forwards (one per round; the prompt rides in the first).
    pub forwards: u64,
    /// Rounds, acceptance and timing.
    pub report: SpecDiffReport,
}

/// SpecDiff-2 with coupled verification: each round the drafter proposes `K` drafts of `γ`
/// tokens, the target scores them all in one forward over the shared prefix
/// ([`AutoregressiveModel::extend_branches`]), and the round commits one branch's accepted
/// tokens plus the target's own next token.
///
/// A drafted token is accepted iff it equals the target's choice
/// `argmax_v(logit_v / T + G[p, v])` at its absolute position `p` with the decode's noise,
/// so every committed token is one the plain decoder commits: the output equals
/// [`decode_autoregressive`](spot_core::decode_autoregressive)'s with the same seed at every
/// temperature, whatever the drafts.
///
/// ```
/// use spot_core::{decode_autoregressive, ArConfig};
/// use spot_specdiff::toy::{ToyCausalModel, ToyDrafter};
/// use spot_specdiff::{SpecDiffConfig, SpecDiffDecoder};
///
/// let mut target = ToyCausalModel::new(32, 7);
/// let mut drafter = ToyDrafter::new(target.clone(), 0.2, 1);
/// let cfg = ArConfig { max_new_tokens: 40, temperature: 1.0, seed: 3, ..ArConfig::default() };
/// let plain = decode_autoregressive(&mut target, &[1, 2, 3], &cfg)?;
/// let fast = SpecDiffDecoder::new(SpecDiffConfig::default())?
///     .decode(&mut target, &mut drafter, &[1, 2, 3], &cfg)?;
/// assert_eq!(fast.tokens, plain.tokens);
/// assert!(fast.forwards < plain.forwards);
/// # Ok::<(), spot_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SpecDiffDecoder {
    cfg: SpecDiffConfig,
    marginals: Marginals,
    drafts: Vec<Vec<TokenId>>,
}

impl SpecDiffDecoder {
    /// A decoder with `cfg` (validated).
    pub fn new(cfg: SpecDiffConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            marginals: Marginals::default(),
            drafts: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SpecDiffConfig {
        &self.cfg
    }

    /// Decodes `prompt` with `target`, drafting with `drafter`.
    pub fn decode(
        &mut self,
        target: &mut dyn AutoregressiveModel,
        drafter: &mut dyn DiffusionDrafter,
        prompt: &[TokenId],
        cfg: &ArConfig,
    ) -> Result<SpecDiffOutput> {
        let info = target.ar_info().clone();
        check_inputs(&info, prompt, cfg)?;
        if drafter.vocab_size() != info.vocab_size {
            return Err(Error::ShapeMismatch {
                what: "drafter vocabulary (it must share the target's tokenizer)",
                expected: info.vocab_size,
                actual: drafter.vocab_size(),
            });
        }
        let query = StatsQuery {
            top_k: self.cfg.target_top_k,
            ..StatsQuery::new(cfg.temperature, cfg.seed)
        };
        let stops = if cfg.stop_ids.is_empty() {
            &info.stop_ids
        } else {
            &cfg.stop_ids
        };
        target.truncate(0)?;
        let mut context = prompt.to_vec();
        let mut pending = prompt.len();
        let mut report = SpecDiffReport::default();
        let mut tokens = Vec::with_capacity(cfg.max_new_tokens);
        loop {
            // Draft no more than the round can commit: its accepted tokens plus the target's.
            let left = cfg.max_new_tokens - tokens.len();
            let gamma = self.cfg.gamma.min(left - 1);
            let t0 = Instant::now();
            self.drafts.clear();
            if gamma > 0 {
                drafter.propose(&context, gamma, &mut self.marginals)?;
                if self.marginals.len() != gamma {
                    return Err(Error::ShapeMismatch {
                        what: "drafted positions",
                        expected: gamma,
                        actual: self.marginals.len(),
                    });
                }
                let k = if self.cfg.drafter_temperature > 0.0 {
                    self.cfg.k
                } else {
                    1
                };
                sample_drafts(
                    &self.marginals,
                    k,
                    self.cfg.drafter_temperature,
                    self.cfg.greedy_first,
                    (self.cfg.draft_seed, context.len()),
                    &mut self.drafts,
                );
                if let Some(bad) = self
                    .drafts
                    .iter()
                    .flatten()
                    .find(|&&t| t as usize >= info.vocab_size)
                {
                    return Err(Error::config(
                        "drafter marginals",
                        format!(
                            "token {bad} is outside the vocabulary of {}",
                            info.vocab_size
                        ),
                    ));
                }
            }
            let t1 = Instant::now();
            let shared = &context[context.len() - pending..];
            let (first, branches) = target.extend_branches(shared, &self.drafts, &query)?;
            report.target_time += t1.elapsed();
            report.draft_time += t1 - t0;
            report.positions +=
                (shared.len() + self.drafts.iter().map(Vec::len).sum::<usize>()) as u64;
            check_stats(&first, shared.len(), info.vocab_size)?;
            for (b, d) in branches.iter().zip(&self.drafts) {
                check_stats(b, d.len(), info.vocab_size)?;
            }
            if branches.len() != self.drafts.len() {
                return Err(Error::ShapeMismatch {
                    what: "scored branches",
                    expected: self.drafts.len(),
                    actual: branches.len(),
                });
            }
            let last = (&first, first.len() - 1);
            let (pick, accepted) = if self.drafts.is_empty() {
                (0, vec![0])
            } else {
                let scored: Vec<Scored<'_>> = branches
                    .iter()
                    .map(|branch| Scored {
                        first: last,
                        branch,
                    })
                    .collect();
                select(self.cfg.selection, &self.drafts, &scored)
            };
            let n = accepted[pick];
            let mut new: Vec<TokenId> = self.drafts.get(pick).map_or(&[][..], |d| &d[..n]).to_vec();
            new.push(match (n, branches.get(pick)) {
                (0, _) | (_, None) => first.token(first.len() - 1),
                (n, Some(b)) => b.token(n - 1),
            });
            report.rounds += 1;
            if report.accepted.len() <= n {
                report.accepted.resize(n + 1, 0);
            }
            report.accepted[n] += 1;
            report.other_branch += u64::from(pick != 0);
            // Commit up to the first stop id (kept) or the length limit.
            let mut stopped = false;
            for t in new.iter().copied() {
                tokens.push(t);
                context.push(t);
                stopped = cfg.early_stop && stops.contains(&t);
                if stopped || tokens.len() == cfg.max_new_tokens {
                    break;
                }
            }
            if stopped || tokens.len() == cfg.max_new_tokens {
                return Ok(SpecDiffOutput {
                    tokens,
                    stopped,
                    forwards: report.rounds,
                    report,
                });
            }
            // The committed tokens ride in the next forward as its shared part.
            pending = new.len();
        }
    }
}
