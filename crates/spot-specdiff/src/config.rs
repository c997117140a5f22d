//! The settings of a SpecDiff-2 decode (what the decoder runs and a drafter recommends).

use spot_core::{Error, Result};

use crate::select::Selection;

/// Settings of [`SpecDiffDecoder`](crate::SpecDiffDecoder).
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
    /// Adaptive draft length: a round drafts only the leading positions where some draft's
    /// running product of drafter probabilities (of the tokens it drafted) is at least this
    /// (all drafts cut to that common length); a round with none is a plain forward over the
    /// committed tokens. `0` (the default) always drafts `γ`. In `[0, 1]`. Drafts never change
    /// the output; this trades drafted rows, which cost compute in every forward, against
    /// tokens accepted per round.
    pub min_draft_prob: f32,
    /// How drafted tokens are accepted: coupled (the default, token-identical to plain
    /// decoding) or the classic rule (distribution-preserving only; `k` = 1).
    pub acceptance: Acceptance,
    /// Drafting only while it pays in this decode ([`Pace`]); `None` (the default) drafts
    /// every round. Never changes the output.
    pub pace: Option<Pace>,
}

/// When a decode drafts: a cost model in units of one target forward over the committed
/// tokens alone (a plain round), and a running estimate of what drafted rounds gain.
///
/// A drafted round commits `1 + a` tokens (`a` drafted tokens accepted) for a forward over `g`
/// more rows and a drafter call: it beats plain rounds when `a > row_cost · g + draft_cost`.
/// The request keeps the mean of `a − row_cost · g − draft_cost` over its drafted rounds
/// (exponentially weighted, `weight` to the newest, starting at `1`); while that mean is below
/// 0 only one round in `probe_every` asks for a draft, so that a decode whose drafts stop
/// paying (a temperature, a kind of text the drafter has not learnt) costs at most one probe
/// in `probe_every` rounds, and one that starts paying again drafts again.
///
/// The costs are the hardware's: on the 2-core CPU of `docs/specdiff.md` a SmolLM2-135M
/// forward over 1 + 8 rows costs about 2.1 forwards over 1 ([`Pace::cpu`]); on a GPU, where
/// a few more rows cost next to nothing, `row_cost` is near 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// What one drafted row adds to a forward, in forwards (`>= 0`).
    pub row_cost: f32,
    /// What one drafter call costs, in forwards (`>= 0`).
    pub draft_cost: f32,
    /// The weight of the newest drafted round in the running mean (in `(0, 1]`).
    pub weight: f32,
    /// While drafting does not pay, one round in this many drafts (at least 1).
    pub probe_every: u32,
}

impl Pace {
    /// Costs measured on a 2-core CPU (AMD EPYC, `spot bench-forward` on SmolLM2-135M-Instruct
    /// after a 300-token prefix: 34.5 ms for 1 row, 54.3 for 5, 73.2 for 9, so a drafted row
    /// adds 0.14 of a forward), and a drafter call at 0.15 of a forward (the 30-prompt runs of
    /// `docs/specdiff.md` measured 4.5-5.4 ms per drafted round, 0.13-0.16); a slow mean
    /// (weight 0.1) and one probe in 32 rounds. Against the earlier 0.09 / 0.2 / 16, on 30
    /// GSM8K-test prompts at T = 0 it drafted through more of each decode: 2.00x fewer target
    /// forwards instead of 1.76x (medians 1.23x and 1.20x faster); the other sets and T = 1
    /// within noise (stop 68, `docs/specdiff.md`).
    pub fn cpu() -> Self {
        Self {
            row_cost: 0.14,
            draft_cost: 0.15,
            weight: 0.1,
            probe_every: 32,
        }
    }

    fn validate(&self) -> Result<()> {
        let cost = |c: f32| c.is_finite() && c >= 0.0;
        if !cost(self.row_cost) {
            return Err(Error::config(
                "pace.row_cost",
                format!("must be finite and >= 0, got {}", self.row_cost),
            ));
        }
        if !cost(self.draft_cost) {
            return Err(Error::config(
                "pace.draft_cost",
                format!("must be finite and >= 0, got {}", self.draft_cost),
            ));
        }
        if !(self.weight > 0.0 && self.weight <= 1.0) {
            return Err(Error::config(
                "pace.weight",
                format!("must be in (0, 1], got {}", self.weight),
            ));
        }
        if self.probe_every == 0 {
            return Err(Error::config(
                "pace.probe_every",
                "must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}

/// Parses `cpu` ([`Pace::cpu`]) or
/// `ROW_COST:DRAFT_COST[:WEIGHT[:PROBE_EVERY]]` (the rest from [`Pace::cpu`]), and checks the
/// values; the error names the field.
impl std::str::FromStr for Pace {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s == "cpu" {
            return Ok(Self::cpu());
        }
        let parts: Vec<&str> = s.split(':').collect();
        if !(2..=4).contains(&parts.len()) {
            return Err(Error::config(
                "pace",
                format!("expected cpu or ROW_COST:DRAFT_COST[:WEIGHT[:PROBE_EVERY]], got {s:?}"),
            ));
        }
        let num = |field: &'static str, v: &str| {
            v.parse::<f32>()
                .map_err(|e| Error::config(field, format!("{v:?}: {e}")))
        };
        let mut pace = Self::cpu();
        pace.row_cost = num("pace.row_cost", parts[0])?;
        pace.draft_cost = num("pace.draft_cost", parts[1])?;
        if let Some(w) = parts.get(2) {
            pace.weight = num("pace.weight", w)?;
        }
        if let Some(p) = parts.get(3) {
            pace.probe_every = p
                .parse()
                .map_err(|e| Error::config("pace.probe_every", format!("{p:?}: {e}")))?;
        }
        pace.validate()?;
        Ok(pace)
    }
}

impl std::fmt::Display for Pace {
    /// The form [`Pace`]'s `FromStr` reads back: `ROW_COST:DRAFT_COST:WEIGHT:PROBE_EVERY`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.row_cost, self.draft_cost, self.weight, self.probe_every
        )
    }
}

/// A decode's running estimate of what its drafted rounds gain ([`Pace`]).
#[derive(Clone, Debug)]
pub(crate) struct PaceState {
    pace: Pace,
    gain: f32,
    skipped: u32,
}

impl PaceState {
    pub(crate) fn new(pace: Pace) -> Self {
        Self {
            pace,
            gain: 1.0,
            skipped: 0,
        }
    }

    /// Whether this round asks for a draft.
    pub(crate) fn draft_now(&mut self) -> bool {
        if self.gain >= 0.0 {
            return true;
        }
        self.skipped += 1;
        self.skipped.is_multiple_of(self.pace.probe_every)
    }

    /// Learns what a drafted round gained: `accepted` tokens for `rows` drafted rows.
    pub(crate) fn drafted(&mut self, rows: usize, accepted: usize) {
        let p = &self.pace;
        let gain = accepted as f32 - p.row_cost * rows as f32 - p.draft_cost;
        self.gain = (1.0 - p.weight) * self.gain + p.weight * gain;
    }
}

/// How a round accepts drafted tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acceptance {
    /// A drafted token is accepted iff it equals the target's own choice
    /// `argmax_v(logit_v / T + G[p, v])` at its position: the output is token-identical to
    /// [`decode_autoregressive`](spot_core::decode_autoregressive) with the same seed.
    #[default]
    Coupled,
    /// Classic speculative sampling (Leviathan et al., Chen et al.), for one draft (`k` = 1):
    /// drafted token `x` is accepted with probability `min(1, p(x) / q(x))`, where `p` is the
    /// target's tempered distribution and `q` the distribution the draft was drawn from
    /// ([`draft_distribution`](crate::draft_distribution): a point mass for a greedy draft); the first rejected position
    /// takes a token drawn from the residual `max(0, p - q)` (renormalised) and ends the
    /// round; a fully accepted draft adds the target's own choice after it. The uniforms
    /// depend on (seed, absolute position) only, and sampled drafts are drawn with the
    /// decode's seed mixed into `draft_seed`, so that over seeds `x ~ q` as the rule needs. Each generated token is distributed as
    /// plain sampling's, but the tokens are **not** those of `decode_autoregressive` with the
    /// same seed. At `T = 0` it is the coupled rule. The target's statistics must then carry
    /// its whole distribution: the request asks for the full top list, which costs a sort
    /// of the vocabulary per drafted position.
    Classic,
}

impl Acceptance {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Acceptance::Coupled => "coupled",
            Acceptance::Classic => "classic",
        }
    }
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
            min_draft_prob: 0.0,
            acceptance: Acceptance::Coupled,
            pace: None,
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
        if !(0.0..=1.0).contains(&self.min_draft_prob) {
            return Err(Error::config(
                "min_draft_prob",
                format!("must be in [0, 1], got {}", self.min_draft_prob),
            ));
        }
        if let Some(pace) = &self.pace {
            pace.validate()?;
        }
        if self.acceptance == Acceptance::Classic && self.k != 1 {
            return Err(Error::config(
                "acceptance",
                format!(
                    "the classic rule verifies one draft (k = 1), got k = {}",
                    self.k
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_reads_back_what_it_writes_and_names_the_bad_field() {
        assert_eq!("cpu".parse::<Pace>().unwrap(), Pace::cpu());
        let p: Pace = "0.1:0.2".parse().unwrap();
        assert_eq!((p.row_cost, p.draft_cost), (0.1, 0.2));
        assert_eq!(
            (p.weight, p.probe_every),
            (Pace::cpu().weight, Pace::cpu().probe_every)
        );
        let p: Pace = "0.05:0.3:0.1:32".parse().unwrap();
        assert_eq!(p.to_string().parse::<Pace>().unwrap(), p);
        assert_eq!(p.probe_every, 32);
        let field = |s: &str| match s.parse::<Pace>() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(field("gpu"), "pace");
        assert_eq!(field("free"), "pace");
        assert_eq!(field("0.1"), "pace");
        assert_eq!(field("0.1:0.2:0.3:4:5"), "pace");
        assert_eq!(field("x:0.2"), "pace.row_cost");
        assert_eq!(field("0.1:-1"), "pace.draft_cost");
        assert_eq!(field("0.1:0.2:0"), "pace.weight");
        assert_eq!(field("0.1:0.2:0.5:0"), "pace.probe_every");
        assert_eq!(field("0.1:0.2:0.5:-3"), "pace.probe_every");
        assert_eq!(field("NaN:0.2"), "pace.row_cost");
    }
}
