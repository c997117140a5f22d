//! `spot serve` on the shipped model and on an autoregressive folder: every response equals
//! `spot generate --json` with the same prompt, seed, method and budget (the method named per
//! request), plain and streamed; a method or budget the server cannot use is a 400.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use spot_serve::load::{LoadConfig, LoadError, run_blocking};

/// A running `spot serve` (killed when dropped), its base URL, and its stderr lines after
/// the address.
struct Served(Child, String, std::sync::mpsc::Receiver<String>);

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
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Served(child, url, rx)
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

/// SIGTERM drains: new requests and `/health` are 503 with `Retry-After` while a request in
/// flight finishes whole (its text equal to `spot generate`'s), then the process exits 0. The
/// JSON request logs name id, method, tokens, status and duration, and never the prompt
/// unless `--log-prompts` is given.
#[cfg(unix)]
#[test]
fn sigterm_drains_and_logs_never_show_prompts() {
    let prompt = "def secret_marker_fn(x):";
    for log_prompts in [false, true] {
        let mut args = vec!["--log-format", "json", "--max-new-tokens", "32"];
        if log_prompts {
            args.push("--log-prompts");
        }
        let mut served = serve(&args);
        let url = served.1.clone();
        let body = json!({"model": "sdar-tiny-code", "prompt": prompt, "max_tokens": 32,
            "spot": {"method": "df"}});
        let post = move |body: &Value| {
            let (status, head, text) = http(&url, "POST", "/v1/completions", &body.to_string());
            let retry = head.to_ascii_lowercase().contains("\r\nretry-after:");
            (status, retry, serde_json::from_str::<Value>(&text).unwrap())
        };
        let in_flight = {
            let (body, post) = (body.clone(), post.clone());
            std::thread::spawn(move || post(&body))
        };
        // Wait until the request is decoding, then SIGTERM.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let live = || {
            let (_, _, text) = http(&served.1, "GET", "/stats", "");
            serde_json::from_str::<Value>(&text).unwrap()["live"]
                .as_u64()
                .unwrap()
        };
        while live() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the request never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let pid = served.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        // Draining (once the signal is handled): `/health` and a new request are 503 with
        // Retry-After.
        loop {
            let (status, head, text) = http(&served.1, "GET", "/health", "");
            if status == 503 {
                assert!(text.contains("draining"), "{text}");
                assert!(head.to_ascii_lowercase().contains("\r\nretry-after:"));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never drained");
        }
        let (status, retry, v) = post(&body);
        assert_eq!((status, retry), (503, true), "{v}");
        assert_eq!(v["error"]["code"], "server_shutting_down");
        let (status, _, v) = in_flight.join().unwrap();
        assert_eq!(status, 200, "{v}");
        let want = generate("df", &[prompt], 0.0, 0);
        assert_eq!(v["choices"][0]["text"], want[0]["text"]);
        let exit = served.0.wait().unwrap();
        assert!(exit.success(), "spot serve exited with {exit}");
        let logs: Vec<Value> = served
            .2
            .try_iter()
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect();
        let done = logs
            .iter()
            .find(|l| l["target"] == "spot_serve::completion" && l["status"] == 200)
            .unwrap_or_else(|| panic!("no completion log line in {logs:?}"));
        assert_eq!(done["method"], "df");
        assert_eq!(done["completion_tokens"], v["usage"]["completion_tokens"]);
        assert!(
            done["ms"].as_f64().unwrap() > 0.0 && done["id"].is_u64(),
            "{done}"
        );
        assert!(
            logs.iter()
                .any(|l| l["target"] == "spot_serve::http" && l["status"] == 503),
            "the refused request is logged"
        );
        let shown = logs
            .iter()
            .any(|l| l.to_string().contains("secret_marker_fn"));
        assert_eq!(shown, log_prompts, "prompt text in the logs: {logs:?}");
    }
}

/// One HTTP/1.1 request on its own connection: status, head and body.
fn http(url: &str, verb: &str, path: &str, body: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{verb} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}
