//! `spot generate`: decode one prompt (streaming) or every prompt of a JSONL file (JSON lines).

pub(crate) mod ar;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use spot_dlm::{
    BatchDriver, BlockObserver, BlockProgress, DecodeConfig, DecodeOutput, run_request,
};
use spot_models::{DiffusionModel, Family, StopStrings};

use crate::decode_args::DecodeArgs;
use crate::methods::{Drafters, Method};
use crate::prompts::ChatArgs;
use crate::{Backend, load, model_dir, prompts};

/// Arguments of `spot generate`.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Hugging Face model folder (config.json, model.safetensors, tokenizer.json). Default:
    /// `SPOT_MODEL`, else the shipped `models/sdar-tiny-code`.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dtype: crate::DtypeArg,
    /// Prompt text (tokenised with the folder's tokenizer.json).
    #[arg(long, conflicts_with_all = ["prompt_ids", "prompts"], required_unless_present_any = ["prompt_ids", "prompts"])]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompts")]
    prompt_ids: Option<Vec<u32>>,
    /// JSONL file of prompts (e.g. `data/humaneval.jsonl`): decode each, print one JSON line
    /// per prompt and a summary on stderr.
    #[arg(long)]
    pub(crate) prompts: Option<PathBuf>,
    /// Field of each JSONL record holding the prompt (default: the first of prompt, question,
    /// text, input, problem).
    #[arg(long)]
    field: Option<String>,
    /// Decode only the first N prompts of `--prompts`.
    #[arg(long)]
    limit: Option<usize>,
    /// With `--prompts`: decode up to N prompts at a time through one model, their forwards
    /// merged into one (continuous batching: a finished prompt's place goes to the next).
    /// Outputs are identical to `--batch 1`; lines are printed in file order. On an
    /// autoregressive model, with `--method specdiff` (every request's round in one target
    /// forward).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch: u64,
    /// Stop string (repeatable): decoding ends at the first block end whose text contains
    /// one; the output keeps the fewest tokens whose text holds it, and the text ends before
    /// it.
    #[arg(long)]
    stop: Vec<String>,
    #[command(flatten)]
    pub(crate) decode: DecodeArgs,
    #[command(flatten)]
    pub(crate) specdiff: crate::generate::ar::SpecDiffArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also decode the prompt with the reference the method must equal (draft-free, or
    /// threshold decoding for the `sets*` methods), print both forward counts and wall times,
    /// and fail if the outputs differ (block-diffusion models, one prompt).
    #[arg(long, conflicts_with = "prompts")]
    pub(crate) compare: bool,
    #[command(flatten)]
    pub(crate) chat: ChatArgs,
}

impl GenerateArgs {
    /// The prompt ids of a single-prompt run (`--prompt` or `--prompt-ids`).
    pub(crate) fn single_prompt(
        &self,
        dir: &std::path::Path,
        tokenizer: Option<&spot_models::hf::Tokenizer>,
    ) -> Result<Vec<u32>> {
        match (&self.prompt, &self.prompt_ids) {
            (_, Some(ids)) => Ok(ids.clone()),
            (Some(text), None) => {
                self.chat
                    .prompt_ids(self.chat.template(dir)?.as_ref(), tokenizer, text)
            }
            (None, None) => bail!("give --prompt, --prompt-ids or --prompts"),
        }
    }

    /// The prompts of `--prompts FILE` as (id, token ids).
    pub(crate) fn file_prompts(
        &self,
        dir: &std::path::Path,
        tokenizer: Option<&spot_models::hf::Tokenizer>,
        path: &std::path::Path,
    ) -> Result<Vec<(String, Vec<u32>)>> {
        let set = prompts::load_prompts(path, self.field.as_deref(), self.limit)?;
        self.chat.encode_all(dir, tokenizer, &set)
    }
}

/// Runs `spot generate`.
pub fn run(a: &GenerateArgs) -> Result<()> {
    if a.prompts.is_none() && (a.field.is_some() || a.limit.is_some()) {
        bail!("--field and --limit apply to --prompts FILE.jsonl only");
    }
    let dir = model_dir::resolve(a.model.as_deref())?;
    if !Family::detect(&dir)?.is_diffusion() {
        if !a.stop.is_empty() || a.decode.sample_top_k.is_some() || a.compare {
            bail!("--stop, --sample-top-k and --compare apply to block-diffusion models only");
        }
        if a.batch > 1 && (a.prompts.is_none() || a.decode.method != Method::Specdiff) {
            bail!(
                "--batch on an autoregressive model applies to --prompts FILE.jsonl with \
                 --method specdiff"
            );
        }
        return crate::generate::ar::run(a, &dir);
    }
    if a.batch > 1 && a.prompts.is_none() {
        bail!("--batch applies to --prompts FILE.jsonl only");
    }
    let mut model = load(&dir, a.dtype)?;
    model.set_approximate_prefix_cache(a.decode.approx_prefix_cache)?;
    let drafter = crate::methods::load_drafters_at(
        &[a.decode.method],
        &a.decode.files.files(&dir),
        &[a.decode.temperature],
    )?;
    if let Some(path) = &a.prompts {
        return run_file(a, &drafter, &mut model, path);
    }
    let prompt = a.single_prompt(&dir, model.tokenizer())?;
    let cfg = a.decode.config(&model);
    let blocks = prompt
        .len()
        .saturating_add(cfg.max_new_tokens)
        .div_ceil(cfg.block_size.max(1))
        - prompt.len() / cfg.block_size.max(1);
    let bar = if a.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(blocks as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} block {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tokenizer = model.tokenizer().map(|t| (*t).clone());
    let mut streamed = Vec::new();
    let mut printed = 0usize;
    let mut on_block = |p: &BlockProgress<'_>| {
        bar.set_position(p.index as u64 + 1);
        bar.set_message(format!("{} forwards", p.block_forwards));
        if a.json {
            return;
        }
        streamed.extend_from_slice(p.tokens);
        let text = match &tokenizer {
            Some(t) => t.decode(&streamed).unwrap_or_default(),
            None => format!("{:?} ", p.tokens),
        };
        if tokenizer.is_some() {
            if let Some(new) = text.get(printed..) {
                bar.suspend(|| {
                    print!("{new}");
                    let _ = std::io::stdout().flush();
                });
            }
            printed = text.len();
        } else {
            bar.suspend(|| print!("{text}"));
        }
    };
    let stops = stop_strings(a, &model)?;
    let start = Instant::now();
    let out = decode(
        a,
        &drafter,
        &mut model,
        (&prompt, &cfg),
        stops.clone(),
        &mut on_block,
    )?;
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let compared = match a.compare {
        true => Some(compare(
            a,
            &drafter,
            &mut model,
            (&prompt, &cfg),
            stops.clone(),
            &out,
        )?),
        false => None,
    };
    if a.json {
        let mut j = result_json(
            a,
            (model.tokenizer(), stops.as_ref()),
            prompt.len(),
            &out,
            wall,
        )?;
        if let (Some(c), Some(obj)) = (&compared, j.as_object_mut()) {
            obj.insert("compare".into(), c.json());
        }
        println!("{j}");
    } else {
        println!();
        eprintln!(
            "[{} tokens, {} NFE ({} block forwards, {:.2} commits/forward), {:.2} s]",
            out.tokens.len(),
            out.stats.work.nfe,
            out.stats.work.block_forwards,
            out.stats.tokens_per_forward(),
            wall
        );
        if let Some(c) = &compared {
            eprintln!(
                "[compare: {} {} NFE, {:.2} s; {} {} NFE, {:.2} s ({:.2}x fewer forwards); \
                 outputs {}]",
                c.reference.name(),
                c.nfe,
                c.wall,
                a.decode.method.name(),
                out.stats.work.nfe,
                wall,
                c.nfe as f64 / out.stats.work.nfe.max(1) as f64,
                if c.identical { "identical" } else { "DIFFER" },
            );
        }
    }
    if let Some(c) = compared
        && !c.identical
        && !a.decode.method.is_lossy()
    {
        bail!(
            "--compare: {} returned other tokens than {} (a bug: please report it)",
            a.decode.method.name(),
            c.reference.name()
        );
    }
    Ok(())
}

/// The reference decode of `--compare` beside the method's.
struct Compared {
    reference: Method,
    nfe: u64,
    wall: f64,
    identical: bool,
}

impl Compared {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "reference": self.reference.name(), "reference_nfe": self.nfe,
            "reference_wall_s": self.wall, "identical": self.identical,
        })
    }
}

/// `--compare`: the prompt decoded again by the method's reference (draft-free, or threshold
/// decoding for the set methods) under the same configuration.
fn compare(
    a: &GenerateArgs,
    drafters: &Drafters,
    model: &mut DiffusionModel<Backend>,
    (prompt, cfg): (&[u32], &DecodeConfig),
    stops: Option<StopStrings>,
    out: &DecodeOutput,
) -> Result<Compared> {
    let mut reference = a.decode.clone();
    reference.method = match a.decode.method.is_sets() {
        true => Method::Threshold,
        false => Method::Df,
    };
    let start = Instant::now();
    let request = reference.request(drafters, model, (prompt, cfg), stops)?;
    let r = run_request(model, request, &mut ())?;
    Ok(Compared {
        reference: reference.method,
        nfe: r.stats.work.nfe,
        wall: start.elapsed().as_secs_f64(),
        identical: r.tokens == out.tokens,
    })
}

/// Every prompt of a JSONL file: one JSON line each on stdout (in file order), a summary on
/// stderr; `--batch N` decodes N at a time.
fn run_file(
    a: &GenerateArgs,
    drafter: &Drafters,
    model: &mut DiffusionModel<Backend>,
    path: &std::path::Path,
) -> Result<()> {
    let set = a.file_prompts(model.dir(), model.tokenizer(), path)?;
    let cfg = a.decode.config(model);
    let stops = stop_strings(a, model)?;
    let bar = ProgressBar::new(set.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} prompts {msg} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut summary = Summary::default();
    let tokenizer = model.tokenizer().cloned();
    let mut print = |id: &str, prompt_len: usize, out: &DecodeOutput, wall: f64| -> Result<()> {
        let text = (tokenizer.as_ref(), stops.as_ref());
        let mut j = result_json(a, text, prompt_len, out, wall)?;
        if let Some(obj) = j.as_object_mut() {
            obj.insert("id".into(), id.into());
        }
        bar.suspend(|| println!("{j}"));
        summary.add(out);
        bar.inc(1);
        bar.set_message(format!("mean NFE {:.1}", summary.mean_nfe()));
        Ok(())
    };
    let start = Instant::now();
    if a.batch <= 1 {
        for (id, ids) in &set {
            let t0 = Instant::now();
            let out = decode(a, drafter, model, (ids, &cfg), stops.clone(), &mut ())
                .with_context(|| format!("prompt {id}"))?;
            print(id, ids.len(), &out, t0.elapsed().as_secs_f64())?;
        }
    } else {
        let mut driver = BatchDriver::new(a.batch as usize)?;
        for (id, ids) in &set {
            let r = a
                .decode
                .request(drafter, model, (ids, &cfg), stops.clone())
                .with_context(|| format!("prompt {id}"))?;
            driver.submit(r);
        }
        // Lines go out in file order: a result waits for those before it.
        let mut done: Vec<Option<(DecodeOutput, f64)>> = set.iter().map(|_| None).collect();
        let mut next = 0;
        while !driver.is_idle() {
            for f in driver.step(model)? {
                let i = f.id as usize;
                let out = f.output.with_context(|| format!("prompt {}", set[i].0))?;
                done[i] = Some((out, start.elapsed().as_secs_f64()));
            }
            while let Some((out, wall)) = done.get_mut(next).and_then(Option::take) {
                print(&set[next].0, set[next].1.len(), &out, wall)?;
                next += 1;
            }
        }
    }
    bar.finish_and_clear();
    summary.report(&set, path, a.batch, start.elapsed().as_secs_f64());
    Ok(())
}

/// Totals of a `--prompts` run.
#[derive(Default)]
struct Summary {
    n: usize,
    nfe: u64,
    tokens: usize,
    forwards: u64,
}

impl Summary {
    fn add(&mut self, out: &DecodeOutput) {
        self.n += 1;
        self.nfe += out.stats.work.nfe;
        self.tokens += out.tokens.len();
        self.forwards += out.stats.work.block_forwards;
    }

    fn mean_nfe(&self) -> f64 {
        self.nfe as f64 / self.n.max(1) as f64
    }

    fn report(&self, set: &[(String, Vec<u32>)], path: &std::path::Path, batch: u64, wall: f64) {
        let n = set.len().max(1) as f64;
        eprintln!(
            "[{} prompts from {} (batch {batch}): mean NFE {:.2}, mean {:.1} tokens, {:.2} \
             commits/block forward, {:.2} s, {:.1} tokens/s]",
            set.len(),
            path.display(),
            self.nfe as f64 / n,
            self.tokens as f64 / n,
            (self.tokens as f64) / (self.forwards.max(1) as f64),
            wall,
            self.tokens as f64 / wall.max(1e-9),
        );
    }
}

/// `--stop`, compiled against the folder's tokenizer (none without `--stop`).
fn stop_strings(a: &GenerateArgs, model: &DiffusionModel<Backend>) -> Result<Option<StopStrings>> {
    if a.stop.is_empty() {
        return Ok(None);
    }
    let tokenizer = model
        .tokenizer()
        .context("--stop needs tokenizer.json in the model folder")?;
    Ok(Some(StopStrings::new(tokenizer, a.stop.clone())?))
}

fn decode(
    a: &GenerateArgs,
    drafters: &Drafters,
    model: &mut DiffusionModel<Backend>,
    (prompt, cfg): (&[u32], &DecodeConfig),
    stops: Option<StopStrings>,
    on_block: &mut dyn BlockObserver,
) -> Result<DecodeOutput> {
    let request = a.decode.request(drafters, model, (prompt, cfg), stops)?;
    Ok(run_request(model, request, on_block)?)
}

/// The JSON line of one decode; the text through the tokenizer, cut at a stop string.
fn result_json(
    a: &GenerateArgs,
    (tokenizer, stops): (Option<&spot_models::hf::Tokenizer>, Option<&StopStrings>),
    prompt_tokens: usize,
    out: &DecodeOutput,
    wall: f64,
) -> Result<serde_json::Value> {
    let mut text = match tokenizer {
        Some(t) => t.decode(&out.tokens)?,
        None => String::new(),
    };
    if let Some(s) = stops {
        text.truncate(s.cut(&text).len());
    }
    let s = &out.stats;
    Ok(serde_json::json!({
        "method": a.decode.method.name(),
        "prompt_tokens": prompt_tokens,
        "tokens": out.tokens,
        "text": text,
        "stopped": out.stopped,
        "nfe": s.work.nfe,
        "positions_processed": s.work.positions_processed,
        "forwards": s.work.block_forwards,
        "prefix_forwards": s.work.prefix_forwards,
        "states_scored": s.work.states_scored,
        "tokens_per_forward": s.tokens_per_forward(),
        "draft_nodes": s.draft_nodes,
        "accepted_nodes": s.accepted_nodes,
        "wall_s": wall,
    }))
}
