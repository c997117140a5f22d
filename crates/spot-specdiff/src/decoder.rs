//! The SpecDiff-2 round, and the decode loop around it.

use std::time::{Duration, Instant};

use spot_core::autoregressive::{check_inputs, check_stats};
use spot_core::state::mix64;
use spot_core::{
    ArConfig, ArInfo, AutoregressiveModel, BlockStats, CancelHandle, Error, MeteredArModel, Result,
    StatsQuery, StopCheck, TokenId,
};

use crate::drafter::{DiffusionDrafter, Marginals, draft_distribution, sample_drafts, unit};
use crate::select::{Scored, select};

use crate::config::PaceState;
pub use crate::config::{Acceptance, SpecDiffConfig};

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

    /// Adds another report (for totals over several decodes).
    pub fn merge(&mut self, other: &SpecDiffReport) {
        self.rounds += other.rounds;
        if self.accepted.len() < other.accepted.len() {
            self.accepted.resize(other.accepted.len(), 0);
        }
        for (a, b) in self.accepted.iter_mut().zip(&other.accepted) {
            *a += b;
        }
        self.other_branch += other.other_branch;
        self.positions += other.positions;
        self.draft_time += other.draft_time;
        self.target_time += other.target_time;
    }
}

/// What [`SpecDiffDecoder::decode`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecDiffOutput {
    /// Generated ids, including the stop id that ended them: exactly
    /// [`decode_autoregressive`](spot_core::decode_autoregressive)'s.
    pub tokens: Vec<TokenId>,
    /// Whether a stop id (or the request's [`StopCheck`]) ended the decode.
    pub stopped: bool,
    /// Whether the request was cancelled ([`SpecDiffRequest::cancel_handle`]): `tokens` are
    /// the ones committed before.
    pub cancelled: bool,
    /// Target forwards (one per round; the prompt rides in the first).
    pub forwards: u64,
    /// Rounds, acceptance and timing.
    pub report: SpecDiffReport,
}

/// What a [`SpecDiffRequest`] needs next.
#[derive(Debug)]
pub enum ArNeed<'a> {
    /// The drafter's marginals of the `gamma` positions after `context`; answer with
    /// [`SpecDiffRequest::drafted`]. `gamma` 0: the request's [`Pace`](crate::Pace) skips
    /// this round's draft, and the drafter is only shown the context (a drafter that caches
    /// per decode keeps up); answer with empty marginals.
    Draft {
        /// The accepted text (prompt and generated tokens).
        context: &'a [TokenId],
        /// Positions to draft.
        gamma: usize,
    },
    /// One target forward: append `shared` to the request's cache (kept) and score every
    /// branch after it (not kept), as [`MeteredArModel::extend_branches`]; answer with
    /// [`SpecDiffRequest::scored`]. The first one carries the whole prompt (the cache must be
    /// empty).
    Score {
        /// Tokens committed since the last forward.
        shared: &'a [TokenId],
        /// The drafts (possibly none: the round then commits the target's token alone).
        branches: &'a [Vec<TokenId>],
        /// The query of every forward of the request.
        query: &'a StatsQuery,
    },
    /// Finished (or failed): take [`SpecDiffRequest::output`].
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Draft,
    Score,
    Done,
    Failed,
}

/// A request's stop condition (boxed, so that the request stays `Debug`).
struct Stop(Box<dyn StopCheck>);

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StopCheck")
    }
}

/// One SpecDiff-2 decode as a state machine, so that a driver can batch the drafter and
/// target work of many requests: ask [`need`](Self::need), answer it, repeat until
/// [`ArNeed::Done`]. [`SpecDiffDecoder::decode`] is the one-request driver;
/// [`SpecDiffRequest::plain`] is the draft-free decode in the same shape (so that a server
/// batches both).
#[derive(Debug)]
pub struct SpecDiffRequest {
    cfg: SpecDiffConfig,
    max_new_tokens: usize,
    early_stop: bool,
    stops: Vec<TokenId>,
    vocab: usize,
    query: StatsQuery,
    context: Vec<TokenId>,
    pending: usize,
    generated: usize,
    drafts: Vec<Vec<TokenId>>,
    /// Classic rule: the distribution each drafted token of draft 0 was drawn from.
    draft_q: Vec<Vec<(TokenId, f64)>>,
    /// Classic rule at `T > 0`: the seed of its uniforms.
    classic_seed: Option<u64>,
    phase: Phase,
    /// Positions this round asks the drafter for (0: the pace skips it).
    round_gamma: usize,
    /// Whether this round's drafter answered with any position (a drafter that cannot draft
    /// yet, such as the feature drafter before the target has run, answers none: the pace
    /// does not count that round).
    round_answered: bool,
    pace: Option<PaceState>,
    stopped: bool,
    cancel: CancelHandle,
    stop_check: Option<Stop>,
    report: SpecDiffReport,
}

impl SpecDiffRequest {
    /// A request for `prompt` on a target described by `info`, drafted by a drafter over
    /// `drafter_vocab` tokens; every input is checked here (typed errors naming the field).
    pub fn new(
        prompt: &[TokenId],
        ar: &ArConfig,
        cfg: SpecDiffConfig,
        info: &ArInfo,
        drafter_vocab: usize,
    ) -> Result<Self> {
        cfg.validate()?;
        check_inputs(info, prompt, ar)?;
        if drafter_vocab != info.vocab_size {
            return Err(Error::ShapeMismatch {
                what: "drafter vocabulary (it must share the target's tokenizer)",
                expected: info.vocab_size,
                actual: drafter_vocab,
            });
        }
        Ok(Self::build(prompt, ar, cfg, info))
    }

    /// A draft-free request for `prompt`: every round is one target forward that commits the
    /// target's own token, so its tokens and forwards are
    /// [`decode_autoregressive`](spot_core::decode_autoregressive)'s. It never asks for a
    /// draft.
    pub fn plain(prompt: &[TokenId], ar: &ArConfig, info: &ArInfo) -> Result<Self> {
        check_inputs(info, prompt, ar)?;
        let cfg = SpecDiffConfig {
            gamma: 0,
            ..SpecDiffConfig::default()
        };
        Ok(Self::build(prompt, ar, cfg, info))
    }

    /// The request of checked inputs.
    fn build(prompt: &[TokenId], ar: &ArConfig, cfg: SpecDiffConfig, info: &ArInfo) -> Self {
        let stops = if ar.stop_ids.is_empty() {
            info.stop_ids.clone()
        } else {
            ar.stop_ids.clone()
        };
        let classic = cfg.acceptance == Acceptance::Classic && ar.temperature > 0.0;
        let mut r = Self {
            cfg,
            max_new_tokens: ar.max_new_tokens,
            early_stop: ar.early_stop,
            stops,
            vocab: info.vocab_size,
            query: StatsQuery {
                // The classic rule reads the target's whole distribution.
                top_k: if classic {
                    info.vocab_size
                } else {
                    cfg.target_top_k
                },
                ..StatsQuery::new(ar.temperature, ar.seed)
            },
            context: prompt.to_vec(),
            pending: prompt.len(),
            generated: 0,
            drafts: Vec::new(),
            draft_q: Vec::new(),
            classic_seed: classic.then_some(ar.seed),
            phase: Phase::Draft,
            round_gamma: 0,
            round_answered: false,
            pace: cfg.pace.map(PaceState::new),
            stopped: false,
            cancel: CancelHandle::default(),
            stop_check: None,
            report: SpecDiffReport::default(),
        };
        r.start_round();
        r
    }

    /// Ends the decode early when `check` says so: it is given the generated tokens after
    /// every round (e.g. a server's stop strings), and the output keeps the tokens it names.
    pub fn with_stop_check(mut self, check: impl StopCheck + 'static) -> Self {
        self.stop_check = Some(Stop(Box::new(check)));
        self
    }

    /// A handle that cancels this request from anywhere (another thread): it then needs
    /// nothing more, and [`output`](Self::output) holds the tokens committed before, with
    /// [`SpecDiffOutput::cancelled`] set.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// The target's temperature and coupled noise (what
    /// [`DiffusionDrafter::target_sampling`] is told).
    pub fn target_sampling(&self) -> (f32, spot_core::GumbelNoise) {
        (self.query.temperature, self.query.noise)
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[TokenId] {
        &self.context[self.context.len() - self.generated..]
    }

    /// Drafted positions this round: no more than it can commit (its accepted tokens plus
    /// the target's own).
    fn gamma(&self) -> usize {
        self.cfg.gamma.min(self.max_new_tokens - self.generated - 1)
    }

    fn start_round(&mut self) {
        self.drafts.clear();
        let gamma = self.gamma();
        self.phase = if gamma > 0 {
            Phase::Draft
        } else {
            Phase::Score
        };
        let drafts = self.pace.as_mut().is_none_or(PaceState::draft_now);
        self.round_gamma = if drafts { gamma } else { 0 };
    }

    /// What the request needs next.
    pub fn need(&self) -> ArNeed<'_> {
        if self.cancel.is_cancelled() {
            return ArNeed::Done;
        }
        match self.phase {
            Phase::Draft => ArNeed::Draft {
                context: &self.context,
                gamma: self.round_gamma,
            },
            Phase::Score => ArNeed::Score {
                shared: &self.context[self.context.len() - self.pending..],
                branches: &self.drafts,
                query: &self.query,
            },
            Phase::Done | Phase::Failed => ArNeed::Done,
        }
    }

    /// The answer to [`ArNeed::Draft`]: samples the round's `K` drafts from `m`, which holds
    /// at most the `gamma` positions asked for (fewer: shorter drafts; none: the round is a
    /// plain forward).
    pub fn drafted(&mut self, m: &Marginals) -> Result<()> {
        self.expect(Phase::Draft)?;
        let gamma = self.round_gamma;
        self.round_answered = !m.is_empty();
        if m.len() > gamma {
            return self.fail(Error::ShapeMismatch {
                what: "drafted positions (at most the round's gamma)",
                expected: gamma,
                actual: m.len(),
            });
        }
        let k = if self.cfg.drafter_temperature > 0.0 {
            self.cfg.k
        } else {
            1
        };
        // The classic rule needs drafts drawn afresh for every seed of the decode: its
        // guarantee is over the drafts' randomness too.
        let draft_seed = match self.classic_seed {
            Some(seed) => self.cfg.draft_seed ^ mix64(seed ^ 0xd4af_7c1a_55ed_0001),
            None => self.cfg.draft_seed,
        };
        sample_drafts(
            m,
            k,
            self.cfg.drafter_temperature,
            self.cfg.greedy_first,
            (draft_seed, self.context.len()),
            &mut self.drafts,
        );
        if let Some(bad) = self
            .drafts
            .iter()
            .flatten()
            .find(|&&t| t as usize >= self.vocab)
        {
            let e = Error::config(
                "drafter marginals",
                format!("token {bad} is outside the vocabulary of {}", self.vocab),
            );
            return self.fail(e);
        }
        let keep = confident_length(m, &self.drafts, self.cfg.min_draft_prob);
        if keep == 0 || m.is_empty() {
            self.drafts.clear();
        }
        for d in &mut self.drafts {
            d.truncate(keep);
        }
        self.draft_q.clear();
        if self.classic_seed.is_some() && !self.drafts.is_empty() {
            let greedy = self.cfg.greedy_first || self.cfg.drafter_temperature <= 0.0;
            self.draft_q.extend((0..keep).map(|i| {
                let (ids, probs) = m.at(i);
                draft_distribution(ids, probs, self.cfg.drafter_temperature, greedy)
            }));
        }
        self.phase = Phase::Score;
        Ok(())
    }

    /// The answer to [`ArNeed::Score`]: the statistics of the shared run and of every branch.
    pub fn scored(&mut self, first: BlockStats, branches: Vec<BlockStats>) -> Result<()> {
        self.expect(Phase::Score)?;
        self.commit(first, branches).or_else(|e| self.fail(e))
    }

    fn commit(&mut self, first: BlockStats, branches: Vec<BlockStats>) -> Result<()> {
        // The shared run's last entry is the one read; a model may return it alone.
        check_stats(&first, 1, self.vocab)?;
        if branches.len() != self.drafts.len() {
            return Err(Error::ShapeMismatch {
                what: "scored branches",
                expected: self.drafts.len(),
                actual: branches.len(),
            });
        }
        for (b, d) in branches.iter().zip(&self.drafts) {
            check_stats(b, d.len(), self.vocab)?;
        }
        self.report.positions +=
            (self.pending + self.drafts.iter().map(Vec::len).sum::<usize>()) as u64;
        let last = (&first, first.len() - 1);
        let scored: Vec<Scored<'_>> = branches
            .iter()
            .map(|branch| Scored {
                first: last,
                branch,
            })
            .collect();
        // The chosen branch's accepted tokens, then the target's own token after them.
        let (pick, n, next) = if scored.is_empty() {
            (0, 0, first.token(last.1))
        } else if let Some(seed) = self.classic_seed {
            let (n, next) = self.classic(seed, &scored[0]);
            (0, n, next)
        } else {
            let (pick, accepted) = select(self.cfg.selection, &self.drafts, &scored);
            let n = accepted[pick];
            (pick, n, scored[pick].choice(n))
        };
        let mut new: Vec<TokenId> = self.drafts.get(pick).map_or(&[][..], |d| &d[..n]).to_vec();
        new.push(next);
        let r = &mut self.report;
        r.rounds += 1;
        if r.accepted.len() <= n {
            r.accepted.resize(n + 1, 0);
        }
        r.accepted[n] += 1;
        r.other_branch += u64::from(pick != 0);
        if let Some(pace) = self.pace.as_mut()
            && self.round_gamma > 0
            && self.round_answered
        {
            pace.drafted(self.drafts.iter().map(Vec::len).sum(), n);
        }
        // Commit up to the first stop id (kept) or the length limit.
        for &t in &new {
            self.context.push(t);
            self.generated += 1;
            self.stopped = self.early_stop && self.stops.contains(&t);
            if self.stopped || self.generated == self.max_new_tokens {
                self.phase = Phase::Done;
                break;
            }
        }
        // The stop check sees every round's output, the last one's too (unless a stop id
        // ended it), as a block-diffusion request's does.
        let generated = &self.context[self.context.len() - self.generated..];
        if !self.stopped
            && let Some(Stop(check)) = self.stop_check.as_mut()
            && let Some(keep) = check.check(generated)
        {
            let cut = self.generated - keep.min(self.generated);
            self.context.truncate(self.context.len() - cut);
            self.generated -= cut;
            self.stopped = true;
            self.phase = Phase::Done;
        }
        if self.phase == Phase::Done {
            return Ok(());
        }
        // The committed tokens ride in the next forward as its shared run.
        self.pending = new.len();
        self.start_round();
        Ok(())
    }

    /// The classic rule on draft 0: its accepted length and the token after it.
    fn classic(&self, seed: u64, s: &Scored<'_>) -> (usize, TokenId) {
        let draft = &self.drafts[0];
        let mut p = Vec::new();
        for (i, (&x, q)) in draft.iter().zip(&self.draft_q).enumerate() {
            let (stats, j) = s.at(i);
            dense_distribution(stats, j, self.vocab, &mut p);
            let position = (self.context.len() + i) as u64;
            let qx: f64 = q.iter().filter(|e| e.0 == x).map(|e| e.1).sum();
            if qx > 0.0 && uniform(seed, position, 0) < (p[x as usize] / qx).min(1.0) {
                continue;
            }
            // Rejected: a token from the residual max(0, p - q).
            for &(id, mass) in q {
                p[id as usize] -= mass;
            }
            let mut residual: Vec<f64> = p.iter().map(|&r| r.max(0.0)).collect();
            if residual.iter().sum::<f64>() <= 0.0 {
                // p == q up to rounding: rejection had probability 0; draw from p.
                dense_distribution(stats, j, self.vocab, &mut residual);
            }
            return (i, draw(&residual, uniform(seed, position, 1)));
        }
        // Every drafted token accepted: the target's own choice after them (a draw from p).
        (draft.len(), s.choice(draft.len()))
    }

    fn expect(&self, phase: Phase) -> Result<()> {
        if self.phase == phase {
            return Ok(());
        }
        let name = |p| match p {
            Phase::Draft => "drafter marginals",
            Phase::Score => "target statistics",
            Phase::Done => "nothing (finished)",
            Phase::Failed => "nothing (failed)",
        };
        Err(Error::RequestState {
            expected: name(self.phase),
            got: name(phase),
        })
    }

    fn fail(&mut self, e: Error) -> Result<()> {
        self.phase = Phase::Failed;
        Err(e)
    }

    /// Rounds, acceptance and counters so far (timing is the driver's).
    pub fn report(&self) -> &SpecDiffReport {
        &self.report
    }

    /// The output, once [`ArNeed::Done`] was reached by finishing or by a cancellation (not
    /// by an error).
    pub fn output(&self) -> Option<SpecDiffOutput> {
        let cancelled = match self.phase {
            Phase::Done => false,
            Phase::Failed => return None,
            Phase::Draft | Phase::Score => match self.cancel.is_cancelled() {
                true => true,
                false => return None,
            },
        };
        Some(SpecDiffOutput {
            tokens: self.tokens().to_vec(),
            stopped: self.stopped,
            cancelled,
            forwards: self.report.rounds,
            report: self.report.clone(),
        })
    }
}

/// The target's tempered distribution at entry `j` of `stats` over the whole vocabulary: its
/// top list, and the tail mass spread evenly over the ids the list leaves out (none or one
/// when the list holds the whole vocabulary, as the classic rule asks).
fn dense_distribution(stats: &BlockStats, j: usize, vocab: usize, out: &mut Vec<f64>) {
    out.clear();
    out.resize(vocab, 0.0);
    let (ids, probs) = stats.top(j);
    let mut listed = vec![false; vocab];
    for (&id, &prob) in ids.iter().zip(probs) {
        if !listed[id as usize] {
            listed[id as usize] = true;
            out[id as usize] = f64::from(prob);
        }
    }
    let missing = listed.iter().filter(|&&l| !l).count();
    let tail = f64::from(stats.tail_mass(j));
    if missing > 0 && tail > 0.0 {
        for (o, _) in out.iter_mut().zip(&listed).filter(|(_, l)| !**l) {
            *o = tail / missing as f64;
        }
    }
}

/// A uniform draw in `[0, 1)` of the classic rule at absolute `position` (`stream` 0: accept
/// or not, 1: the residual draw), from (`seed`, position, stream) only.
fn uniform(seed: u64, position: u64, stream: u64) -> f64 {
    unit(mix64(
        seed ^ mix64(position ^ mix64(stream ^ 0x5eed_c1a5_51c0_0000)),
    ))
}

/// The index of a distribution `w` (non-negative, not necessarily normalised) at uniform `u`.
fn draw(w: &[f64], u: f64) -> TokenId {
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let mut last = 0;
    for (v, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x / total;
            last = v;
            if u < acc {
                return v as TokenId;
            }
        }
    }
    last as TokenId
}

/// The longest prefix length `n` such that some draft's running product of its tokens'
/// probabilities under `m` over positions `0..n` is at least `floor` (all of them when
/// `floor` is 0).
fn confident_length(m: &Marginals, drafts: &[Vec<TokenId>], floor: f32) -> usize {
    let gamma = drafts.first().map_or(0, Vec::len);
    if floor <= 0.0 {
        return gamma;
    }
    drafts
        .iter()
        .map(|d| {
            let mut mass = 1.0f64;
            d.iter()
                .enumerate()
                .take_while(|&(i, &t)| {
                    let (ids, probs) = m.at(i);
                    let p = ids.iter().position(|&c| c == t).map_or(0.0, |j| probs[j]);
                    mass *= f64::from(p);
                    mass >= f64::from(floor)
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// SpecDiff-2 with coupled verification: each round the drafter proposes `K` drafts of `γ`
/// tokens, the target scores them all in one forward over the shared prefix
/// ([`AutoregressiveModel::forward`]), and the round commits one branch's accepted
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
}

impl SpecDiffDecoder {
    /// A decoder with `cfg` (validated).
    pub fn new(cfg: SpecDiffConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            marginals: Marginals::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SpecDiffConfig {
        &self.cfg
    }

    /// Decodes `prompt` with `target`, drafting with `drafter`: drives one
    /// [`SpecDiffRequest`], timing the drafter and the target.
    pub fn decode(
        &mut self,
        target: &mut dyn AutoregressiveModel,
        drafter: &mut dyn DiffusionDrafter,
        prompt: &[TokenId],
        cfg: &ArConfig,
    ) -> Result<SpecDiffOutput> {
        let info = target.ar_info().clone();
        let mut req = SpecDiffRequest::new(prompt, cfg, self.cfg, &info, drafter.vocab_size())?;
        let mut target = MeteredArModel::new(target);
        target.truncate(0)?;
        let (temperature, noise) = req.target_sampling();
        drafter.target_sampling(temperature, noise);
        let (mut draft_time, mut target_time) = (Duration::ZERO, Duration::ZERO);
        loop {
            let t0 = Instant::now();
            match req.need() {
                ArNeed::Draft { context, gamma } => {
                    drafter.propose(context, gamma, &mut self.marginals)?;
                    req.drafted(&self.marginals)?;
                    draft_time += t0.elapsed();
                }
                ArNeed::Score {
                    shared,
                    branches,
                    query,
                } => {
                    let (first, scored) = target.extend_branches(shared, branches, query)?;
                    target_time += t0.elapsed();
                    req.scored(first, scored)?;
                }
                ArNeed::Done => break,
            }
        }
        let mut out = req.output().ok_or(Error::RequestState {
            expected: "a finished request",
            got: "a failed one",
        })?;
        out.report.draft_time = draft_time;
        out.report.target_time = target_time;
        Ok(out)
    }
}
