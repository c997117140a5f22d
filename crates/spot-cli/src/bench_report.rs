//! Aggregation and rendering of `spot bench` results: Markdown tables, JSON and an SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use spot_dlm::{DecodeOutput, SpotReport};

/// One configuration of the benchmark grid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Prompt set (file stem).
    pub set: String,
    /// Temperature as written.
    pub temperature: String,
    /// Stopping protocol.
    pub protocol: &'static str,
    /// Method name.
    pub method: &'static str,
    /// Budget (speculative methods).
    pub budget: Option<usize>,
}

/// A method `spot bench` did not run, and why (e.g. `no spot-drafter.safetensors in DIR`).
#[derive(Clone, Debug)]
pub struct Skipped {
    /// Method name.
    pub method: &'static str,
    /// Why.
    pub reason: String,
}

/// Sums over the samples of one [`Key`].
#[derive(Clone, Debug, Default)]
pub struct Cell {
    n: u64,
    equal: u64,
    nfe: u64,
    prefetched: u64,
    refreshed: u64,
    positions: u64,
    committed: u64,
    generated: u64,
    wall: f64,
    report: SpotReport,
}

impl Cell {
    /// Adds one decode; returns its JSON line for samples.jsonl.
    pub fn add(
        &mut self,
        key: &Key,
        id: &str,
        out: &DecodeOutput,
        wall: f64,
        equal: bool,
        report: Option<&SpotReport>,
    ) -> serde_json::Value {
        let s = &out.stats;
        self.n += 1;
        self.equal += u64::from(equal);
        self.nfe += s.work.nfe;
        self.prefetched += s.prefetched_forwards;
        self.refreshed += s.refreshed_blocks;
        self.positions += s.work.positions_processed;
        self.committed += s.committed;
        self.generated += out.generated.len() as u64;
        self.wall += wall;
        let mut row = serde_json::json!({
            "set": key.set, "id": id, "temperature": key.temperature, "protocol": key.protocol,
            "method": key.method, "budget": key.budget, "equal": equal, "nfe": s.work.nfe,
            "positions_processed": s.work.positions_processed, "committed": s.committed,
            "generated": out.generated.len(), "stopped": out.stopped, "wall_s": wall,
            "prefetched_forwards": s.prefetched_forwards,
            "refreshed_blocks": s.refreshed_blocks, "tokens": &out.generated,
        });
        if let (Some(r), Some(obj)) = (report, row.as_object_mut()) {
            self.report.merge(r);
            obj.insert("rounds".into(), r.rounds.into());
            obj.insert("accepted_histogram".into(), r.accepted.clone().into());
            obj.insert("draft_s".into(), r.draft_time.as_secs_f64().into());
            obj.insert("verify_s".into(), r.verify_time.as_secs_f64().into());
            obj.insert(
                "round_ends".into(),
                serde_json::json!({"complete": r.complete, "leaf": r.leaf,
                    "position_miss": r.position_miss, "token_miss": r.token_miss}),
            );
        }
        row
    }

    fn mean(&self, total: f64) -> f64 {
        total / self.n.max(1) as f64
    }

    fn summary(&self, key: &Key, df_nfe: Option<f64>) -> serde_json::Value {
        let nfe = self.mean(self.nfe as f64);
        let r = &self.report;
        let ends = (r.leaf + r.position_miss + r.token_miss).max(1) as f64;
        serde_json::json!({
            "set": key.set, "temperature": key.temperature, "protocol": key.protocol,
            "method": key.method, "budget": key.budget,
            "samples": self.n, "equal": self.equal,
            "mean_nfe": nfe,
            "mean_prefetched_forwards": self.mean(self.prefetched as f64),
            "mean_refreshed_blocks": self.mean(self.refreshed as f64),
            "nfe_reduction": df_nfe.map(|d| d / nfe.max(f64::MIN_POSITIVE)),
            "mean_positions_processed": self.mean(self.positions as f64),
            "commits_per_forward": self.committed as f64 / self.nfe.max(1) as f64,
            "mean_generated": self.mean(self.generated as f64),
            "mean_wall_s": self.mean(self.wall),
            "rounds": r.rounds,
            "mean_accepted_per_round": r.mean_accepted(),
            "accepted_histogram": r.accepted,
            "draft_share": r.draft_share(),
            "draft_ms_median": r.draft_quantile(0.5).as_secs_f64() * 1e3,
            "draft_ms_p95": r.draft_quantile(0.95).as_secs_f64() * 1e3,
            "scored_nodes_per_tree": r.drafter.scored_nodes as f64 / r.drafter.trees.max(1) as f64,
            "scorer_calls_per_tree": r.drafter.scorer_calls as f64 / r.drafter.trees.max(1) as f64,
            "hypothesis_positions_per_tree":
                r.drafter.hypothesis_positions as f64 / r.drafter.trees.max(1) as f64,
            "round_ends": {"complete": r.complete, "leaf": r.leaf as f64 / ends,
                "position_miss": r.position_miss as f64 / ends, "token_miss": r.token_miss as f64 / ends},
        })
    }
}

type Group = (String, String, &'static str);

fn groups(cells: &BTreeMap<Key, Cell>) -> BTreeMap<Group, Vec<(&Key, &Cell)>> {
    let mut g: BTreeMap<Group, Vec<(&Key, &Cell)>> = BTreeMap::new();
    for (k, c) in cells {
        g.entry((k.set.clone(), k.temperature.clone(), k.protocol))
            .or_default()
            .push((k, c));
    }
    g
}

/// Writes bench.json, bench.md and bench.svg into `dir`; `skipped`: the default methods the
/// model folder could not run.
pub fn write_outputs(
    dir: &Path,
    cells: &BTreeMap<Key, Cell>,
    note: &str,
    model: &Path,
    max_new_tokens: usize,
    skipped: &[Skipped],
) -> Result<()> {
    let mut json_groups = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# spot bench\n\nModel `{}`, {max_new_tokens} new tokens. {note}\n",
        model.display()
    );
    if !skipped.is_empty() {
        let list: Vec<String> = skipped
            .iter()
            .map(|s| format!("`{}` ({})", s.method, s.reason))
            .collect();
        let _ = writeln!(md, "Skipped: {}.\n", list.join("; "));
    }
    for ((set, t, protocol), mut rows) in groups(cells) {
        rows.sort_by_key(|(k, _)| (method_rank(k.method), k.budget));
        // The reference: threshold decoding under `--reference threshold`, else draft-free.
        let df = ["threshold", "df"]
            .iter()
            .find_map(|m| rows.iter().find(|(k, _)| k.method == *m))
            .map(|(_, c)| c.mean(c.nfe as f64));
        let summaries: Vec<serde_json::Value> =
            rows.iter().map(|(k, c)| c.summary(k, df)).collect();
        let _ = writeln!(
            md,
            "## {set}, T = {t}, {protocol} protocol\n\n| method | D | equal | mean NFE | x fewer | positions | commits/forward | accepted/round | leaf / position / token ends | draft share | draft ms / round (median, p95) | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for s in &summaries {
            let f = |name: &str| s[name].as_f64().unwrap_or(f64::NAN);
            let ends = &s["round_ends"];
            let e = |name: &str| ends[name].as_f64().unwrap_or(0.0) * 100.0;
            let spec = s["budget"].is_u64();
            let _ = writeln!(
                md,
                "| {} | {} | {}/{} | {:.2} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {:.2} |",
                s["method"].as_str().unwrap_or(""),
                s["budget"].as_u64().map_or("-".into(), |b| b.to_string()),
                s["equal"],
                s["samples"],
                f("mean_nfe"),
                s["nfe_reduction"]
                    .as_f64()
                    .map_or("-".into(), |r| format!("{r:.2}x")),
                f("mean_positions_processed"),
                f("commits_per_forward"),
                if spec {
                    format!("{:.2}", f("mean_accepted_per_round"))
                } else {
                    "-".into()
                },
                if spec {
                    format!(
                        "{:.0}% / {:.0}% / {:.0}%",
                        e("leaf"),
                        e("position_miss"),
                        e("token_miss")
                    )
                } else {
                    "-".into()
                },
                if spec {
                    format!("{:.1}%", f("draft_share") * 100.0)
                } else {
                    "-".into()
                },
                if spec {
                    format!("{:.2}, {:.2}", f("draft_ms_median"), f("draft_ms_p95"))
                } else {
                    "-".into()
                },
                f("mean_wall_s"),
            );
        }
        let _ = writeln!(md);
        json_groups.push(serde_json::json!({
            "set": set, "temperature": t, "protocol": protocol, "rows": summaries,
        }));
    }
    let skipped: Vec<serde_json::Value> = skipped
        .iter()
        .map(|s| serde_json::json!({"method": s.method, "reason": s.reason}))
        .collect();
    let json = serde_json::json!({
        "model": model.display().to_string(), "max_new_tokens": max_new_tokens, "note": note,
        "skipped": skipped, "groups": json_groups,
    });
    let write = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("bench.json", serde_json::to_string_pretty(&json)? + "\n")?;
    write("bench.md", md)?;
    write("bench.svg", svg(cells))?;
    Ok(())
}

const COLORS: [(&str, &str); 15] = [
    ("df", "#444444"),
    ("ssd", "#1f77b4"),
    ("blockspec", "#ff7f0e"),
    ("spiffy", "#9467bd"),
    ("spot", "#d62728"),
    ("spot-gamma", "#e377c2"),
    ("spot-adaptive", "#bcbd22"),
    ("oracle", "#2ca02c"),
    ("oracle-token", "#17becf"),
    ("oracle-joint", "#bcbd22"),
    ("threshold", "#8c564b"),
    ("sets-stale", "#7f7f7f"),
    ("sets", "#e6550d"),
    ("sets-gamma", "#fd8d3c"),
    ("sets-adaptive", "#a63603"),
];

/// Display order: draft-free, the baselines, SPOT, the oracle (the order of [`COLORS`]).
fn method_rank(method: &str) -> usize {
    COLORS
        .iter()
        .position(|(m, _)| *m == method)
        .unwrap_or(COLORS.len())
}

fn color(method: &str) -> &'static str {
    COLORS
        .iter()
        .find(|(m, _)| *m == method)
        .map_or("#000000", |(_, c)| c)
}

/// Mean NFE against budget, one panel per (set, temperature, protocol), one line per method;
/// draft-free as a dashed horizontal line.
fn svg(cells: &BTreeMap<Key, Cell>) -> String {
    let groups = groups(cells);
    let (pw, ph, margin) = (420.0, 300.0, 50.0);
    let cols = groups.len().clamp(1, 2);
    let rows = groups.len().div_ceil(cols).max(1);
    let (w, h) = (pw * cols as f64, ph * rows as f64 + 30.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (gi, ((set, t, protocol), rows_)) in groups.iter().enumerate() {
        let (ox, oy) = ((gi % cols) as f64 * pw, (gi / cols) as f64 * ph);
        let budgets: Vec<usize> = {
            let mut b: Vec<usize> = rows_.iter().filter_map(|(k, _)| k.budget).collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        let ymax = rows_
            .iter()
            .map(|(_, c)| c.mean(c.nfe as f64))
            .fold(1.0f64, f64::max)
            * 1.1;
        let (bmin, bmax) = (
            budgets.first().copied().unwrap_or(1) as f64,
            budgets.last().copied().unwrap_or(1) as f64,
        );
        let x = |b: f64| {
            let span = (bmax - bmin).max(1.0);
            ox + margin + (b - bmin) / span * (pw - 2.0 * margin)
        };
        let y = |v: f64| oy + ph - margin - v / ymax * (ph - 2.0 * margin);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="13">{set}, T = {t}, {protocol}</text>"#,
            ox + margin,
            oy + 20.0
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{yb}" x2="{x1}" y2="{yb}" stroke="#000"/><line x1="{x0}" y1="{yb}" x2="{x0}" y2="{yt}" stroke="#000"/>"##,
            x0 = ox + margin,
            x1 = ox + pw - margin,
            yb = oy + ph - margin,
            yt = oy + margin
        );
        for i in 0..=4 {
            let v = ymax * f64::from(i) / 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#,
                ox + margin - 4.0,
                y(v) + 4.0
            );
        }
        for &b in &budgets {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{b}</text>"#,
                x(b as f64),
                oy + ph - margin + 14.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">budget D</text><text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">mean NFE</text>"#,
            ox + pw / 2.0,
            oy + ph - margin + 30.0,
            ox + 14.0,
            oy + ph / 2.0,
            ox + 14.0,
            oy + ph / 2.0
        );
        let mut methods: Vec<&'static str> = rows_.iter().map(|(k, _)| k.method).collect();
        methods.dedup();
        for (mi, m) in methods.iter().enumerate() {
            let c = color(m);
            let pts: Vec<(f64, f64)> = rows_
                .iter()
                .filter(|(k, _)| k.method == *m)
                .filter_map(|(k, cell)| k.budget.map(|b| (b as f64, cell.mean(cell.nfe as f64))))
                .collect();
            if pts.is_empty() {
                if let Some((_, cell)) = rows_.iter().find(|(k, _)| k.method == *m) {
                    let v = cell.mean(cell.nfe as f64);
                    let _ = writeln!(
                        s,
                        r#"<line x1="{}" y1="{yv}" x2="{}" y2="{yv}" stroke="{c}" stroke-dasharray="5,4"/>"#,
                        x(bmin),
                        x(bmax),
                        yv = y(v)
                    );
                }
            } else {
                let mut sorted = pts.clone();
                sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
                let path: Vec<String> = sorted
                    .iter()
                    .map(|(b, v)| format!("{:.1},{:.1}", x(*b), y(*v)))
                    .collect();
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                    path.join(" ")
                );
                for (b, v) in &sorted {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                        x(*b),
                        y(*v)
                    );
                }
            }
            let ly = oy + margin + 14.0 * mi as f64;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{ly}" fill="{c}">{m}</text>"#,
                ox + pw - margin - 60.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
