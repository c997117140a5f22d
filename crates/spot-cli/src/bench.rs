//! `spot bench`: every method and budget on prompt sets, side by side in one run, with the
//! draft-free output as the reference every speculative sample must equal.

pub(crate) mod ar;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use spot_dlm::{BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotReport, Transition};

use crate::bench_report::{Cell, Key, Skipped, write_outputs};
use crate::methods::{
    self, BlockEndArgs, DraftFiles, DrafterFileArgs, Expand, Method, Precision, Settings,
};
use crate::{load, model_dir};
use spot_models::Family;

/// Stopping protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Protocol {
    /// The papers' protocol: all `--max-new-tokens`, no early stop.
    Fixed,
    /// Stop after the block holding a stop id.
    Eos,
}

impl Protocol {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Fixed => "fixed",
            Protocol::Eos => "eos",
        }
    }
}

/// The decoder every speculative method must equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Reference {
    /// One commit per forward (`Φ`): the draft-free decoder.
    Exact,
    /// Threshold decoding `Φ^τ` at `--tau` (Fast-dLLM); one-commit draft-free runs beside it
    /// for comparison.
    Threshold,
}

/// Arguments of `spot bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Hugging Face model folder (default: `SPOT_MODEL`, else the shipped target).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dtype: crate::DtypeArg,
    /// JSONL prompt sets (repeat the flag or separate with commas); each is reported apart.
    #[arg(long, required = true, value_delimiter = ',', num_args = 1..)]
    pub(crate) prompts: Vec<PathBuf>,
    /// Field holding the prompt (default: prompt, question, text, input or problem).
    #[arg(long)]
    pub(crate) field: Option<String>,
    /// First N prompts of each set.
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Methods (df always runs: it is the reference). Default: ssd, blockspec, spiffy, mrp,
    /// spot, spot-gamma, oracle (oracle-token and oracle-joint only when named), skipping (with a
    /// note) those whose drafter file the folder lacks; a method named here that cannot run is
    /// an error.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) methods: Option<Vec<Method>>,
    /// Draft budgets D.
    #[arg(long, value_delimiter = ',', default_value = "8,12,16,20")]
    pub(crate) budgets: Vec<usize>,
    /// Temperatures.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1",
        allow_negative_numbers = true
    )]
    pub(crate) temperatures: Vec<f32>,
    /// Stopping protocols.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "fixed,eos")]
    pub(crate) protocols: Vec<Protocol>,
    /// Tokens per sample (the papers use 256).
    #[arg(long, default_value_t = 256)]
    pub(crate) max_new_tokens: usize,
    /// Seed of the coupled noise.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    #[command(flatten)]
    pub(crate) files: DrafterFileArgs,
    /// The reference decoder: `exact` (one commit per forward) or `threshold` (`--tau`).
    #[arg(long, value_enum, default_value_t = Reference::Exact)]
    pub(crate) reference: Reference,
    /// The threshold of `--reference threshold`.
    #[arg(long, default_value_t = 0.9)]
    pub(crate) tau: f32,
    /// With `--reference threshold`: each block in this many steps, SDAR's
    /// `low_confidence_dynamic` schedule (every position above `--tau` when at least the
    /// step's share of the block is, else that many of the most confident).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) steps: Option<u32>,
    /// Mass floor of `spot-gamma`.
    #[arg(long, default_value_t = 0.02)]
    pub(crate) spot_gamma: f32,
    /// Arithmetic of SPOT's order network: `int8` (its encoder's matrix products quantised,
    /// about twice as fast; the tree may differ where positions nearly tie, the output never)
    /// or `f32` (the network as trained).
    /// Several (`f32,int8`): every method that drafts with the order network runs once per
    /// precision, side by side, named `METHOD@PRECISION`.
    #[arg(long, value_delimiter = ',', default_values_t = [methods::DEFAULT_DRAFTER_PRECISION])]
    pub(crate) drafter_precision: Vec<Precision>,
    /// How the token module picks the tokens it writes for SPOT (where the checkpoint drafts
    /// module tokens: T = 0 on the shipped drafter): `shortlist` (the target's rule among each
    /// position's stale top 32; the same token wherever the module's choice is among them) or
    /// `full` (the whole vocabulary through the target's reduction: the module's exact choice).
    #[arg(long, default_value_t = methods::ModuleHead::default())]
    pub(crate) module_head: methods::ModuleHead,
    /// Which nodes each call of a tree's scorer takes: `layers` (every node of a depth that
    /// could still enter the tree), `best-first` (the heaviest not yet scored, as many a call
    /// as the scorer scores in the time of one) or `best-first:K` (K a call). Several
    /// (`layers,best-first`): every method that drafts a tree of commits runs once per
    /// expansion, side by side, named `METHOD@EXPANSION`.
    #[arg(long, value_delimiter = ',', default_values_t = [Expand::default()])]
    pub(crate) expand: Vec<Expand>,
    #[command(flatten)]
    pub(crate) block_ends: BlockEndArgs,
    /// Output folder: bench.md, bench.json, bench.svg and samples.jsonl (one line per decode).
    #[arg(long, default_value = "bench-results")]
    pub(crate) out: PathBuf,
    /// Free-text note stored in the outputs (machine, build).
    #[arg(long, default_value = "")]
    pub(crate) note: String,
    #[command(flatten)]
    pub(crate) chat: crate::prompts::ChatArgs,
    #[command(flatten)]
    pub(crate) ar: crate::bench::ar::ArBenchArgs,
}

/// The methods `spot bench` runs when `--methods` is not given.
pub const DEFAULT_METHODS: [Method; 7] = [
    Method::Ssd,
    Method::Blockspec,
    Method::Spiffy,
    Method::Mrp,
    Method::Spot,
    Method::SpotGamma,
    Method::Oracle,
];

/// The methods `spot bench --reference threshold` runs when `--methods` is not given.
pub const DEFAULT_THRESHOLD_METHODS: [Method; 5] = [
    Method::Blockspec,
    Method::Spiffy,
    Method::Spot,
    Method::Sets,
    Method::SetsStale,
];

/// One speculative method's run: the order network's precision, the tree's expansion, and
/// its name in the results.
#[derive(Clone, Copy, Debug)]
struct Run {
    method: Method,
    precision: Precision,
    expand: Expand,
    name: &'static str,
}

/// Each speculative method with the order network's precision and the tree expansion it runs
/// at, and its name in the results: once per precision (when it drafts with the network) and
/// once per expansion (when it builds a tree of commits), `METHOD@PRECISION`,
/// `METHOD@EXPANSION` or `METHOD@PRECISION@EXPANSION` where the options were given several
/// values; else once, under its own name, at the first of each.
fn variant_runs(spec: &[Method], precisions: &[Precision], expansions: &[Expand]) -> Vec<Run> {
    // Every value when the method takes several, else the first (the default when none).
    fn values<T: Copy + Default>(all: &[T], several: bool) -> Vec<T> {
        match all {
            [] => vec![T::default()],
            _ if several => all.to_vec(),
            [first, ..] => vec![*first],
        }
    }
    let mut runs = Vec::new();
    for &method in spec {
        let several_p = precisions.len() > 1 && method.drafts_with_order_network();
        let several_e = expansions.len() > 1 && method.builds_commit_tree();
        for precision in values(precisions, several_p) {
            for expand in values(expansions, several_e) {
                let name = match (several_p, several_e) {
                    (false, false) => method.name(),
                    // A handful of names per run of the benchmark, kept for its results' keys.
                    (true, false) => format!("{}@{precision}", method.name()).leak(),
                    (false, true) => format!("{}@{expand}", method.name()).leak(),
                    (true, true) => format!("{}@{precision}@{expand}", method.name()).leak(),
                };
                runs.push(Run {
                    method,
                    precision,
                    expand,
                    name,
                });
            }
        }
    }
    runs
}

/// The speculative methods to run and those skipped with the reason: a default method whose
/// drafter file is missing is skipped; one named by `--methods`, or whose file was given with
/// `--drafter` / `--spiffy`, is an error naming the file.
fn runnable(a: &BenchArgs, files: &DraftFiles<'_>) -> Result<(Vec<Method>, Vec<Skipped>)> {
    let explicit = a.methods.is_some();
    let mut spec: Vec<Method> = a
        .methods
        .as_deref()
        .unwrap_or(match a.reference {
            Reference::Exact => &DEFAULT_METHODS,
            Reference::Threshold => &DEFAULT_THRESHOLD_METHODS,
        })
        .iter()
        .copied()
        .filter(|m| m.is_speculative())
        .collect();
    spec.sort();
    spec.dedup();
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for m in spec {
        let Some(why) = files.missing(m) else {
            run.push(m);
            continue;
        };
        if explicit || files.given(m) {
            let asked = match m {
                _ if explicit => "--methods",
                Method::Spiffy => "--spiffy",
                Method::Mrp | Method::MrpTree => "--mrp",
                _ => "--drafter",
            };
            bail!(
                "{asked}: {} cannot run: {why} ({})",
                m.name(),
                methods::missing_hint(m)
            );
        }
        eprintln!("spot bench: skipped {}: {why}", m.name());
        skipped.push(Skipped {
            method: m.name(),
            reason: why,
        });
    }
    Ok((run, skipped))
}

/// Runs `spot bench`.
pub fn run(a: &BenchArgs) -> Result<()> {
    if a.budgets.is_empty() || a.budgets.contains(&0) {
        bail!("--budgets must be positive, got {:?}", a.budgets);
    }
    if let Some(t) = a
        .temperatures
        .iter()
        .find(|t| !(t.is_finite() && **t >= 0.0))
    {
        bail!("--temperatures must be finite and non-negative, got {t}");
    }
    if let Some(m) = a
        .methods
        .iter()
        .flatten()
        .find(|m| **m == Method::Threshold)
    {
        bail!(
            "--methods: {} is not exact (it is not draft-free's output); use --reference threshold --tau TAU to make it the reference",
            m.name()
        );
    }
    let transition = match (a.reference, a.steps) {
        (Reference::Exact, None) => Transition::Exact,
        (Reference::Exact, Some(_)) => bail!("--steps applies to --reference threshold"),
        (Reference::Threshold, None) => Transition::Threshold { tau: a.tau },
        (Reference::Threshold, Some(steps)) => Transition::Scheduled {
            steps,
            tau: Some(a.tau),
        },
    };
    transition.validate()?;
    if let (Reference::Threshold, Some(m)) = (
        a.reference,
        a.methods.iter().flatten().find(|m| m.is_oracle()),
    ) {
        bail!(
            "--methods: {} replays one-commit trajectories; it does not apply to --reference threshold",
            m.name()
        );
    }
    let dir = model_dir::resolve(a.model.as_deref())?;
    if !Family::detect(&dir)?.is_diffusion() {
        return crate::bench::ar::run(a, &dir);
    }
    let files = a.files.files(&dir);
    let (spec, skipped) = runnable(a, &files)?;
    let runs = variant_runs(&spec, &a.drafter_precision, &a.expand);
    let mut model = load(&dir, a.dtype)?;
    let drafters = crate::methods::load_drafters_at(&spec, &files, &a.temperatures)?;
    let tokenizer = model
        .tokenizer()
        .context("spot bench needs tokenizer.json in the model folder")?
        .clone();
    let sets = a.chat.encode_sets(
        &a.prompts,
        (a.field.as_deref(), a.limit),
        &dir,
        Some(&tokenizer),
    )?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let samples_path = a.out.join("samples.jsonl");
    let mut samples = std::fs::File::create(&samples_path)
        .with_context(|| format!("creating {}", samples_path.display()))?;
    let reference_method = match a.reference {
        Reference::Exact => Method::Df,
        Reference::Threshold => Method::Threshold,
    };
    let per_prompt =
        1 + usize::from(a.reference == Reference::Threshold) + runs.len() * a.budgets.len();
    let total: usize = sets.iter().map(|(_, s)| s.len()).sum::<usize>()
        * a.temperatures.len()
        * a.protocols.len()
        * per_prompt;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} decodes {msg} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // The model's block size, stop ids and block layout.
    let base = DecodeConfig::for_model(model.info());
    let mut cells: BTreeMap<Key, Cell> = BTreeMap::new();
    let mut mismatches = 0usize;
    for (set, prompts) in &sets {
        for &temperature in &a.temperatures {
            for &protocol in &a.protocols {
                let cfg = DecodeConfig {
                    max_new_tokens: a.max_new_tokens,
                    temperature,
                    seed: a.seed,
                    transition,
                    early_stop: protocol == Protocol::Eos,
                    ..base.clone()
                };
                for (id, ids) in prompts {
                    let key = |method: &'static str, budget: Option<usize>| Key {
                        set: set.clone(),
                        temperature: temperature.to_string(),
                        protocol: protocol.name(),
                        method,
                        budget,
                    };
                    bar.set_message(format!("{set} T={temperature} {} {id} df", protocol.name()));
                    let start = std::time::Instant::now();
                    let reference = DraftFreeDecoder::new()
                        .with_trace(true)
                        .decode(&mut model, ids, &cfg)
                        .with_context(|| format!("{set} {id}: draft-free"))?;
                    let wall = start.elapsed().as_secs_f64();
                    let trace = reference
                        .trace
                        .as_ref()
                        .context("draft-free decode returned no trace")?;
                    let k = key(reference_method.name(), None);
                    let row = cells
                        .entry(k.clone())
                        .or_default()
                        .add(&k, id, &reference, wall, true, None);
                    writeln!(samples, "{row}")?;
                    bar.inc(1);
                    if a.reference == Reference::Threshold {
                        // One-commit draft-free beside it: a decoder of its own, not equal.
                        let one = DecodeConfig {
                            transition: Transition::Exact,
                            ..cfg.clone()
                        };
                        let start = std::time::Instant::now();
                        let df = DraftFreeDecoder::new()
                            .decode(&mut model, ids, &one)
                            .with_context(|| format!("{set} {id}: draft-free"))?;
                        let wall = start.elapsed().as_secs_f64();
                        let equal = df.tokens == reference.tokens;
                        let k = key(Method::Df.name(), None);
                        let row = cells
                            .entry(k.clone())
                            .or_default()
                            .add(&k, id, &df, wall, equal, None);
                        writeln!(samples, "{row}")?;
                        bar.inc(1);
                    }
                    for &Run {
                        method: m,
                        precision,
                        expand,
                        name,
                    } in &runs
                    {
                        for &budget in &a.budgets {
                            bar.set_message(format!(
                                "{set} T={temperature} {} {id} {name} D={budget}",
                                protocol.name(),
                            ));
                            let settings = Settings {
                                budget,
                                gamma: 0.0,
                                spot_gamma: a.spot_gamma,
                                block_ends: a.block_ends.into(),
                                drafter_precision: precision,
                                module_head: a.module_head,
                                expand,
                            };
                            let r = methods::run(
                                m,
                                settings,
                                &drafters,
                                &mut model,
                                ids,
                                &cfg,
                                Some(trace),
                                &mut (),
                            )
                            .with_context(|| format!("{set} {id}: {name} D={budget}"))?;
                            let equal = r.out.tokens == reference.tokens
                                && r.out.stopped == reference.stopped;
                            if !equal && !m.is_lossy() {
                                mismatches += 1;
                                bar.suspend(|| eprintln!("MISMATCH: {set} {id} T={temperature} {} {name} D={budget} differs from {}", protocol.name(), reference_method.name()));
                            }
                            let k = key(name, Some(budget));
                            let report: Option<&SpotReport> = r.report.as_ref();
                            let row = cells
                                .entry(k.clone())
                                .or_default()
                                .add(&k, id, &r.out, r.wall, equal, report);
                            writeln!(samples, "{row}")?;
                            bar.inc(1);
                        }
                    }
                }
                write_outputs(&a.out, &cells, &a.note, &dir, a.max_new_tokens, &skipped)?;
            }
        }
    }
    bar.finish_and_clear();
    write_outputs(&a.out, &cells, &a.note, &dir, a.max_new_tokens, &skipped)?;
    eprintln!(
        "wrote {}/bench.md, bench.json, bench.svg and samples.jsonl",
        a.out.display()
    );
    if mismatches > 0 {
        bail!(
            "{mismatches} speculative decodes differ from draft-free (see samples.jsonl: \"equal\": false)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several precisions or expansions multiply only the methods they apply to, named by
    /// the options that took several values.
    #[test]
    fn variants_multiply_the_methods_they_apply_to() {
        let bf = Expand::BestFirst { batch: None };
        let names = |p: &[Precision], e: &[Expand]| -> Vec<&str> {
            let spec = [Method::Spiffy, Method::Spot, Method::SetsNet, Method::Ssd];
            variant_runs(&spec, p, e).iter().map(|r| r.name).collect()
        };
        assert_eq!(
            names(&[Precision::Int8], &[Expand::Layers]),
            ["spiffy", "spot", "sets-net", "ssd"]
        );
        assert_eq!(
            names(&[Precision::Int8], &[Expand::Layers, bf]),
            [
                "spiffy@layers",
                "spiffy@best-first",
                "spot@layers",
                "spot@best-first",
                "sets-net",
                "ssd"
            ]
        );
        assert_eq!(
            names(&[Precision::F32, Precision::Int8], &[bf, Expand::Layers]),
            [
                "spiffy@best-first",
                "spiffy@layers",
                "spot@f32@best-first",
                "spot@f32@layers",
                "spot@int8@best-first",
                "spot@int8@layers",
                "sets-net@f32",
                "sets-net@int8",
                "ssd"
            ]
        );
        let runs = variant_runs(&[Method::Ssd], &[Precision::Int8], &[bf, Expand::Layers]);
        assert_eq!((runs.len(), runs[0].expand), (1, bf));
    }
}
