//! `spot generate` on an autoregressive folder (Llama, Qwen2): token-by-token decoding with a
//! KV cache, greedy or sampled with the coupled noise, or SpecDiff-2 (`--method specdiff`),
//! which returns the same tokens in fewer forwards.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_dlm::{ArConfig, ArInfo, ArOutput, AutoregressiveModel, TokenId, decode_autoregressive};
use spot_models::CausalLm;
use spot_specdiff::{
    Acceptance, DiffusionDrafter, FeatureDrafter, LookupDrafter, LookupStore, MaskedDrafter,
    Selection, SpecDiffBatch, SpecDiffConfig, SpecDiffDecoder, SpecDiffReport, SpecDiffRequest,
};

use crate::decode_args::DecodeArgs;
use crate::generate::GenerateArgs;
use crate::methods::Method;
use crate::{Backend, DtypeArg};

/// SpecDiff-2's settings on the command line. Each one left out takes the drafter's own
/// recommendation ([`DiffusionDrafter::recommended`]: what was measured to pay for it).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpecDiffArgs {
    /// `--method specdiff`: drafts per round (K; default: the drafter's recommendation).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=8))]
    k: Option<u64>,
    /// `--method specdiff`: drafted tokens per round (the paper's γ; `--gamma` is the mass
    /// floor of the SPOT methods; default: the drafter's recommendation).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=32))]
    draft_tokens: Option<u64>,
    /// `--method specdiff`: the drafter's sampling temperature (draft 0 is its argmax;
    /// default: the drafter's recommendation).
    #[arg(long)]
    drafter_temperature: Option<f32>,
    /// `--method specdiff`: which branch a round commits: `longest` (the longest accepted
    /// streak, exact under coupled verification) or `expected-streak` (self-selection).
    #[arg(long, value_enum)]
    selection: Option<SelectionArg>,
    /// `--method specdiff`: adaptive draft length: draft only the leading positions whose
    /// running drafter probability stays at least this (0: always `--draft-tokens`); a round
    /// with none is a plain forward (default: the drafter's recommendation).
    #[arg(long)]
    min_draft_prob: Option<f32>,
    /// `--method specdiff`: how drafted tokens are accepted: `coupled` (a drafted token is
    /// accepted iff it is the target's own choice: the output is `df`'s, token for token) or
    /// `classic` (`min(1, p/q)` with residual resampling, `--k 1` only: each token is
    /// distributed as `df`'s, but the tokens differ from `df`'s with the same seed at T > 0).
    #[arg(long, value_enum)]
    acceptance: Option<AcceptanceArg>,
    /// `--method specdiff`: draft every round, even where the decode's drafted rounds gain
    /// less than they cost (the drafter's pace, `spot_specdiff::Pace`, is on by default for
    /// the lookup and feature drafters). Never changes the output.
    #[arg(long, conflicts_with = "pace")]
    no_pace: bool,
    /// `--method specdiff`: the costs the drafter's pace weighs drafting against: `cpu` (the
    /// default's, measured on a 2-core CPU) or `ROW_COST:DRAFT_COST[:WEIGHT[:PROBE_EVERY]]`
    /// in target forwards (`spot_specdiff::Pace`; on a GPU, where a few more rows cost next to
    /// nothing, a small row cost; `0:0` drafts every round). Never changes the output.
    #[arg(long)]
    pace: Option<spot_specdiff::Pace>,
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
    /// The decoder's settings, drafting with `seed`: each setting given, else `recommended`'s.
    pub(crate) fn config(&self, seed: u64, recommended: SpecDiffConfig) -> SpecDiffConfig {
        let r = recommended;
        SpecDiffConfig {
            k: self.k.map_or(r.k, |k| k as usize),
            gamma: self.draft_tokens.map_or(r.gamma, |g| g as usize),
            drafter_temperature: self.drafter_temperature.unwrap_or(r.drafter_temperature),
            selection: self.selection.map_or(r.selection, SelectionArg::selection),
            draft_seed: seed,
            min_draft_prob: self.min_draft_prob.unwrap_or(r.min_draft_prob),
            acceptance: self
                .acceptance
                .map_or(r.acceptance, AcceptanceArg::acceptance),
            pace: if self.no_pace {
                None
            } else {
                self.pace.or(r.pace)
            },
            ..r
        }
    }
}

/// The default drafter folder of a target: `specdiff-drafter/` inside its folder.
pub const DEFAULT_SPECDIFF_DRAFTER: &str = "specdiff-drafter";

/// The default lookup store of a target: `specdiff-lookup.jsonl` inside its folder
/// (`tools/specdiff/setup_lookup.sh` writes it).
pub const DEFAULT_LOOKUP_STORE: &str = "specdiff-lookup.jsonl";

/// The drafter of `--method specdiff` for `model` (the target, loaded from `dir`): `lookup`
/// (prompt lookup, training-free), a lookup store file (`spot_specdiff::LookupStore`: prompt
/// lookup plus retrieval from the target's own continuations, calibrated), a drafter folder
/// (`spot_specdiff::FeatureDrafter`, which taps `model`'s hidden states, or
/// `spot_specdiff::MaskedDrafter`, by the folder file's `format`), or by default (`None`)
/// `DIR/specdiff-drafter/` when it exists, else `DIR/specdiff-lookup.jsonl` when it exists,
/// else the lookup drafter.
pub(crate) fn drafter(
    choice: Option<&Path>,
    dir: &Path,
    model: &mut CausalLm<Backend>,
) -> Result<Box<dyn DiffusionDrafter>> {
    let vocab = model.ar_info().vocab_size;
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
    let context = || format!("loading the SpecDiff-2 drafter {}", folder.display());
    if drafter_format(&folder).with_context(context)?.as_deref()
        == Some(spot_specdiff::FEATURE_DRAFTER_FORMAT)
    {
        let d = FeatureDrafter::load(&folder, model).with_context(context)?;
        return Ok(Box::new(d));
    }
    let d = MaskedDrafter::<Backend>::load(&folder, &crate::backend::device()?)
        .with_context(context)?;
    Ok(Box::new(d))
}

/// The `format` field of a drafter folder's `specdiff-drafter.json` (`None` when the file or
/// the field is missing: the loader then names what is wrong).
fn drafter_format(folder: &Path) -> Result<Option<String>> {
    let path = folder.join(spot_specdiff::DRAFTER_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    Ok(v.get("format").and_then(|f| f.as_str()).map(str::to_owned))
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
        Method::Specdiff => {
            let d = drafter(a.decode.files.drafter.as_deref(), dir, &mut model)?;
            let sd = a.specdiff.config(a.decode.seed, d.recommended());
            Some((
                SpecDiffDecoder::new(sd).context(
                    "--k / --draft-tokens / --drafter-temperature / --min-draft-prob / \
                     --acceptance",
                )?,
                d,
            ))
        }
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
