//! `spot serve` on the shipped model and on an autoregressive folder: every response equals
//! `spot generate --json` with the same prompt, seed, method and budget (the method named per
//! request), plain and streamed; a method or budget the server cannot use is a 400.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use spot_serve::load::{LoadConfig, LoadError, run_blocking};

/// A running `spot serve` (killed when dropped) and its base URL.
struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(args: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spot"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spot serve starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("spot serve printed its address")
            .unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    Served(child, url)
}

/// `spot generate --json` over every prompt (one process): text and NFE per prompt.
fn generate(method: &str, prompts: &[&str], temperature: f32, seed: u64) -> Vec<Value> {
    generate_with(&["--budget", "6"], method, prompts, temperature, seed)
}

/// [`generate`] with other arguments (a model folder) instead of `--budget 6`.
fn generate_with(
    args: &[&str],
    method: &str,
    prompts: &[&str],
    temperature: f32,
    seed: u64,
) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = prompts
        .iter()
        .map(|p| json!({"prompt": p}).to_string())
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spot"))
        .args(["generate", "--json", "--max-new-tokens", "32"])
        .args(args)
        .args(["--method", method, "--prompts", file.to_str().unwrap()])
        .args([
            "--temperature",
            &temperature.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A request with the `spot` field `spot` is a 400 whose body contains `needle`.
fn assert_400(url: &str, model: &str, spot: Value, needle: &str) {
    let cfg = LoadConfig {
        prompts: vec!["x".into()],
        spot: Some(spot),
        ..LoadConfig::new(url, model)
    };
    match run_blocking(&cfg) {
        Err(LoadError::Status {
            status: 400, body, ..
        }) => assert!(body.contains(needle), "{body}"),
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn responses_equal_spot_generate() {
    let served = serve(&["--max-new-tokens", "32", "--budget", "6"]);
    let prompts = ["def fib(n):", "import sys\n"];
    // (Speculative methods decode one prompt each: the debug binary runs them slowly.)
    for (method, temperature, stream, n) in [
        ("df", 0.0f32, false, 2),
        ("blockspec", 1.0, true, 1),
        ("spot", 1.0, false, 1),
    ] {
        let prompts = &prompts[..n];
        let cfg = LoadConfig {
            prompts: prompts.iter().map(|p| p.to_string()).collect(),
            concurrency: 2,
            max_tokens: 32,
            temperature,
            seed: 5,
            stream,
            spot: Some(json!({"method": method})),
            ..LoadConfig::new(&served.1, "sdar-tiny-code")
        };
        let report = run_blocking(&cfg).unwrap();
        let want = generate(method, prompts, temperature, 5);
        for (r, w) in report.responses.iter().zip(&want) {
            assert_eq!(
                r.text,
                w["text"].as_str().unwrap(),
                "{method} T {temperature}"
            );
            assert_eq!(r.nfe, w["nfe"].as_u64(), "{method} T {temperature}");
        }
    }
    // What the server cannot do is a 400 naming it.
    for (spot, needle) in [
        (
            json!({"method": "nope"}),
            "`spot.method`: unknown method `nope`",
        ),
        (json!({"budget": 0}), "`spot.budget`"),
        (
            json!({"budget": 1_000_000}),
            "over this server's limit of 64",
        ),
        (json!({"method": "specdiff"}), "autoregressive"),
    ] {
        assert_400(&served.1, "sdar-tiny-code", spot, needle);
    }
}

/// An autoregressive folder (`llama-tiny`) served with SpecDiff-2: draft-free and SpecDiff-2
/// requests (named per request, decoded together) answer what `spot generate` prints, plain
/// and streamed, with its forwards; a stop string ends a choice with the text before it; the
/// block-diffusion methods and `spot.budget` are 400s.
#[test]
fn autoregressive_responses_equal_spot_generate() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spot-models/tests/fixtures/llama-tiny"
    );
    let served = serve(&[
        "--model",
        dir,
        "--method",
        "specdiff",
        "--max-new-tokens",
        "32",
    ]);
    let prompts = ["a b a b a b", "the cat the cat", "1 2 3 1 2 3"];
    let mut stops_checked = 0;
    for (method, temperature, stream) in [
        ("specdiff", 1.0f32, false),
        ("df", 1.0, true),
        ("specdiff", 0.0, true),
    ] {
        let cfg = LoadConfig {
            prompts: prompts.iter().map(|p| p.to_string()).collect(),
            concurrency: 3,
            max_tokens: 32,
            temperature,
            seed: 5,
            stream,
            spot: Some(json!({"method": method})),
            ..LoadConfig::new(&served.1, "llama-tiny")
        };
        let report = run_blocking(&cfg).unwrap();
        let want = generate_with(&["--model", dir], method, &prompts, temperature, 5);
        for (r, w) in report.responses.iter().zip(&want) {
            let (text, tag) = (
                w["text"].as_str().unwrap(),
                format!("{method} T {temperature}"),
            );
            assert_eq!(r.text, text, "{tag}");
            if !stream {
                assert_eq!(r.nfe, w["nfe"].as_u64(), "{tag}");
            }
            // A stop string taken from the middle of the text ends the choice before it.
            let chars: Vec<char> = text.chars().collect();
            let Some(stop) = chars
                .windows(2)
                .skip(4)
                .map(|w| w.iter().collect::<String>())
                .find(|w| !w.contains('\u{FFFD}') && !w.trim().is_empty())
            else {
                continue;
            };
            let stop = stop.as_str();
            stops_checked += 1;
            let cfg = LoadConfig {
                prompts: vec![prompts[r.index].to_string()],
                stop: vec![stop.to_string()],
                ..cfg.clone()
            };
            let cut = &run_blocking(&cfg).unwrap().responses[0];
            assert_eq!(
                cut.text,
                text[..text.find(stop).unwrap()],
                "{tag} stop {stop:?}"
            );
            assert_eq!(cut.finish_reason, "stop", "{tag}");
        }
    }
    assert!(
        stops_checked >= 3,
        "only {stops_checked} stop strings checked"
    );
    for (spot, needle) in [
        (json!({"method": "spot"}), "autoregressive (df or specdiff)"),
        (json!({"budget": 4}), "`spot.budget`"),
    ] {
        assert_400(&served.1, "llama-tiny", spot, needle);
    }
}
