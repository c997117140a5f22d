//! The decoding options `spot generate` and `spot serve` share: one definition, so that the
//! server's defaults are `spot generate`'s and a response equals its output.

use anyhow::Result;
use spot_dlm::{
    BlockDiffusionModel, BlockLayout, ConfidenceRule, DecodeConfig, Request, Strategy, Transition,
};
use spot_models::{DiffusionModel, StopStrings};

use crate::Backend;
use crate::methods::{self, BlockEndArgs, DrafterFileArgs, Drafters, Method, Precision, Settings};

/// How to decode: method, block plan, sampling and drafter files (flattened into the
/// commands' arguments).
#[derive(clap::Args, Clone, Debug)]
pub struct DecodeArgs {
    /// Tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_new_tokens: usize,
    /// Block size (default: the config's `block_size`, else 32).
    #[arg(long)]
    pub(crate) block_size: Option<usize>,
    /// Where blocks sit: `aligned` (absolute multiples of the block size, the prompt's tail in
    /// the first block; SDAR's, LLaDA2.0's) or `after-prompt` (LLaDA's own sampler). Default:
    /// the model family's own; block-causal models accept only `aligned`.
    #[arg(long, value_enum)]
    pub(crate) layout: Option<LayoutArg>,
    /// Sampling temperature (0 = argmax).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) temperature: f32,
    /// Seed of the coupled noise table.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Top-k truncation: sample each position among its K most likely tokens, renormalised
    /// (block-diffusion models; applied by every method alike, so they stay exact).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) sample_top_k: Option<u64>,
    /// Decoding method.
    #[arg(long, value_enum, default_value_t = Method::Blockspec)]
    pub(crate) method: Method,
    /// Decode with threshold decoding `Φ^τ` at this `τ` (commit every position whose
    /// confidence exceeds it); speculative methods then verify against it. Default 0.9 for
    /// `threshold` and the `sets*` methods, one commit per forward for the others.
    #[arg(long)]
    pub(crate) threshold: Option<f32>,
    /// Decode each block in S steps as SDAR's and LLaDA's own samplers schedule them: step `i`
    /// commits its share of the block (the block size spread evenly over the steps), the most
    /// confident positions, or with `--threshold` every position above it when at least that
    /// many are (SDAR's `low_confidence_dynamic`; without it `low_confidence_static`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) steps: Option<u32>,
    /// Decode each block in S steps of Dream's linear timestep schedule (`t` from 1 down to
    /// `--eps`; step `i` commits `⌊m (1 - t[i+1] / t[i])⌋` of the `m` masked positions, the most
    /// confident). Dream's own sampler is this over one block: add `--single-block` and
    /// `--confidence negative-entropy` (its `entropy`), `probability` (`maskgit_plus`) or
    /// `margin` (`topk_margin`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), conflicts_with_all = ["steps", "threshold"])]
    pub(crate) timesteps: Option<u32>,
    /// The last timestep of `--timesteps`, in (0, 1).
    #[arg(long, default_value_t = spot_dlm::core::DREAM_EPS, requires = "timesteps")]
    pub(crate) eps: f32,
    /// One block holding the whole generation, right after the prompt (Dream's own sampler
    /// has no blocks); models with full attention only. Overrides `--block-size` and
    /// `--layout`.
    #[arg(long, conflicts_with_all = ["block_size", "layout"])]
    pub(crate) single_block: bool,
    /// Draft budget D (nodes per round) for speculative methods.
    #[arg(long, default_value_t = 8)]
    pub(crate) budget: usize,
    #[command(flatten)]
    pub(crate) files: DrafterFileArgs,
    /// Mass floor γ for speculative methods other than `spot-gamma`.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) gamma: f32,
    /// Mass floor γ of `--method spot-gamma`.
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true)]
    pub(crate) spot_gamma: f32,
    /// Arithmetic of SPOT's order network: `int8` (its encoder's matrix products quantised,
    /// about twice as fast; the tree may differ where positions nearly tie, the output never)
    /// or `f32` (the network as trained).
    #[arg(long, default_value_t = methods::DEFAULT_DRAFTER_PRECISION)]
    pub(crate) drafter_precision: Precision,
    /// How the token module picks the tokens it writes for SPOT (where the checkpoint drafts
    /// module tokens: T = 0 on the shipped drafter): `shortlist` (the target's rule among each
    /// position's stale top 32; the same token wherever the module's choice is among them) or
    /// `full` (the whole vocabulary through the target's reduction: the module's exact choice).
    #[arg(long, default_value_t = methods::ModuleHead::default())]
    pub(crate) module_head: methods::ModuleHead,
    /// Which nodes each call of a tree's scorer takes: `layers` (every node of a depth that
    /// could still enter the tree) or `best-first:K` (the K heaviest not yet scored; fewer
    /// nodes scored, more calls; `best-first` is K = 2).
    #[arg(long, default_value_t = methods::Expand::default())]
    pub(crate) expand: methods::Expand,
    #[command(flatten)]
    pub(crate) block_ends: BlockEndArgs,
    /// Decode all blocks even after a stop id (fixed-length protocol).
    #[arg(long)]
    pub(crate) no_early_stop: bool,
    /// Confidence rule that ranks positions: `probability` (SDAR, default), `raw-probability`
    /// (LLaDA's sampler at T > 0), `margin` or `negative-entropy` (Dream's rules).
    #[arg(long, default_value_t = ConfidenceRule::Probability, value_parser = parse_rule)]
    pub(crate) confidence: ConfidenceRule,
    /// LLaDA / Dream: Fast-dLLM-style approximate prefix cache (the prefix's keys are computed
    /// once per block; changes the model's numbers, speculative still equals draft-free).
    #[arg(long)]
    pub(crate) approx_prefix_cache: bool,
}

/// `--confidence`: a [`ConfidenceRule::name`] (the rules have one definition, in spot-core).
fn parse_rule(s: &str) -> Result<ConfidenceRule, String> {
    s.parse().map_err(|e: spot_dlm::core::Error| e.to_string())
}

impl DecodeArgs {
    /// The speculative methods' settings.
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            budget: self.budget,
            gamma: self.gamma,
            spot_gamma: self.spot_gamma,
            block_ends: self.block_ends.into(),
            drafter_precision: self.drafter_precision,
            module_head: self.module_head,
            expand: self.expand,
        }
    }

    /// The decode configuration for `model`: its family's defaults, overridden by these
    /// options.
    pub(crate) fn config(&self, model: &DiffusionModel<Backend>) -> DecodeConfig {
        let defaults = DecodeConfig::for_model(model.info());
        let layout = self.layout.map_or(defaults.layout, |l| match l {
            LayoutArg::Aligned => BlockLayout::Aligned,
            LayoutArg::AfterPrompt => BlockLayout::AfterPrompt,
        });
        let (block_size, layout) = match self.single_block {
            true => (self.max_new_tokens, BlockLayout::AfterPrompt),
            false => (self.block_size.unwrap_or(defaults.block_size), layout),
        };
        DecodeConfig {
            block_size,
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            seed: self.seed,
            transition: {
                let tau = self
                    .threshold
                    .or((self.method == Method::Threshold || self.method.is_sets()).then_some(0.9));
                match (self.timesteps, self.steps, tau) {
                    (Some(steps), ..) => Transition::Timesteps {
                        steps,
                        eps: self.eps,
                    },
                    (None, Some(steps), tau) => Transition::Scheduled { steps, tau },
                    (None, None, Some(tau)) => Transition::Threshold { tau },
                    (None, None, None) => Transition::Exact,
                }
            },
            early_stop: !self.no_early_stop,
            confidence: self.confidence,
            sample_top_k: self.sample_top_k.map(|k| k as usize),
            layout,
            ..defaults
        }
    }

    /// The request of one prompt: the method's decoder over `drafters` (loaded for this
    /// method), and the stop strings when given.
    pub(crate) fn request(
        &self,
        drafters: &Drafters,
        model: &mut DiffusionModel<Backend>,
        (prompt, cfg): (&[u32], &DecodeConfig),
        stops: Option<StopStrings>,
    ) -> Result<Request<Strategy>> {
        let request =
            methods::request(self.method, self.settings(), drafters, model, (prompt, cfg))?;
        Ok(match stops {
            Some(s) => request.with_stop_check(s),
            None => request,
        })
    }
}

/// `--layout`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum LayoutArg {
    /// Blocks at absolute multiples of the block size.
    Aligned,
    /// The first block right after the prompt.
    AfterPrompt,
}
