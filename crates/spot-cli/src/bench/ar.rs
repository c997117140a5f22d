//! `spot bench` on an autoregressive folder (Llama, Qwen2): token-by-token decoding (`ar`, the
//! reference every SpecDiff-2 decode must equal) and a grid of SpecDiff-2 configurations
//! (drafter × K × γ × selection) side by side, on the same prompts in one run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use spot_dlm::{ArConfig, AutoregressiveModel, decode_autoregressive};
use spot_specdiff::{
    Acceptance, DiffusionDrafter, Pace, SpecDiffConfig, SpecDiffDecoder, SpecDiffReport,
};

use crate::bench::{BenchArgs, Protocol, Reference};
use crate::generate::ar::{
    AcceptanceArg, DEFAULT_LOOKUP_STORE, DEFAULT_SPECDIFF_DRAFTER, SelectionArg, drafter,
};
use crate::methods::Method;

/// The SpecDiff-2 grid of `spot bench` on an autoregressive folder.
#[derive(clap::Args, Clone, Debug)]
pub struct ArBenchArgs {
    /// Autoregressive folders: SpecDiff-2 drafters, each a column (`lookup`, a lookup store
    /// file or a drafter folder; default: the folder's `specdiff-drafter/` and
    /// `specdiff-lookup.jsonl` when present, and `lookup`).
    #[arg(long, value_delimiter = ',')]
    specdiff_drafters: Vec<PathBuf>,
    /// Autoregressive folders: drafts per round K, each a configuration (1 to 8). With none
    /// of `--k`, `--draft-tokens`, `--min-draft-prob` and `--drafter-temperature`, each
    /// drafter runs once, with its own recommended settings (what `spot generate` uses);
    /// with any of them, the grid (defaults K 1,8, γ 16, floor 0, temperature 1.5).
    #[arg(long = "k", value_delimiter = ',')]
    ks: Vec<usize>,
    /// Autoregressive folders: drafted tokens per round γ, each a configuration (1 to 32).
    #[arg(long = "draft-tokens", value_delimiter = ',')]
    gammas: Vec<usize>,
    /// Autoregressive folders: branch selections, each a configuration.
    #[arg(
        long = "selection",
        value_enum,
        value_delimiter = ',',
        default_value = "longest"
    )]
    selections: Vec<SelectionArg>,
    /// Autoregressive folders: the drafter's sampling temperature.
    #[arg(long)]
    drafter_temperature: Option<f32>,
    /// Autoregressive folders: adaptive draft length floors, each a configuration (0: always
    /// γ tokens; see `spot generate --min-draft-prob`).
    #[arg(long = "min-draft-prob", value_delimiter = ',')]
    floors: Vec<f32>,
    /// Autoregressive folders: acceptance rules, each a configuration. `classic` (`min(1, p/q)`,
    /// distribution-preserving, not token-identical) runs with K = 1 only; its decodes are
    /// not required to equal `ar` (the equal column then counts the identical ones).
    #[arg(
        long = "acceptance",
        value_enum,
        value_delimiter = ',',
        default_value = "coupled"
    )]
    acceptances: Vec<AcceptanceArg>,
    /// Autoregressive folders, with each drafter's recommended settings: also run each
    /// drafter that paces its drafting (`spot_specdiff::Pace`) with its pace off, a column
    /// labelled `no pace`.
    #[arg(long)]
    pace_ablation: bool,
    /// Autoregressive folders, with each drafter's recommended settings: run each drafter
    /// that paces its drafting once per pace named here instead of once with its own, a
    /// column each: `off`, `cpu` or `ROW_COST:DRAFT_COST[:WEIGHT[:PROBE_EVERY]]` (see
    /// `spot generate --pace`).
    #[arg(long = "paces", value_delimiter = ',')]
    paces: Vec<PaceArg>,
}

/// A pace on the command line: `off` or a [`Pace`].
#[derive(Clone, Copy, Debug)]
struct PaceArg(Option<Pace>);

impl std::str::FromStr for PaceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(Self(None));
        }
        s.parse()
            .map(|p| Self(Some(p)))
            .map_err(|e: <Pace as std::str::FromStr>::Err| e.to_string())
    }
}

/// One SpecDiff-2 configuration of the grid.
struct Config {
    label: String,
    drafter: usize,
    cfg: SpecDiffConfig,
}

impl Config {
    /// Whether this configuration's decodes must equal `ar`'s (the coupled rule).
    fn exact(&self) -> bool {
        self.cfg.acceptance == Acceptance::Coupled
    }
}

/// Sums over the decodes of one configuration in one (set, temperature, protocol) group.
#[derive(Default)]
struct ArCell {
    label: String,
    /// Whether the decodes must equal `ar`'s (false for the classic rule).
    exact: bool,
    n: u64,
    equal: u64,
    nfe: u64,
    tokens: u64,
    wall: f64,
    speedups: Vec<f64>,
    report: Option<SpecDiffReport>,
}

impl ArCell {
    fn add(&mut self, tokens: usize, nfe: u64, wall: f64, ref_wall: f64, equal: bool) {
        self.n += 1;
        self.equal += u64::from(equal);
        self.nfe += nfe;
        self.tokens += tokens as u64;
        self.wall += wall;
        self.speedups.push(ref_wall / wall.max(f64::MIN_POSITIVE));
    }

    fn merge(&mut self, r: &SpecDiffReport) {
        self.report
            .get_or_insert_with(SpecDiffReport::default)
            .merge(r);
    }

    fn summary(&self, ref_nfe: f64) -> serde_json::Value {
        let n = self.n.max(1) as f64;
        let nfe = self.nfe as f64 / n;
        let mut s = self.speedups.clone();
        s.sort_by(f64::total_cmp);
        let median = match s.len() {
            0 => f64::NAN,
            k if k % 2 == 1 => s[k / 2],
            k => (s[k / 2 - 1] + s[k / 2]) / 2.0,
        };
        serde_json::json!({
            "method": self.label, "samples": self.n, "equal": self.equal,
            "must_equal": self.exact, "mean_nfe": nfe,
            "nfe_reduction": ref_nfe / nfe.max(f64::MIN_POSITIVE),
            "tokens_per_forward": self.tokens as f64 / self.nfe.max(1) as f64,
            "tokens_per_round": self.report.as_ref().map(SpecDiffReport::tokens_per_round),
            "accepted_histogram": self.report.as_ref().map(|r| r.accepted.clone()),
            "mean_wall_s": self.wall / n, "median_speedup": median,
            "draft_share": self.report.as_ref().map(SpecDiffReport::draft_share),
        })
    }
}

type Group = (String, String, &'static str);

/// Runs `spot bench` on the autoregressive folder `dir`.
pub fn run(a: &BenchArgs, dir: &Path) -> Result<()> {
    if a.reference != Reference::Exact {
        bail!(
            "{} is an autoregressive model: --reference threshold applies to block-diffusion models",
            dir.display()
        );
    }
    let methods = a
        .methods
        .clone()
        .unwrap_or(vec![Method::Df, Method::Specdiff]);
    if let Some(m) = methods
        .iter()
        .find(|m| !matches!(m, Method::Df | Method::Specdiff))
    {
        bail!(
            "--methods: {} needs a block-diffusion model; {} is autoregressive (df, specdiff)",
            m.name(),
            dir.display()
        );
    }
    let g = &a.ar;
    // No grid named: each drafter's own settings; else the grid with its defaults.
    let recommended = g.ks.is_empty()
        && g.gammas.is_empty()
        && g.floors.is_empty()
        && g.drafter_temperature.is_none();
    let mut g = g.clone();
    if g.ks.is_empty() {
        g.ks = vec![1, 8];
    }
    if g.gammas.is_empty() {
        g.gammas = vec![16];
    }
    if g.floors.is_empty() {
        g.floors = vec![0.0];
    }
    let g = &g;
    if let Some(k) = g.ks.iter().find(|k| !(1..=8).contains(*k)) {
        bail!("--k must be in [1, 8], got {k}");
    }
    if let Some(n) = g.gammas.iter().find(|n| !(1..=32).contains(*n)) {
        bail!("--draft-tokens must be in [1, 32], got {n}");
    }
    if g.acceptances.contains(&AcceptanceArg::Classic) && !g.ks.contains(&1) {
        bail!("--acceptance classic runs with one draft: add 1 to --k");
    }
    let mut model = crate::generate::ar::load_target(dir, a.dtype)?;
    let choices: Vec<PathBuf> = if g.specdiff_drafters.is_empty() {
        let own = dir.join(DEFAULT_SPECDIFF_DRAFTER);
        let own = own
            .join(spot_specdiff::DRAFTER_FILE)
            .is_file()
            .then_some(own);
        let store = dir.join(DEFAULT_LOOKUP_STORE);
        let store = store.is_file().then_some(store);
        own.into_iter()
            .chain(store)
            .chain([PathBuf::from("lookup")])
            .collect()
    } else {
        g.specdiff_drafters.clone()
    };
    let mut drafters: Vec<Box<dyn DiffusionDrafter>> = Vec::new();
    let mut names = Vec::new();
    if methods.contains(&Method::Specdiff) {
        for c in &choices {
            drafters.push(drafter(Some(c), dir, &mut model)?);
            names.push(c.file_name().map_or(c.display().to_string(), |f| {
                f.to_string_lossy().into_owned()
            }));
        }
    }
    let mut configs = Vec::new();
    let rules = g
        .acceptances
        .iter()
        .flat_map(|&rule| g.ks.iter().map(move |&k| (rule, k)))
        .filter(|&(rule, k)| rule == AcceptanceArg::Coupled || k == 1);
    for (d, name) in names.iter().enumerate() {
        if recommended {
            let cfg = SpecDiffConfig {
                draft_seed: a.seed,
                ..drafters[d].recommended()
            };
            let floor = if cfg.min_draft_prob > 0.0 {
                format!(" p>={}", cfg.min_draft_prob)
            } else {
                String::new()
            };
            let label = format!("specdiff {name} K={} γ={}{floor}", cfg.k, cfg.gamma);
            if cfg.pace.is_some() && !g.paces.is_empty() {
                for p in &g.paces {
                    let name = p.0.map_or("off".to_string(), |p| p.to_string());
                    configs.push(Config {
                        label: format!("{label} pace {name}"),
                        drafter: d,
                        cfg: SpecDiffConfig { pace: p.0, ..cfg },
                    });
                }
                continue;
            }
            if g.pace_ablation && cfg.pace.is_some() {
                configs.push(Config {
                    label: format!("{label} no pace"),
                    drafter: d,
                    cfg: SpecDiffConfig { pace: None, ..cfg },
                });
            }
            configs.push(Config {
                label: format!("{label} (its default)"),
                drafter: d,
                cfg,
            });
            continue;
        }
        for (rule, k) in rules.clone() {
            for &gamma in &g.gammas {
                for (&sel, &floor) in g
                    .selections
                    .iter()
                    .flat_map(|s| g.floors.iter().map(move |f| (s, f)))
                {
                    let cfg = SpecDiffConfig {
                        k,
                        gamma,
                        drafter_temperature: g.drafter_temperature.unwrap_or(1.5),
                        selection: sel.selection(),
                        draft_seed: a.seed,
                        min_draft_prob: floor,
                        acceptance: rule.acceptance(),
                        ..SpecDiffConfig::default()
                    };
                    cfg.validate()
                        .context("--drafter-temperature / --min-draft-prob")?;
                    let adaptive = if floor > 0.0 {
                        format!(" p>={floor}")
                    } else {
                        String::new()
                    };
                    let classic = if rule == AcceptanceArg::Classic {
                        " classic"
                    } else {
                        ""
                    };
                    configs.push(Config {
                        label: format!(
                            "specdiff {name} K={k} γ={gamma} {}{adaptive}{classic}",
                            sel.name()
                        ),
                        drafter: d,
                        cfg,
                    });
                }
            }
        }
    }
    let sets = a.chat.encode_sets(
        &a.prompts,
        (a.field.as_deref(), a.limit),
        dir,
        model.tokenizer(),
    )?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let samples_path = a.out.join("samples.jsonl");
    let mut samples = std::fs::File::create(&samples_path)
        .with_context(|| format!("creating {}", samples_path.display()))?;
    let total = sets.iter().map(|(_, s)| s.len()).sum::<usize>()
        * a.temperatures.len()
        * a.protocols.len()
        * (1 + configs.len());
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} decodes {msg} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut groups: BTreeMap<Group, Vec<ArCell>> = BTreeMap::new();
    let mut mismatches = 0usize;
    for (set, prompts) in &sets {
        for &temperature in &a.temperatures {
            for &protocol in &a.protocols {
                let cfg = ArConfig {
                    max_new_tokens: a.max_new_tokens,
                    temperature,
                    seed: a.seed,
                    stop_ids: model.ar_info().stop_ids.clone(),
                    early_stop: protocol == Protocol::Eos,
                };
                let group = (set.clone(), temperature.to_string(), protocol.name());
                let cells = groups.entry(group).or_insert_with(|| {
                    std::iter::once(("ar".to_string(), true))
                        .chain(configs.iter().map(|c| (c.label.clone(), c.exact())))
                        .map(|(label, exact)| ArCell {
                            label,
                            exact,
                            ..ArCell::default()
                        })
                        .collect()
                });
                for (id, ids) in prompts {
                    let line = |label: &str, j: serde_json::Value, equal: bool| {
                        let mut j = j;
                        if let Some(o) = j.as_object_mut() {
                            o.insert("set".into(), set.clone().into());
                            o.insert("id".into(), id.clone().into());
                            o.insert("temperature".into(), temperature.into());
                            o.insert("protocol".into(), protocol.name().into());
                            o.insert("method".into(), label.into());
                            o.insert("equal".into(), equal.into());
                            o.remove("text");
                        }
                        j
                    };
                    bar.set_message(format!("{set} T={temperature} {} {id} ar", protocol.name()));
                    let start = Instant::now();
                    let reference = decode_autoregressive(&mut model, ids, &cfg)
                        .with_context(|| format!("{set} {id}: ar"))?;
                    let ref_wall = start.elapsed().as_secs_f64();
                    cells[0].add(
                        reference.tokens.len(),
                        reference.forwards,
                        ref_wall,
                        ref_wall,
                        true,
                    );
                    let j =
                        crate::generate::ar::result_json("", ids, &reference, "", ref_wall, None);
                    writeln!(samples, "{}", line("ar", j, true))?;
                    bar.inc(1);
                    for (c, cell) in configs.iter().zip(&mut cells[1..]) {
                        bar.set_message(format!(
                            "{set} T={temperature} {} {id} {}",
                            protocol.name(),
                            c.label
                        ));
                        let start = Instant::now();
                        let out = SpecDiffDecoder::new(c.cfg)?
                            .decode(&mut model, drafters[c.drafter].as_mut(), ids, &cfg)
                            .with_context(|| format!("{set} {id}: {}", c.label))?;
                        let wall = start.elapsed().as_secs_f64();
                        let equal =
                            out.tokens == reference.tokens && out.stopped == reference.stopped;
                        if !equal && c.exact() {
                            mismatches += 1;
                            bar.suspend(|| {
                                eprintln!(
                                    "MISMATCH: {set} {id} T={temperature} {} {} differs from ar",
                                    protocol.name(),
                                    c.label
                                )
                            });
                        }
                        cell.add(out.tokens.len(), out.forwards, wall, ref_wall, equal);
                        cell.merge(&out.report);
                        let as_ar = spot_dlm::ArOutput {
                            tokens: out.tokens,
                            stopped: out.stopped,
                            forwards: out.forwards,
                        };
                        let j = crate::generate::ar::result_json(
                            "",
                            ids,
                            &as_ar,
                            "",
                            wall,
                            Some(&out.report),
                        );
                        writeln!(samples, "{}", line(&c.label, j, equal))?;
                        bar.inc(1);
                    }
                }
                write_outputs(a, dir, &groups)?;
            }
        }
    }
    bar.finish_and_clear();
    write_outputs(a, dir, &groups)?;
    eprintln!(
        "wrote {}/bench.md, bench.json and samples.jsonl",
        a.out.display()
    );
    if mismatches > 0 {
        bail!(
            "{mismatches} SpecDiff-2 decodes differ from autoregressive decoding (see samples.jsonl: \"equal\": false)"
        );
    }
    Ok(())
}

/// Writes bench.json and bench.md.
fn write_outputs(a: &BenchArgs, dir: &Path, groups: &BTreeMap<Group, Vec<ArCell>>) -> Result<()> {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# spot bench (autoregressive target)\n\nModel `{}`, {} new tokens, seed {}. {}\n",
        dir.display(),
        a.max_new_tokens,
        a.seed,
        a.note
    );
    let mut json_groups = Vec::new();
    for ((set, t, protocol), cells) in groups {
        let ref_nfe = cells
            .first()
            .map_or(f64::NAN, |c| c.nfe as f64 / c.n.max(1) as f64);
        let rows: Vec<serde_json::Value> = cells.iter().map(|c| c.summary(ref_nfe)).collect();
        let _ = writeln!(
            md,
            "## {set}, T = {t}, {protocol} protocol\n\n| method | equal | mean NFE | x fewer | tokens/forward | tokens/round | mean wall s | median speed-up | draft share |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in &rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            let opt = |k: &str, scale: f64, unit: &str| {
                r[k].as_f64()
                    .map_or("-".into(), |v| format!("{:.2}{unit}", v * scale))
            };
            let _ = writeln!(
                md,
                "| {} | {}/{}{} | {:.1} | {:.2}x | {:.2} | {} | {:.2} | {:.2}x | {} |",
                r["method"].as_str().unwrap_or(""),
                r["equal"],
                r["samples"],
                if r["must_equal"].as_bool() == Some(false) {
                    " (not required)"
                } else {
                    ""
                },
                f("mean_nfe"),
                f("nfe_reduction"),
                f("tokens_per_forward"),
                opt("tokens_per_round", 1.0, ""),
                f("mean_wall_s"),
                f("median_speedup"),
                opt("draft_share", 100.0, "%"),
            );
        }
        let _ = writeln!(md);
        json_groups.push(serde_json::json!({
            "set": set, "temperature": t, "protocol": protocol, "rows": rows,
        }));
    }
    let json = serde_json::json!({
        "model": dir.display().to_string(), "kind": "autoregressive",
        "max_new_tokens": a.max_new_tokens, "seed": a.seed, "note": a.note,
        "groups": json_groups,
    });
    let write = |name: &str, text: String| -> Result<()> {
        let p = a.out.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("bench.json", serde_json::to_string_pretty(&json)? + "\n")?;
    write("bench.md", md)
}
