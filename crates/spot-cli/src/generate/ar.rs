//! `spot generate` on an autoregressive folder (Llama, Qwen2): token-by-token decoding with a
//! KV cache, greedy or sampled with the coupled noise, or SpecDiff-2 (`--method specdiff`),
//! which returns the same tokens in fewer forwards.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_dlm::{ArConfig, ArInfo, ArOutput, AutoregressiveModel, TokenId, decode_autoregressive};
use spot_models::CausalLm;
use spot_specdiff::{
    Acceptance, DiffusionDrafter, LookupDrafter, LookupStore, MaskedDrafter, Selection,
    SpecDiffBatch, SpecDiffConfig, SpecDiffDecoder, SpecDiffReport, SpecDiffRequest,
};

use crate::decode_args::DecodeArgs;
use crate::generate::GenerateArgs;
use crate::methods::Method;
use crate::{Backend, DtypeArg};

/// SpecDiff-2's settings on the command line.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecDiffArgs {
    /// `--method specdiff`: drafts per round (K).
    #[arg(long, default_value_t = DEFAULT.k, value_parser = clap::value_parser!(u64).range(1..=8))]
    k: u64,
    /// `--method specdiff`: drafted tokens per round (the paper's γ; `--gamma` is the mass
    /// floor of the SPOT methods).
    #[arg(long, default_value_t = DEFAULT.draft_tokens, value_parser = clap::value_parser!(u64).range(1..=32))]
    draft_tokens: u64,
    /// `--method specdiff`: the drafter's sampling temperature (draft 0 is its argmax).
    #[arg(long, default_value_t = DEFAULT.drafter_temperature)]
    drafter_temperature: f32,
    /// `--method specdiff`: which branch a round commits: `longest` (the longest accepted
    /// streak, exact under coupled verification) or `expected-streak` (self-selection).
    #[arg(long, value_enum, default_value_t = DEFAULT.selection)]
    selection: SelectionArg,
    /// `--method specdiff`: adaptive draft length: draft only the leading positions whose
    /// running drafter probability stays at least this (0: always `--draft-tokens`); a round
    /// with none is a plain forward.
    #[arg(long, default_value_t = DEFAULT.min_draft_prob)]
    min_draft_prob: f32,
    /// `--method specdiff`: how drafted tokens are accepted: `coupled` (a drafted token is
    /// accepted iff it is the target's own choice: the output is `df`'s, token for token) or
    /// `classic` (`min(1, p/q)` with residual resampling, `--k 1` only: each token is
    /// distributed as `df`'s, but the tokens differ from `df`'s with the same seed at T > 0).
    #[arg(long, value_enum, default_value_t = DEFAULT.acceptance)]
    acceptance: AcceptanceArg,
}

/// The command line's defaults.
const DEFAULT: SpecDiffArgs = SpecDiffArgs {
    k: 8,
    draft_tokens: 16,
    drafter_temperature: 1.5,
    selection: SelectionArg::Longest,
    min_draft_prob: 0.0,
    acceptance: AcceptanceArg::Coupled,
};

impl Default for SpecDiffArgs {
    /// The settings `spot generate` uses when none is given.
    fn default() -> Self {
        DEFAULT
    }
}

/// [`Acceptance`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptanceArg {
    /// Token-identical to plain decoding.
    Coupled,
    /// Classic speculative sampling (distribution-preserving, `--k 1`).
    Classic,
}

impl AcceptanceArg {
    /// The decoder's rule.
    pub fn acceptance(self) -> Acceptance {
        match self {
            AcceptanceArg::Coupled => Acceptance::Coupled,
            AcceptanceArg::Classic => Acceptance::Classic,
        }
    }
}

/// [`Selection`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectionArg {
    /// The longest accepted streak.
    Longest,
    /// The highest expected streak under the target (SpecDiff-2's self-selection).
    ExpectedStreak,
}

impl SelectionArg {
    /// The decoder's [`Selection`].
    pub fn selection(self) -> Selection {
        match self {
            SelectionArg::Longest => Selection::LongestAccepted,
            SelectionArg::ExpectedStreak => Selection::ExpectedStreak,
        }
    }

    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            SelectionArg::Longest => "longest",
            SelectionArg::ExpectedStreak => "expected-streak",
        }
    }
}

impl SpecDiffArgs {
    /// The decoder's settings, drafting with `seed`.
    pub(crate) fn config(&self, seed: u64) -> SpecDiffConfig {
        SpecDiffConfig {
            k: self.k as usize,
            gamma: self.draft_tokens as usize,
            drafter_temperature: self.drafter_temperature,
            selection: self.selection.selection(),
            draft_seed: seed,
            min_draft_prob: self.min_draft_prob,
            acceptance: self.acceptance.acceptance(),
            ..SpecDiffConfig::default()
        }
    }
}

/// The default drafter folder of a target: `specdiff-drafter/` inside its folder.
pub const DEFAULT_SPECDIFF_DRAFTER: &str = "specdiff-drafter";

/// The default lookup store of a target: `specdiff-lookup.jsonl` inside its folder
/// (`tools/specdiff/setup_lookup.sh` writes it).
pub const DEFAULT_LOOKUP_STORE: &str = "specdiff-lookup.jsonl";

/// The drafter of `--method specdiff`: `lookup` (prompt lookup, training-free), a lookup
/// store file (`spot_specdiff::LookupStore`: prompt lookup plus retrieval from the target's
/// own continuations, calibrated), a drafter folder (`spot_specdiff::MaskedDrafter`), or by
/// default (`None`) `DIR/specdiff-drafter/` when it exists, else `DIR/specdiff-lookup.jsonl`
/// when it exists, else the lookup drafter.
pub(crate) fn drafter(
    choice: Option<&Path>,
    dir: &Path,
    vocab: usize,
) -> Result<Box<dyn DiffusionDrafter>> {
    let lookup = || -> Box<dyn DiffusionDrafter> { Box::new(LookupDrafter::new(vocab, 3, 4)) };
    let folder = match choice {
        Some(p) if p == Path::new("lookup") => return Ok(lookup()),
        Some(p) if p.is_file() => return store_drafter(p, vocab),
        Some(p) => p.to_path_buf(),
        None => {
            let d = dir.join(DEFAULT_SPECDIFF_DRAFTER);
            if !d.join(spot_specdiff::DRAFTER_FILE).is_file() {
                let store = dir.join(DEFAULT_LOOKUP_STORE);
                if store.is_file() {
                    eprintln!("drafter: lookup store {}", store.display());
                    return store_drafter(&store, vocab);
                }
                eprintln!(
                    "drafter: lookup (training-free; no {} or {} in {})",
                    DEFAULT_SPECDIFF_DRAFTER,
                    DEFAULT_LOOKUP_STORE,
                    dir.display()
                );
                return Ok(lookup());
            }
            d
        }
    };
    let d = MaskedDrafter::<Backend>::load(&folder, &crate::backend::device()?)
        .with_context(|| format!("loading the SpecDiff-2 drafter {}", folder.display()))?;
    Ok(Box::new(d))
}

/// Loads the autoregressive folder `dir` with `dtype`'s precision.
pub(crate) fn load_target(dir: &Path, dtype: DtypeArg) -> Result<CausalLm<Backend>> {
    CausalLm::<Backend>::load_as(dir, &crate::backend::device()?, dtype.precision)
        .with_context(|| format!("loading model folder {}", dir.display()))
}

/// The decode settings of `decode` for a target described by `info` (its stop ids).
pub(crate) fn ar_config(decode: &DecodeArgs, info: &ArInfo) -> ArConfig {
    ArConfig {
        max_new_tokens: decode.max_new_tokens,
        temperature: decode.temperature,
        seed: decode.seed,
        stop_ids: info.stop_ids.clone(),
        early_stop: !decode.no_early_stop,
    }
}

/// The request of `prompt` for `method`: draft-free for `df`, SpecDiff-2 with `sd` (for a
/// drafter over `drafter_vocab` tokens) for `specdiff`; `None` for a block-diffusion method.
pub(crate) fn request(
    method: Method,
    prompt: &[TokenId],
    (cfg, info): (&ArConfig, &ArInfo),
    (sd, drafter_vocab): (SpecDiffConfig, usize),
) -> Option<spot_dlm::Result<SpecDiffRequest>> {
    match method {
        Method::Df => Some(SpecDiffRequest::plain(prompt, cfg, info)),
        Method::Specdiff => Some(SpecDiffRequest::new(prompt, cfg, sd, info, drafter_vocab)),
        _ => None,
    }
}

/// The retrieval drafter over the lookup store file `path`.
fn store_drafter(path: &Path, vocab: usize) -> Result<Box<dyn DiffusionDrafter>> {
    let store = LookupStore::open(path, vocab)?;
    Ok(Box::new(LookupDrafter::with_store(vocab, store, 4)))
}

/// Decodes the prompt(s) of `a` with the autoregressive model in `dir`.
pub fn run(a: &GenerateArgs, dir: &Path) -> Result<()> {
    if !matches!(a.decode.method, Method::Df | Method::Specdiff) {
        bail!(
            "{} is an autoregressive model: it decodes token by token (--method df) or with \
             SpecDiff-2 (--method specdiff); --method {} needs a block-diffusion model",
            dir.display(),
            a.decode.method.name()
        );
    }
    let mut model = load_target(dir, a.dtype)?;
    let cfg = ar_config(&a.decode, model.ar_info());
    let prompts = match &a.prompts {
        Some(path) => a.file_prompts(dir, model.tokenizer(), path)?,
        None => vec![(String::new(), a.single_prompt(dir, model.tokenizer())?)],
    };
    let mut specdiff = match a.decode.method {
        Method::Specdiff => Some((
            SpecDiffDecoder::new(a.specdiff.config(a.decode.seed)).context(
                "--k / --draft-tokens / --drafter-temperature / --min-draft-prob / --acceptance",
            )?,
            drafter(
                a.decode.files.drafter.as_deref(),
                dir,
                model.ar_info().vocab_size,
            )?,
        )),
        _ => None,
    };
    if let (Some((d, drafter)), true) = (specdiff.as_mut(), a.batch > 1) {
        return run_batched(&mut model, (d, drafter.as_mut()), &prompts, &cfg, a.batch);
    }
    for (id, ids) in &prompts {
        let start = Instant::now();
        let (out, report) = match specdiff.as_mut() {
            Some((d, drafter)) => {
                let o = d
                    .decode(&mut model, drafter.as_mut(), ids, &cfg)
                    .with_context(|| format!("prompt {id}"))?;
                let out = ArOutput {
                    tokens: o.tokens,
                    stopped: o.stopped,
                    forwards: o.forwards,
                };
                (out, Some(o.report))
            }
            None => (
                decode_autoregressive(&mut model, ids, &cfg)
                    .with_context(|| format!("prompt {id}"))?,
                None,
            ),
        };
        let wall = start.elapsed().as_secs_f64();
        let text = match model.tokenizer() {
            Some(t) => t.decode(&out.tokens)?,
            None => format!("{:?}", out.tokens),
        };
        if a.json || a.prompts.is_some() {
            println!(
                "{}",
                result_json(id, ids, &out, &text, wall, report.as_ref())
            );
        } else {
            println!("{text}");
            let how = match &report {
                Some(r) => format!(
                    "SpecDiff-2: {:.2} tokens per forward, drafter {:.1}% of the time",
                    out.tokens.len() as f64 / out.forwards.max(1) as f64,
                    100.0 * r.draft_share()
                ),
                None => "autoregressive".to_string(),
            };
            eprintln!(
                "[{} tokens, {} NFE ({how}), {:.2} s]",
                out.tokens.len(),
                out.forwards,
                wall
            );
        }
    }
    Ok(())
}

/// `--batch N` with SpecDiff-2: the prompts through one [`SpecDiffBatch`] (`N` in flight,
/// every request's target work in one forward per step); each output is the one `--batch 1`
/// gives. Prints one JSON line per prompt in file order (its `wall_s` is the whole run's), then
/// the target forwards the batch ran against the requests' own.
fn run_batched(
    model: &mut CausalLm<Backend>,
    (decoder, drafter): (&mut SpecDiffDecoder, &mut dyn DiffusionDrafter),
    prompts: &[(String, Vec<TokenId>)],
    cfg: &ArConfig,
    in_flight: u64,
) -> Result<()> {
    let info = model.ar_info().clone();
    let mut batch = SpecDiffBatch::new(in_flight as usize)?;
    for (id, ids) in prompts {
        let r = SpecDiffRequest::new(ids, cfg, *decoder.config(), &info, drafter.vocab_size())
            .with_context(|| format!("prompt {id}"))?;
        batch.submit(r);
    }
    let start = Instant::now();
    let mut done = batch.run(model, drafter)?;
    let wall = start.elapsed().as_secs_f64();
    done.sort_by_key(|f| f.id);
    let mut own = 0;
    for (f, (id, ids)) in done.into_iter().zip(prompts) {
        let o = f.output.with_context(|| format!("prompt {id}"))?;
        own += o.forwards;
        let out = ArOutput {
            tokens: o.tokens,
            stopped: o.stopped,
            forwards: o.forwards,
        };
        let text = match model.tokenizer() {
            Some(t) => t.decode(&out.tokens)?,
            None => format!("{:?}", out.tokens),
        };
        println!(
            "{}",
            result_json(id, ids, &out, &text, wall, Some(&o.report))
        );
    }
    eprintln!(
        "[{} prompts (batch {in_flight}): {} target forwards for the requests' {own} rounds \
         ({:.2} requests per forward), {wall:.2} s]",
        prompts.len(),
        batch.forwards(),
        own as f64 / batch.forwards().max(1) as f64
    );
    Ok(())
}

pub(crate) fn result_json(
    id: &str,
    prompt: &[TokenId],
    out: &ArOutput,
    text: &str,
    wall: f64,
    report: Option<&SpecDiffReport>,
) -> serde_json::Value {
    let mut j = serde_json::json!({
        "method": if report.is_some() { "specdiff" } else { "ar" },
        "prompt_tokens": prompt.len(),
        "prompt_ids": prompt,
        "tokens": out.tokens,
        "text": text,
        "stopped": out.stopped,
        "nfe": out.forwards,
        "wall_s": wall,
    });
    if let Some(obj) = j.as_object_mut() {
        if !id.is_empty() {
            obj.insert("id".into(), id.into());
        }
        if let Some(r) = report {
            obj.insert("rounds".into(), r.rounds.into());
            obj.insert("accepted_histogram".into(), r.accepted.clone().into());
            obj.insert("draft_share".into(), r.draft_share().into());
        }
    }
    j
}
