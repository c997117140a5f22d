//! The `spot` binary on the committed SDAR fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../spot-models/tests/fixtures")
        .join(name)
}

fn humaneval() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval.jsonl")
}

fn spot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spot"))
        .args(args)
        .output()
        .expect("spot runs")
}

/// A JSON array of token ids as `--prompt-ids` takes them (`1,2,3`).
fn id_list(ids: &serde_json::Value) -> String {
    let ids: Vec<String> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    ids.join(",")
}

/// The decode cases of a fixture's `golden.json`: prompt ids joined by commas, the
/// `max_new_tokens` argument, and the case.
fn golden_cases(name: &str) -> Vec<(String, String, serde_json::Value)> {
    let text = std::fs::read_to_string(fixture(name).join("golden.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    golden["decode_cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            (
                id_list(&case["prompt"]),
                case["max_new_tokens"].to_string(),
                case.clone(),
            )
        })
        .collect()
}

/// `spot generate` of prompt ids on a fixture folder with blocks of 8, as JSON.
fn generate_ids_args<'a>(dir: &'a str, ids: &'a str, n: &'a str, method: &'a str) -> Vec<&'a str> {
    vec![
        "generate",
        "--model",
        dir,
        "--prompt-ids",
        ids,
        "--max-new-tokens",
        n,
        "--block-size",
        "8",
        "--method",
        method,
        "--json",
    ]
}

/// Runs `spot bench ARGS --out OUT`, which must succeed, and returns `bench.json`'s groups.
fn bench_groups(args: &[&str], out: &std::path::Path) -> Vec<serde_json::Value> {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let run = spot(&all);
    assert!(
        run.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    summary["groups"].as_array().unwrap().clone()
}

/// `spot calibrate-order --drafter WEIGHTS ARGS...`.
fn calibrate_order(weights: &Path, args: &[&str]) -> Output {
    let mut all = vec!["calibrate-order", "--drafter", weights.to_str().unwrap()];
    all.extend_from_slice(args);
    spot(&all)
}

/// The drafter config `out` (a successful run) wrote next to `weights`.
fn written_config(out: &Output, weights: &Path) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(weights.with_extension("json")).unwrap()).unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// `spot generate --json` returns the transformers oracle's tokens for every golden case of
/// every block-diffusion family (SDAR, LLaDA, Dream, LLaDA2.0-MoE), with every method that is
/// exact. The golden cases decode aligned blocks (`--layout aligned`, LLaDA's default being
/// its own sampler's: see `llada_defaults_to_its_own_sampler`).
#[test]
fn generate_matches_the_oracle() {
    for name in [
        "sdar-tiny",
        "sdar-tiny-bf16",
        "llada-tiny",
        "dream-tiny",
        "llada2-moe-tiny",
    ] {
        let dir = fixture(name);
        for (ids, n, case) in golden_cases(name) {
            for method in ["df", "blockspec", "ssd"] {
                let mut args = generate_ids_args(dir.to_str().unwrap(), &ids, &n, method);
                args.extend(["--layout", "aligned"]);
                if case["early_stop"] == false {
                    args.push("--no-early-stop");
                }
                let j = json(&spot(&args));
                assert_eq!(j["tokens"], case["tokens"], "{name} {method} prompt {ids}");
                for key in ["text", "nfe", "positions_processed", "forwards", "wall_s"] {
                    assert!(j.get(key).is_some(), "missing {key}");
                }
                if method == "df" {
                    assert_eq!(j["forwards"], case["block_forwards"]);
                }
            }
        }
    }
}

/// Dream's confidence rules: every speculative method returns the draft-free tokens under
/// `--confidence margin` and `negative-entropy`, at T = 0 and T = 1.
#[test]
fn generate_with_dream_confidence_rules() {
    let dir = fixture("dream-tiny");
    for rule in ["margin", "negative-entropy", "raw-probability"] {
        for t in ["0", "1"] {
            let run = |method: &str| {
                json(&spot(&[
                    "generate",
                    "--model",
                    dir.to_str().unwrap(),
                    "--prompt-ids",
                    "5,17,33",
                    "--max-new-tokens",
                    "20",
                    "--block-size",
                    "8",
                    "--method",
                    method,
                    "--confidence",
                    rule,
                    "--temperature",
                    t,
                    "--seed",
                    "3",
                    "--json",
                    "--no-early-stop",
                ]))
            };
            let df = run("df");
            for method in ["blockspec", "ssd"] {
                let sp = run(method);
                assert_eq!(sp["tokens"], df["tokens"], "{rule} T {t} {method}");
                assert!(sp["nfe"].as_u64() <= df["nfe"].as_u64());
            }
        }
    }
}

/// Dream's own sampler from the command line: `--single-block --timesteps S --confidence R`
/// returns the tokens of `tools/oracle/dream_sampler.py` in its number of forwards, and a
/// speculative method verified against that schedule returns the same tokens. `--timesteps`
/// with `--steps` is refused.
#[test]
fn generate_reproduces_dreams_own_sampler() {
    let text = std::fs::read_to_string(fixture("dream-tiny").join("sampler.json")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = fixture("dream-tiny");
    for case in rec["cases"].as_array().unwrap().iter().step_by(3) {
        let ids = id_list(&case["prompt"]);
        let (n, steps) = (
            case["max_new_tokens"].to_string(),
            case["steps"].to_string(),
        );
        for method in ["df", "blockspec"] {
            #[rustfmt::skip]
            let j = json(&spot(&[
                "generate", "--model", dir.to_str().unwrap(), "--prompt-ids", &ids,
                "--max-new-tokens", &n, "--single-block", "--timesteps", &steps,
                "--confidence", case["confidence"].as_str().unwrap(), "--method", method,
                "--no-early-stop", "--json",
            ]));
            assert_eq!(j["tokens"], case["tokens"], "{method} prompt {ids}");
            if method == "df" {
                assert_eq!(j["forwards"], case["forwards"], "prompt {ids}");
            }
        }
    }
    #[rustfmt::skip]
    let out = spot(&[
        "generate", "--model", dir.to_str().unwrap(), "--prompt-ids", "5,6",
        "--timesteps", "4", "--steps", "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--steps"), "{err}");
}

/// Autoregressive folders (Llama, Qwen2) decode token by token through `spot generate` with
/// the oracle's greedy tokens, and so does SpecDiff-2; block-diffusion methods are refused
/// with a message.
#[test]
fn generate_autoregressive_matches_the_oracle() {
    for name in ["llama-tiny", "qwen2-tiny"] {
        let dir = fixture(name);
        for (ids, n, case) in golden_cases(name) {
            let mut args = vec![
                "generate",
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &ids,
                "--max-new-tokens",
                &n,
                "--method",
                "df",
                "--json",
            ];
            if case["early_stop"] == false {
                args.push("--no-early-stop");
            }
            let j = json(&spot(&args));
            assert_eq!(j["tokens"], case["tokens"], "{name} prompt {ids}");
            assert_eq!(j["stopped"], case["stopped"], "{name} prompt {ids}");
            // SpecDiff-2 returns the same tokens in no more forwards.
            args[8] = "specdiff";
            args.extend(["--k", "3", "--draft-tokens", "4"]);
            let s = json(&spot(&args));
            assert_eq!(s["method"], "specdiff");
            assert_eq!(s["tokens"], case["tokens"], "{name} prompt {ids}: specdiff");
            assert!(s["nfe"].as_u64() <= j["nfe"].as_u64(), "{s}");
        }
        let out = spot(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "5,6",
            "--method",
            "specdiff",
            "--drafter",
            "no-such-drafter",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("no-such-drafter"),
            "{err}"
        );
        let out = spot(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "5,6",
            "--method",
            "blockspec",
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("autoregressive"), "{err}");
    }
}

/// `--batch N --method specdiff` on an autoregressive folder decodes a prompt file through one
/// `SpecDiffBatch`: every line's tokens and forwards equal `--batch 1`'s, in fewer target
/// forwards in all; `--batch` with `--method df` is refused.
#[test]
fn generate_autoregressive_batch_equals_one_at_a_time() {
    let dir = fixture("llama-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("p.jsonl");
    let lines: Vec<String> = ["a b a b a b", "the cat the cat", "1 2 3 1 2 3", "x y z"]
        .iter()
        .map(|p| format!("{{\"prompt\": \"{p}\"}}"))
        .collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let run = |batch: &str, method: &str| {
        spot(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--max-new-tokens",
            "20",
            "--temperature",
            "1",
            "--method",
            method,
            "--batch",
            batch,
        ])
    };
    let parse = |out: &std::process::Output| -> Vec<serde_json::Value> {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let one = parse(&run("1", "specdiff"));
    let batched = run("3", "specdiff");
    let many = parse(&batched);
    assert_eq!(one.len(), 4);
    let mut rounds = 0;
    for (a, b) in one.iter().zip(&many) {
        assert_eq!(
            (&a["id"], &a["tokens"], &a["nfe"]),
            (&b["id"], &b["tokens"], &b["nfe"])
        );
        rounds += a["nfe"].as_u64().unwrap();
    }
    let err = String::from_utf8_lossy(&batched.stderr);
    let forwards: u64 = err
        .split("target forwards")
        .next()
        .and_then(|s| s.rsplit(' ').nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no forward count in {err}"));
    assert!(
        forwards < rounds,
        "{forwards} shared forwards, {rounds} rounds: {err}"
    );
    let out = run("3", "df");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--method specdiff"),
        "{err}"
    );
}

/// `--chat` renders the folder's chat template (here LLaDA's, written into a copy of the
/// fixture) around the prompt before tokenising; a folder without a template is an error
/// naming the field.
#[test]
fn generate_with_a_chat_template() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let src = fixture("llada-tiny");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let d = dir.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        d,
        "--prompt",
        "def f(x):",
        "--max-new-tokens",
        "8",
        "--block-size",
        "8",
        "--json",
    ];
    let plain = json(&spot(&base));
    let out = spot(&[&base[..], &["--chat"]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chat_template"));
    let templates: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("chat_templates.json")).unwrap())
            .unwrap();
    let llada = templates["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["family"] == "llada")
        .unwrap();
    let cfg = serde_json::json!({
        "chat_template": llada["template"],
        "bos_token": llada["bos_token"],
        "eos_token": llada["eos_token"],
    });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let chat = json(&spot(
        &[&base[..], &["--chat", "--system", "Be brief."]].concat(),
    ));
    let (p, c) = (
        plain["prompt_tokens"].as_u64().unwrap(),
        chat["prompt_tokens"].as_u64().unwrap(),
    );
    assert!(c > p + 10, "chat prompt {c} tokens vs plain {p}");
}

#[test]
fn generate_from_text_and_inspect() {
    let dir = fixture("sdar-tiny");
    let out = spot(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "def f(x):",
        "--max-new-tokens",
        "16",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NFE"));
    // The backend that ran, named once on stderr.
    assert_eq!(err.matches("spot: backend ").count(), 1, "{err}");
    let out = spot(&["inspect", "--model", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("parameters:        98688"), "{text}");
    assert!(text.contains("mask id:           372"), "{text}");
    assert!(text.contains("weights:           "), "{text}");
    // inspect runs no network: no backend line.
    assert!(!String::from_utf8_lossy(&out.stderr).contains("spot: backend"));
    // Every family: its name and its parameter count (from the oracles' fixture notes).
    for (name, family, params) in [
        ("llada-tiny", "llada", "123200"),
        ("dream-tiny", "dream", "123456"),
        ("llada2-moe-tiny", "llada2-moe", "322112"),
        ("llama-tiny", "llama (autoregressive)", "98624"),
        ("qwen2-tiny", "qwen2 (autoregressive)", "123456"),
    ] {
        let out = spot(&["inspect", "--model", fixture(name).to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains(&format!("family:            {family}")),
            "{text}"
        );
        assert!(
            text.contains(&format!("parameters:        {params}")),
            "{text}"
        );
    }
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let dir = fixture("sdar-tiny");
    let d = dir.to_str().unwrap();
    let he = humaneval();
    let h = he.to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (
            &["generate", "--prompt", "x", "--prompt-ids", "1"],
            "cannot be used with",
        ),
        (&["generate", "--model", d], "--prompt"),
        (
            &[
                "generate",
                "--model",
                d,
                "--prompt-ids",
                "1",
                "--field",
                "q",
            ],
            "--prompts",
        ),
        (
            &[
                "generate",
                "--model",
                d,
                "--prompts",
                "/nonexistent/p.jsonl",
            ],
            "/nonexistent/p.jsonl",
        ),
        (
            &["generate", "--model", d, "--prompts", h, "--field", "nope"],
            "field `nope` is missing",
        ),
        (
            &["generate", "--model", d, "--prompt-ids", "1,x"],
            "invalid",
        ),
        (
            &[
                "generate",
                "--model",
                d,
                "--prompt-ids",
                "1",
                "--temperature",
                "-1",
            ],
            "temperature",
        ),
        (
            &[
                "generate",
                "--model",
                d,
                "--prompt-ids",
                "1",
                "--budget",
                "0",
            ],
            "budget",
        ),
        (
            &[
                "generate",
                "--model",
                "/nonexistent/model",
                "--prompt-ids",
                "1",
            ],
            "/nonexistent/model",
        ),
    ];
    for (args, needle) in cases {
        let out = spot(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `--prompts FILE.jsonl` decodes every prompt (one JSON line each, with its id); the
/// speculative method returns the draft-free tokens for each.
#[test]
fn generate_over_a_prompt_file() {
    let dir = fixture("sdar-tiny");
    let he = humaneval();
    let run = |method: &str, batch: &str| {
        let out = spot(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompts",
            he.to_str().unwrap(),
            "--limit",
            "3",
            "--max-new-tokens",
            "12",
            "--method",
            method,
            "--batch",
            batch,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(String::from_utf8_lossy(&out.stderr).contains("3 prompts from"));
        lines
    };
    let df = run("df", "1");
    let spec = run("blockspec", "1");
    assert_eq!(df.len(), 3);
    for (i, (a, b)) in df.iter().zip(&spec).enumerate() {
        assert_eq!(a["id"], format!("HumanEval/{i}"));
        assert_eq!(a["tokens"], b["tokens"]);
        assert!(!a["tokens"].as_array().unwrap().is_empty());
        assert!(b["nfe"].as_u64() <= a["nfe"].as_u64());
    }
    // `--batch 2`: the same lines in the same order (two prompts share forwards, the third
    // joins when the first leaves), for draft-free and speculative decoding.
    for (method, alone) in [("df", &df), ("blockspec", &spec)] {
        let batched = run(method, "2");
        assert_eq!(batched.len(), 3);
        for (a, b) in alone.iter().zip(&batched) {
            for key in ["id", "tokens", "text", "nfe", "forwards", "states_scored"] {
                assert_eq!(a[key], b[key], "{method} {key}");
            }
        }
    }
}

/// `--stop`: the text ends before the stop string, the tokens are a prefix of the decode
/// without it, for every method alike; `--batch` without `--prompts` is refused.
#[test]
fn stop_strings_cut_the_output() {
    let run = |method: &str, stop: Option<&str>| {
        let mut args = vec![
            "generate",
            "--prompt",
            "def fibonacci(n):",
            "--max-new-tokens",
            "64",
            "--no-early-stop",
            "--json",
            "--method",
            method,
        ];
        if let Some(s) = stop {
            args.extend(["--stop", s]);
        }
        json(&spot(&args))
    };
    let full = run("df", None);
    let text = full["text"].as_str().unwrap().to_string();
    // A stop string that occurs in the middle of the decoded text.
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(3)
        .collect();
    let cut_at = text.find(&stop).unwrap();
    for method in ["df", "ssd"] {
        let out = run(method, Some(&stop));
        assert_eq!(out["text"].as_str().unwrap(), &text[..cut_at], "{method}");
        assert_eq!(out["stopped"], true, "{method}");
        let (all, kept) = (
            full["tokens"].as_array().unwrap(),
            out["tokens"].as_array().unwrap(),
        );
        assert!(kept.len() < all.len(), "{method}");
        assert_eq!(&all[..kept.len()], &kept[..], "{method}");
    }
    let out = spot(&["generate", "--prompt", "x", "--batch", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch applies to --prompts"));
}

/// Without `--model`, `spot generate` runs the shipped trained target.
#[test]
fn generate_defaults_to_the_shipped_model() {
    let out = spot(&[
        "generate",
        "--prompt",
        "def fibonacci(n):",
        "--max-new-tokens",
        "32",
        "--no-early-stop",
        "--json",
    ]);
    let j = json(&out);
    assert_eq!(j["tokens"].as_array().unwrap().len(), 32);
    assert!(!j["text"].as_str().unwrap().is_empty());
    let out = spot(&["inspect"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("sdar-tiny-code"));
}

/// 40 tokens of the shipped model after `def is_prime(n):` at temperature `t` with `method`
/// (and `extra` arguments), as JSON.
fn prime(t: &str, method: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "generate",
        "--prompt",
        "def is_prime(n):",
        "--max-new-tokens",
        "40",
        "--no-early-stop",
        "--temperature",
        t,
        "--method",
        method,
        "--json",
    ];
    args.extend_from_slice(extra);
    json(&spot(&args))
}

/// `--method spot` loads the shipped drafter next to the shipped model and returns the
/// draft-free tokens, at T = 0 and T = 1. At T = 0 the shipped checkpoint drafts the MRP
/// module's tokens (the same tree as `spot-mrp`); switched off, it drafts stale tokens.
#[test]
fn spot_method_uses_the_shipped_drafter() {
    let (mut nfe, mut tokens) = (Vec::new(), Vec::new());
    for t in ["0", "1"] {
        let df = prime(t, "df", &[]);
        let sp = prime(t, "spot", &[]);
        assert_eq!(df["tokens"], sp["tokens"], "T={t}");
        assert!(sp["nfe"].as_u64() < df["nfe"].as_u64(), "T={t}");
        nfe.push(sp["nfe"].as_u64().unwrap());
        tokens.push(df["tokens"].clone());
    }
    assert_eq!(prime("0", "spot-mrp", &[])["nfe"].as_u64(), Some(nfe[0]));
    let dir = tempfile::tempdir().unwrap();
    let off = dir.path().join("off.safetensors");
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/sdar-tiny-code/spot-drafter.safetensors");
    let out = calibrate_order(
        &shipped,
        &["--module-tokens", "0:off", "--out", off.to_str().unwrap()],
    );
    let cfg = written_config(&out, &off);
    assert_eq!(cfg["module_tokens_by_temperature"][0]["enabled"], false);
    let stale = prime("0", "spot", &["--drafter", off.to_str().unwrap()]);
    assert_eq!(stale["tokens"], tokens[0]);
    // Measured: 32 forwards with the module's tokens, 36 with stale ones.
    assert!(stale["nfe"].as_u64().unwrap() > nfe[0], "{stale}");
    let out = spot(&[
        "generate",
        "--prompt",
        "x",
        "--method",
        "spot",
        "--drafter",
        "/nonexistent/d.safetensors",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no d.safetensors, d.json in /nonexistent"),
        "{err}"
    );
}

/// `--method sets-net` loads the shipped learned set drafter (asking the model for its hidden
/// states) and returns threshold decoding's tokens, at T = 0 and T = 1.
#[test]
fn sets_net_uses_the_shipped_set_drafter() {
    for t in ["0", "1"] {
        let threshold = prime(t, "threshold", &["--threshold", "0.1"]);
        let net = prime(t, "sets-net", &["--threshold", "0.1"]);
        assert_eq!(threshold["tokens"], net["tokens"], "T={t}");
        assert!(net["nfe"].as_u64() < threshold["nfe"].as_u64(), "T={t}");
    }
}

/// `spot bench` runs every exact method on the shipped model (shipped drafter and Spiffy
/// graph), writes its four outputs, and every speculative decode equals draft-free.
#[test]
fn bench_runs_every_method_and_agrees_with_draft_free() {
    let dir = std::env::temp_dir().join(format!("spot-bench-test-{}", std::process::id()));
    let groups = bench_groups(
        &[
            "--prompts",
            humaneval().to_str().unwrap(),
            "--limit",
            "1",
            "--max-new-tokens",
            "24",
            "--budgets",
            "3,6",
            "--temperatures",
            "0,1",
            "--protocols",
            "fixed,eos",
        ],
        &dir,
    );
    assert_eq!(groups.len(), 4, "one group per temperature and protocol");
    for g in groups {
        let rows = g["rows"].as_array().unwrap();
        // df + 7 speculative methods (mrp included) x 2 budgets
        assert_eq!(rows.len(), 15);
        for r in rows {
            assert_eq!(r["equal"], r["samples"], "{r}");
            assert!(r["mean_nfe"].as_f64().unwrap() > 0.0);
        }
    }
    let lines = std::fs::read_to_string(dir.join("samples.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 60);
    assert!(
        std::fs::read_to_string(dir.join("bench.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    let md = std::fs::read_to_string(dir.join("bench.md")).unwrap();
    assert!(md.contains("| spot-gamma | 6 | 1/1 |"), "{md}");
    assert!(md.contains("| mrp | 6 | 1/1 |"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);

    // Bad input: a zero budget and an inexact method are refused.
    for bad in [["--budgets", "0"], ["--methods", "threshold"]] {
        let out = spot(&[
            "bench",
            "--prompts",
            humaneval().to_str().unwrap(),
            bad[0],
            bad[1],
        ]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&bad[0][2..]),
            "{bad:?}"
        );
    }
}

/// `spot --version` names the backend used and the backends compiled in (the default build:
/// flex).
#[test]
fn version_lists_the_backends() {
    let out = spot(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("spot "), "{text}");
    assert!(text.contains("backend: "), "{text}");
    assert!(text.contains("compiled in: "), "{text}");
}

/// `spot bench` with its default methods on a folder without a drafter or Spiffy graph runs
/// the methods it can (ssd, blockspec, oracle), names the skipped ones on stderr and in the
/// reports; naming a method that cannot run is an error naming the missing file.
#[test]
fn bench_skips_default_methods_the_folder_cannot_run() {
    let model = fixture("sdar-tiny");
    let m = model.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    let he = humaneval();
    let base = [
        "bench",
        "--model",
        m,
        "--prompts",
        he.to_str().unwrap(),
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
        "--budgets",
        "2",
        "--temperatures",
        "0",
        "--protocols",
        "fixed",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = spot(&base);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for (method, file) in [
        ("spiffy", "spiffy-graph.json"),
        ("spot", "spot-drafter.safetensors"),
        ("spot-gamma", "spot-drafter.safetensors"),
        ("mrp", "mrp.json"),
    ] {
        assert!(
            err.contains(&format!("spot bench: skipped {method}: no {file}")),
            "{err}"
        );
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("bench.json")).unwrap())
            .unwrap();
    let skipped: Vec<&str> = summary["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["method"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["spiffy", "spot", "spot-gamma", "mrp"]);
    let rows = summary["groups"][0]["rows"].as_array().unwrap();
    let ran: Vec<&str> = rows.iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(ran, ["df", "ssd", "blockspec", "oracle"]);
    for r in rows {
        assert_eq!(r["equal"], r["samples"], "{r}");
    }
    let md = std::fs::read_to_string(out_dir.join("bench.md")).unwrap();
    assert!(
        md.contains("Skipped: `spiffy` (no spiffy-graph.json in"),
        "{md}"
    );

    // Asked for by name, a method without its file is an error naming the file.
    for (method, file) in [
        ("spot", "spot-drafter.safetensors"),
        ("spiffy", "spiffy-graph.json"),
    ] {
        let out = spot(&[&base[..], &["--methods", method]].concat());
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--methods: {method} cannot run: no {file}")),
            "{err}"
        );
    }
}

/// `--sample-top-k`: every method applies the truncation alike (speculative tokens equal
/// draft-free ones at T = 1), it changes what is sampled, and 0 is refused.
#[test]
fn sample_top_k_is_exact_across_methods() {
    let run = |method: &str, k: Option<&str>| {
        let mut args = vec![
            "generate",
            "--prompt",
            "def add(a, b):",
            "--max-new-tokens",
            "32",
            "--no-early-stop",
            "--json",
            "--temperature",
            "1.0",
            "--seed",
            "3",
            "--method",
            method,
        ];
        if let Some(k) = k {
            args.extend(["--sample-top-k", k]);
        }
        json(&spot(&args))["tokens"].clone()
    };
    let df = run("df", Some("2"));
    assert_eq!(run("blockspec", Some("2")), df);
    assert_ne!(run("df", None), df);
    let out = spot(&["generate", "--prompt", "x", "--sample-top-k", "0"]);
    assert!(!out.status.success());
}

/// `spot calibrate-tokens` refits a copy of the shipped drafter's token calibration from
/// freshly collected trajectories: one table for the one temperature collected, the weights
/// byte for byte unchanged; a trajectory directory of another block size is refused naming it.
/// `spot train-drafter` continues the shipped drafter (`--init`) on the same trajectories and
/// writes a checkpoint that `--method spot` decodes with, equal to draft-free.
#[test]
fn calibrate_tokens_refits_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code");
    let traj = dir.path().join("t1");
    let collect = |model: &std::path::Path, out: &std::path::Path| {
        spot(&[
            "collect",
            "--model",
            model.to_str().unwrap(),
            "--prompts",
            humaneval().to_str().unwrap(),
            "--limit",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--max-new-tokens",
            "32",
            "--temperature",
            "1",
            "--seed",
            "3",
        ])
    };
    let out = collect(&shipped, &traj);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `spot replay` re-enacts every tree drafter on them without the target.
    let out = spot(&[
        "replay",
        "--trajectories",
        traj.to_str().unwrap(),
        "--methods",
        "spot,spiffy,blockspec,ssd",
        "--budgets",
        "4,8",
        "--json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 8, "{text}");
    // Every method replays the same commits (whole blocks: at least the 2 × 32 tokens), each
    // in fewer forwards than draft-free decoding's one per commit.
    let commits = rows[0]["commits"].as_u64().unwrap();
    assert!(commits >= 64, "{text}");
    for r in &rows {
        assert_eq!(r["commits"], commits, "{r}");
        let f = r["forwards"].as_u64().unwrap();
        assert!(f > 0 && f < commits, "{r}");
    }
    let weights = dir.path().join("d.safetensors");
    std::fs::copy(shipped.join("spot-drafter.safetensors"), &weights).unwrap();
    std::fs::copy(shipped.join("spot-drafter.json"), dir.path().join("d.json")).unwrap();
    let out = spot(&[
        "calibrate-tokens",
        "--trajectories",
        traj.to_str().unwrap(),
        "--drafter",
        weights.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("T = 1: 2 trajectories"), "{err}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("d.json")).unwrap()).unwrap();
    let tables = cfg["token_calibration_by_temperature"].as_array().unwrap();
    assert_eq!(tables.len(), 1, "{cfg}");
    assert_eq!(tables[0]["temperature"], 1.0);
    assert!(["confidence", "margin"].contains(&tables[0]["key"].as_str().unwrap()));
    assert_eq!(
        std::fs::read(&weights).unwrap(),
        std::fs::read(shipped.join("spot-drafter.safetensors")).unwrap()
    );
    // `spot calibrate-order --prior` replaces the prior weights over the rank paths the
    // checkpoint carries and keeps its tilts; a weight outside [0, 1] is refused.
    let cfg = written_config(&calibrate_order(&weights, &["--prior", "1:0.4"]), &weights);
    assert_eq!(
        cfg["rank_prior_by_temperature"],
        serde_json::json!([{"temperature": 1.0, "weight": 0.4}])
    );
    assert_eq!(cfg["rank_tilt_by_temperature"].as_array().unwrap().len(), 3);
    assert!(cfg["rank_paths"]["paths"].as_array().unwrap().len() > 8);
    let out = calibrate_order(&weights, &["--prior", "1:1.5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("weight"), "{err}");
    // `--module-tokens` replaces where SPOT's tokens come from and keeps the prior; a value
    // other than on/off is refused.
    let out = calibrate_order(&weights, &["--module-tokens", "1:off,0:on"]);
    let cfg = written_config(&out, &weights);
    assert_eq!(
        cfg["module_tokens_by_temperature"],
        serde_json::json!([{"temperature": 0.0, "enabled": true}, {"temperature": 1.0, "enabled": false}])
    );
    assert_eq!(
        cfg["rank_prior_by_temperature"],
        serde_json::json!([{"temperature": 1.0, "weight": 0.4}])
    );
    let out = calibrate_order(&weights, &["--module-tokens", "0:yes"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("neither `on` nor `off`"),
        "{err}"
    );
    // `spot eval-drafter` reports the order SPOT decodes with next to the raw network; with a
    // steep rank tilt at T = 1 that order picks what stale confidence picks at depth 0.
    written_config(&calibrate_order(&weights, &["--tilt", "1:1000"]), &weights);
    let eval = json(&spot(&[
        "eval-drafter",
        "--trajectories",
        traj.to_str().unwrap(),
        "--drafter",
        weights.to_str().unwrap(),
        "--max-depth",
        "0",
        "--json",
    ]));
    let depth0 = &eval["by_depth"][0];
    assert!(depth0["examples"].as_u64().unwrap() > 0, "{eval}");
    assert_eq!(
        eval["decoded_depth0_accuracy"], depth0["stale_confidence_accuracy"],
        "{eval}"
    );
    let trained = dir.path().join("trained.safetensors");
    let out = spot(&[
        "train-drafter",
        "--trajectories",
        traj.to_str().unwrap(),
        "--out",
        trained.to_str().unwrap(),
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--max-examples",
        "64",
        "--init",
        shipped.join("spot-drafter.safetensors").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("keeping epoch 1"),
        "{err}"
    );
    let df = prime("1", "df", &[]);
    let sp = prime("1", "spot", &["--drafter", trained.to_str().unwrap()]);
    assert_eq!(df["tokens"], sp["tokens"]);
    // The SDAR fixture decodes in blocks of another size than the drafter's 32.
    let small = dir.path().join("small");
    let out = collect(&fixture("sdar-tiny"), &small);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = spot(&[
        "calibrate-tokens",
        "--trajectories",
        small.to_str().unwrap(),
        "--drafter",
        weights.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("small has block size"),
        "{err}"
    );
}

/// `spot generate` on a LLaDA-format folder decodes as LLaDA's own sampler by default (blocks
/// right after the prompt, `tools/oracle/llada_sampler.py`), with every exact method; an SDAR
/// folder refuses `--layout after-prompt` naming the layout.
#[test]
fn llada_defaults_to_its_own_sampler() {
    let text = std::fs::read_to_string(fixture("llada-tiny").join("sampler.json")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = fixture("llada-tiny");
    for case in rec["cases"].as_array().unwrap().iter().take(3) {
        let ids = id_list(&case["prompt"]);
        let n = case["gen_length"].to_string();
        for method in ["df", "blockspec"] {
            let mut args = generate_ids_args(dir.to_str().unwrap(), &ids, &n, method);
            args.push("--no-early-stop");
            let j = json(&spot(&args));
            assert_eq!(j["tokens"], case["tokens"], "{method} prompt {ids}");
        }
    }
    let out = spot(&[
        "generate",
        "--model",
        fixture("sdar-tiny").to_str().unwrap(),
        "--prompt-ids",
        "5,6,7",
        "--max-new-tokens",
        "8",
        "--layout",
        "after-prompt",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("layout"), "{err}");
}

/// SPOT-Sets end to end: threshold trajectories (`collect --threshold`), the join tables
/// (`calibrate-sets`), then `bench --reference threshold`, where every speculative method,
/// returns the threshold decoder's tokens; one-commit draft-free runs beside it. One-commit trajectories and the oracles are refused under a threshold.
#[test]
fn sets_are_calibrated_and_equal_threshold_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let traj = dir.path().join("tau");
    let prompts = humaneval();
    let collect = |out: &std::path::Path, threshold: &[&str]| {
        let mut args = vec![
            "collect",
            "--prompts",
            prompts.to_str().unwrap(),
            "--limit",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--max-new-tokens",
            "24",
        ];
        args.extend_from_slice(threshold);
        spot(&args)
    };
    let out = collect(&traj, &["--threshold", "0.3", "--hidden-states"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The learned set drafter on the same trajectories (one epoch, no held-out prompt).
    let net = dir.path().join("net.json");
    let out = spot(&[
        "train-sets",
        "--trajectories",
        traj.to_str().unwrap(),
        "--out",
        net.to_str().unwrap(),
        "--epochs",
        "1",
        "--steps",
        "3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("token head epoch 1") && err.contains("tables"),
        "{err}"
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&net).unwrap()).unwrap();
    assert_eq!(file["config"]["hidden_dim"], 256);
    assert_eq!(file["token_head"]["config"]["candidates"], 8);
    // Threshold trajectories cannot be replayed as one-commit decodes.
    let out = spot(&["replay", "--trajectories", traj.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("one-commit (exact) trajectories"),
        "{err}"
    );
    let sets = dir.path().join("sets.json");
    let out = spot(&[
        "calibrate-sets",
        "--trajectories",
        traj.to_str().unwrap(),
        "--out",
        sets.to_str().unwrap(),
        "--steps",
        "3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("tau = 0.3"), "{err}");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sets).unwrap()).unwrap();
    assert_eq!(file["tables"][0]["join"].as_array().unwrap().len(), 3);

    let bench = dir.path().join("bench");
    let groups = bench_groups(
        &[
            "--prompts",
            prompts.to_str().unwrap(),
            "--limit",
            "1",
            "--max-new-tokens",
            "24",
            "--budgets",
            "4",
            "--temperatures",
            "1",
            "--protocols",
            "fixed",
            "--reference",
            "threshold",
            "--tau",
            "0.3",
            "--methods",
            "sets,sets-stale,sets-net,sets-max",
            "--sets",
            sets.to_str().unwrap(),
            "--sets-net",
            net.to_str().unwrap(),
        ],
        &bench,
    );
    for g in &groups {
        let rows = g["rows"].as_array().unwrap();
        let methods: Vec<&str> = rows.iter().map(|r| r["method"].as_str().unwrap()).collect();
        assert_eq!(
            methods,
            [
                "df",
                "threshold",
                "sets-stale",
                "sets",
                "sets-max",
                "sets-net"
            ],
            "{g}"
        );
        // Every exact method equals threshold decoding; the lossy one is only reported.
        for r in rows
            .iter()
            .filter(|r| r["method"] != "df" && r["method"] != "sets-max")
        {
            assert_eq!(r["equal"], r["samples"], "{r}");
        }
    }
    // Trajectories without hidden states are refused naming the flag.
    let bare = dir.path().join("bare");
    std::fs::create_dir_all(bare.join("samples")).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(traj.join("manifest.json")).unwrap())
            .unwrap();
    manifest.as_object_mut().unwrap().remove("hidden_states");
    std::fs::write(bare.join("manifest.json"), manifest.to_string()).unwrap();
    let out = spot(&[
        "train-sets",
        "--trajectories",
        bare.to_str().unwrap(),
        "--out",
        dir.path().join("unused-net.json").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--hidden-states"));

    // One-commit trajectories have no threshold; the oracles replay one-commit decoding.
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(plain.join("samples")).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(traj.join("manifest.json")).unwrap())
            .unwrap();
    manifest.as_object_mut().unwrap().remove("threshold");
    std::fs::write(plain.join("manifest.json"), manifest.to_string()).unwrap();
    let unused = dir.path().join("unused.json");
    let out = spot(&[
        "calibrate-sets",
        "--trajectories",
        plain.to_str().unwrap(),
        "--out",
        unused.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--threshold"));
    let out = spot(&[
        "bench",
        "--prompts",
        humaneval().to_str().unwrap(),
        "--reference",
        "threshold",
        "--methods",
        "oracle",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("oracle"));
}

/// Copies the `llama-tiny` fixture's model files into `dir`.
fn copy_llama_tiny(dir: &Path) {
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(fixture("llama-tiny").join(f), dir.join(f)).unwrap();
    }
}

/// A copy of the `llama-tiny` fixture with itself as its SpecDiff-2 drafter folder
/// (`specdiff-drafter/`, mask token 3); returns the folder and the drafter's path.
fn llama_with_drafter() -> (tempfile::TempDir, PathBuf) {
    let target = tempfile::tempdir().unwrap();
    let drafter = target.path().join("specdiff-drafter");
    std::fs::create_dir(&drafter).unwrap();
    copy_llama_tiny(target.path());
    copy_llama_tiny(&drafter);
    std::fs::write(
        drafter.join("specdiff-drafter.json"),
        r#"{"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": 3}"#,
    )
    .unwrap();
    (target, drafter)
}

/// `--method specdiff --drafter DIR` drafts with a drafter folder (here the `llama-tiny`
/// fixture itself with a mask token) and returns `df`'s tokens; `DIR/specdiff-drafter/` is
/// the default.
#[test]
fn generate_specdiff_with_a_drafter_folder() {
    let (target, drafter) = llama_with_drafter();
    let t = target.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            t,
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "20",
            "--no-early-stop",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&spot(&args))
    };
    let df = run(&["--method", "df"]);
    let d = drafter.to_str().unwrap();
    for extra in [
        &["--method", "specdiff", "--drafter", d][..],
        &["--method", "specdiff"][..],
    ] {
        let s = run(extra);
        assert_eq!(s["tokens"], df["tokens"], "{extra:?}");
        // The drafter has the target's weights: its first drafted token is always right.
        assert!(s["nfe"].as_u64() < df["nfe"].as_u64(), "{s}");
    }
}

/// `--drafter FILE` drafts from a lookup store: the target's own continuations as `spot
/// generate --json` writes them; `DIR/specdiff-lookup.jsonl` is the default when the folder
/// has no drafter folder. Same tokens as `df`, fewer forwards on a continuation the store
/// holds; a damaged store is an error naming the file and line. `--acceptance classic` runs
/// with one draft and is refused with more.
#[test]
fn generate_specdiff_with_a_lookup_store() {
    let target = tempfile::tempdir().unwrap();
    copy_llama_tiny(target.path());
    let t = target.path().to_str().unwrap();
    let run = |prompt: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            t,
            "--prompt-ids",
            prompt,
            "--max-new-tokens",
            "24",
            "--no-early-stop",
            "--json",
        ];
        args.extend_from_slice(extra);
        spot(&args)
    };
    let mut lines = String::new();
    for prompt in ["5,6,7", "9,4", "12,13,14,15"] {
        lines += &json(&run(prompt, &["--method", "df"])).to_string();
        lines.push('\n');
    }
    let store = target.path().join("specdiff-lookup.jsonl");
    std::fs::write(&store, lines).unwrap();
    let df = json(&run("5,6,7", &["--method", "df"]));
    // No floor and no pace: the lookup drafters' recommended floor 0.5 cuts a tiny store's
    // calibrated drafts, their pace skips rounds on costs measured for SmolLM2, and this
    // compares what they draft.
    let lookup = [
        "--method",
        "specdiff",
        "--drafter",
        "lookup",
        "--min-draft-prob",
        "0",
    ];
    let plain = json(&run("5,6,7", &[&lookup[..], &["--no-pace"]].concat()));
    let s = store.to_str().unwrap();
    for extra in [
        &[
            "--method",
            "specdiff",
            "--min-draft-prob",
            "0",
            "--no-pace",
            "--drafter",
            s,
        ][..],
        &["--method", "specdiff", "--min-draft-prob", "0", "--no-pace"][..],
    ] {
        let out = run("5,6,7", extra);
        let err = String::from_utf8_lossy(&out.stderr);
        if extra.len() == 5 {
            assert!(err.contains("drafter: lookup store"), "{err}");
        }
        let j = json(&out);
        assert_eq!(j["tokens"], df["tokens"], "{extra:?}");
        assert!(j["nfe"].as_u64() < plain["nfe"].as_u64(), "{j} vs {plain}");
    }
    // A pace whose rows and drafts cost nothing never finds a drafted round at a loss (its
    // gain is the accepted count), so it drafts every round, as no pace does; a bad pace
    // names its field.
    let free = json(&run("5,6,7", &[&lookup[..], &["--pace", "0:0"]].concat()));
    assert_eq!(free["tokens"], df["tokens"]);
    assert_eq!(free["nfe"], plain["nfe"], "{free} vs {plain}");
    let out = run("5,6,7", &["--method", "specdiff", "--pace", "0.1:0.2:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("pace.weight"),
        "{err}"
    );
    // The classic rule (one draft) runs at T = 1; with several drafts it is refused.
    // (The lookup drafter's recommended K is 1.)
    let classic = [
        "--method",
        "specdiff",
        "--drafter",
        "lookup",
        "--acceptance",
        "classic",
        "--temperature",
        "1",
    ];
    let j = json(&run("5,6,7", &[&classic[..], &["--k", "1"]].concat()));
    assert_eq!(j["tokens"].as_array().map(Vec::len), Some(24), "{j}");
    let out = run("5,6,7", &[&classic[..], &["--k", "4"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`acceptance`"),
        "{err}"
    );
    std::fs::write(
        &store,
        "{\"prompt_ids\": [1], \"tokens\": [2]}\n{\"tokens\": [3]}\n",
    )
    .unwrap();
    let out = run("5,6,7", &["--method", "specdiff", "--drafter", s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("specdiff-lookup.jsonl, line 2"),
        "{err}"
    );
}

/// `spot bench` on an autoregressive folder runs token-by-token decoding as the reference and
/// the SpecDiff-2 grid (drafters × K × γ × selection) beside it: every decode equal, the
/// drafter folder (the target's own weights) needs fewer forwards, and the outputs hold one
/// row per configuration; block-diffusion-only settings are refused naming them.
#[test]
fn bench_on_an_autoregressive_folder() {
    let (target, drafter) = llama_with_drafter();
    let prompts = target.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"hello world\"}\n{\"prompt\": \"the cat sat on the\"}\n",
    )
    .unwrap();
    let out_dir = target.path().join("out");
    let t = target.path().to_str().unwrap();
    let base = [
        "bench",
        "--model",
        t,
        "--prompts",
        prompts.to_str().unwrap(),
        "--max-new-tokens",
        "16",
        "--protocols",
        "fixed",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let mut args = base.to_vec();
    let d = drafter.to_str().unwrap();
    let drafters = format!("{d},lookup");
    args.extend([
        "--specdiff-drafters",
        &drafters,
        "--k",
        "1,2",
        "--draft-tokens",
        "4",
        "--selection",
        "longest,expected-streak",
        "--temperatures",
        "0,1",
    ]);
    let out = spot(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("bench.json")).unwrap())
            .unwrap();
    let groups = j["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    for g in groups {
        let rows = g["rows"].as_array().unwrap();
        // ar, then 2 drafters x 2 K x 1 γ x 2 selections.
        assert_eq!(rows.len(), 9, "{g}");
        assert_eq!(rows[0]["method"], "ar");
        for r in rows {
            assert_eq!(r["equal"], 2, "{r}");
            assert_eq!(r["samples"], 2, "{r}");
        }
        let own = &rows[1];
        assert_eq!(own["method"], "specdiff specdiff-drafter K=1 γ=4 longest");
        assert!(
            own["mean_nfe"].as_f64() < rows[0]["mean_nfe"].as_f64(),
            "{own}"
        );
        assert!(own["tokens_per_round"].as_f64().unwrap() > 1.0, "{own}");
    }
    let samples = std::fs::read_to_string(out_dir.join("samples.jsonl")).unwrap();
    assert_eq!(samples.lines().count(), 2 * 2 * 9);
    let md = std::fs::read_to_string(out_dir.join("bench.md")).unwrap();
    assert!(md.contains("| ar | 2/2 |"), "{md}");
    // `base` without its leading `bench` and trailing `--out DIR` (`bench_groups` adds them).
    let model_args = &base[1..base.len() - 2];
    // Adaptive draft length: a floor of 1 drafts nothing (the drafter is never certain), so
    // every round is a plain forward.
    let extra = [
        "--specdiff-drafters",
        d,
        "--k",
        "1",
        "--draft-tokens",
        "4",
        "--min-draft-prob",
        "0,1",
        "--temperatures",
        "0",
    ];
    let groups = bench_groups(&[model_args, &extra].concat(), &out_dir);
    let rows = groups[0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        rows[2]["method"],
        "specdiff specdiff-drafter K=1 γ=4 longest p>=1"
    );
    assert_eq!(rows[2]["mean_nfe"], rows[0]["mean_nfe"]);
    assert_eq!(rows[2]["equal"], 2);
    assert!(rows[1]["mean_nfe"].as_f64() < rows[0]["mean_nfe"].as_f64());
    // The classic rule runs with K = 1 only (K = 2 is left out of its grid) and is not
    // required to equal `ar`.
    let extra = [
        "--specdiff-drafters",
        d,
        "--k",
        "1,2",
        "--draft-tokens",
        "4",
        "--acceptance",
        "classic",
        "--temperatures",
        "1",
    ];
    let groups = bench_groups(&[model_args, &extra].concat(), &out_dir);
    let rows = groups[0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[1]["method"],
        "specdiff specdiff-drafter K=1 γ=4 longest classic"
    );
    assert_eq!(
        (&rows[0]["must_equal"], &rows[1]["must_equal"]),
        (&true.into(), &false.into())
    );
    let md = std::fs::read_to_string(out_dir.join("bench.md")).unwrap();
    assert!(md.contains("(not required)"), "{md}");
    for (extra, what) in [
        (
            &["--acceptance", "classic", "--k", "2"][..],
            "--acceptance classic runs with one draft",
        ),
        (&["--reference", "threshold"][..], "--reference threshold"),
        (
            &["--methods", "spot"][..],
            "spot needs a block-diffusion model",
        ),
        (&["--k", "9"][..], "--k must be in [1, 8]"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = spot(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(what),
            "{extra:?}: {err}"
        );
    }
}
