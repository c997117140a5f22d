//! The server on the shipped model (`models/sdar-tiny-code`, draft-free decoding): responses
//! equal decoding alone (plain, streamed, `n` choices, stop strings, concurrent), faults are
//! 400s with OpenAI's body, a client that goes away frees its cache, and 64 concurrent
//! streams lose and cross nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn_flex::Flex;
use serde_json::{Value, json};
use spot_core::{BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, Request, run_request};
use spot_models::{DiffusionModel, StopStrings, hf::Tokenizer};
use spot_serve::load::{LoadConfig, LoadError, run_blocking};
use spot_serve::{Defaults, DiffusionEngine, EngineStats, Frontend, JobSpec, ServeConfig, Server};

const MODEL: &str = "sdar-tiny-code";
const TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}\
                        {% if add_generation_prompt %}<assistant>{% endif %}";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code")
}

fn model() -> DiffusionModel<Flex> {
    DiffusionModel::<Flex>::load(&dir(), &Default::default()).unwrap()
}

fn config(m: &DiffusionModel<Flex>, job: &JobSpec) -> DecodeConfig {
    DecodeConfig {
        block_size: 8,
        max_new_tokens: job.max_tokens,
        temperature: job.temperature,
        seed: job.seed,
        ..DecodeConfig::for_model(m.info())
    }
}

/// A server of the shipped model with draft-free decoding in blocks of 8, a toy chat
/// template, and at most `max_batch` requests decoded together.
fn start(max_batch: usize) -> Server {
    start_with(ServeConfig {
        addr: "127.0.0.1:0".into(),
        max_batch,
        max_pending: 256,
        ..ServeConfig::default()
    })
    .unwrap()
}

/// [`start`] with any settings.
fn start_with(cfg: ServeConfig) -> Result<Server, spot_serve::ServeError> {
    Server::start(cfg, || {
        let model = model();
        let info = model.info().clone();
        let frontend = Frontend {
            model_id: MODEL.into(),
            tokenizer: Tokenizer::open(&dir())?,
            template: Some(spot_models::chat::ChatTemplate::new(TEMPLATE, None, None)?),
            stop_ids: info.stop_ids.clone(),
            early_stop: true,
            max_positions: info.max_positions,
            vocab_size: info.vocab_size,
            max_n: 4,
            defaults: Defaults {
                max_tokens: 24,
                temperature: 0.0,
                seed: 0,
                method: "df".into(),
                budget: 8,
            },
        };
        let factory = Box::new(|m: &mut DiffusionModel<Flex>, job: &JobSpec| {
            if job.method.as_deref().is_some_and(|x| x != "df") {
                return Err("this test server decodes draft-free only".into());
            }
            let cfg = config(m, job);
            Ok(Request::new(
                &job.prompt,
                &cfg,
                m.info(),
                DraftFreeDecoder::new(),
            )?)
        });
        Ok((frontend, DiffusionEngine::new(model, factory)))
    })
}

/// What decoding `prompt` alone gives: the text (cut at a stop string) and finish reason.
fn alone(
    m: &mut DiffusionModel<Flex>,
    prompt: &str,
    (max_tokens, temperature, seed): (usize, f32, u64),
    stop: &[&str],
) -> (String, &'static str) {
    let tok = Tokenizer::open(&dir()).unwrap();
    let ids = tok.encode(prompt).unwrap();
    let job = JobSpec {
        prompt: ids.clone(),
        max_tokens,
        temperature,
        seed,
        method: None,
        budget: None,
    };
    let cfg = config(m, &job);
    let mut r = Request::new(&ids, &cfg, m.info(), DraftFreeDecoder::new()).unwrap();
    let stops = (!stop.is_empty())
        .then(|| StopStrings::new(&tok, stop.iter().map(|s| s.to_string()).collect()).unwrap());
    if let Some(s) = stops.clone() {
        r = r.with_stop_check(s);
    }
    let out = run_request(m, r, &mut ()).unwrap();
    let mut text = tok.decode(&out.tokens).unwrap();
    if let Some(s) = &stops {
        text.truncate(s.cut(&text).len());
    }
    (text, if out.stopped { "stop" } else { "length" })
}

fn url(s: &Server) -> String {
    format!("http://{}", s.addr())
}

/// POSTs `body` to `path`: status and JSON body.
fn post(s: &Server, path: &str, body: &str) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", url(s)))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    })
}

fn get_stats(s: &Server) -> EngineStats {
    s.stats()
}

/// Waits until the engine holds no request and no cache beyond the idle model's.
fn wait_idle(s: &Server) -> EngineStats {
    let t0 = Instant::now();
    loop {
        let st = get_stats(s);
        if st.live == 0 && st.queued == 0 && st.open_slots <= 1 {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never idle: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn responses_equal_decoding_alone() {
    let server = start(4);
    let mut m = model();
    let prompts = ["def add(a, b):", "import os\n", "class Stack:\n    def"];
    // Plain and streamed completions, concurrent, at T = 0 and T = 1 with distinct seeds.
    for (temperature, stream) in [(0.0, false), (1.0, true), (1.0, false)] {
        let cfg = LoadConfig {
            prompts: prompts.iter().map(|p| p.to_string()).collect(),
            concurrency: 3,
            max_tokens: 24,
            temperature,
            seed: 7,
            distinct_seeds: true,
            stream,
            ..LoadConfig::new(url(&server), MODEL)
        };
        let report = run_blocking(&cfg).unwrap();
        for (i, r) in report.responses.iter().enumerate() {
            let want = alone(&mut m, prompts[i], (24, temperature, 7 + i as u64), &[]);
            assert_eq!(
                (r.text.as_str(), r.finish_reason.as_str()),
                (want.0.as_str(), want.1)
            );
            if stream {
                assert!(r.text_chunks >= 1, "{r:?}");
            } else {
                assert!(r.nfe.is_some_and(|n| n > 0));
            }
        }
    }
    // n = 3: choice i uses seed + i; usage counts the prompt once.
    let (status, v) = post(
        &server,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompts[0], "n": 3, "seed": 11,
            "temperature": 1.0, "max_tokens": 16})
        .to_string(),
    );
    assert_eq!(status, 200, "{v}");
    for i in 0..3 {
        let c = &v["choices"][i];
        assert_eq!(c["index"], i);
        let want = alone(&mut m, prompts[0], (16, 1.0, 11 + i as u64), &[]);
        assert_eq!(c["text"], want.0.as_str());
    }
    assert_eq!(v["usage"]["prompt_tokens"], 7, "{v}");
    // A stop string: the text ends before it, as decoding alone with the same stop gives,
    // streamed the same (nothing of the stop string is sent first).
    for stream in [false, true] {
        let cfg = LoadConfig {
            prompts: vec![prompts[0].to_string()],
            max_tokens: 48,
            stop: vec!["\n\n".into(), "return".into()],
            stream,
            ..LoadConfig::new(url(&server), MODEL)
        };
        let r = &run_blocking(&cfg).unwrap().responses[0];
        let want = alone(&mut m, prompts[0], (48, 0.0, 0), &["\n\n", "return"]);
        assert_eq!(
            (r.text.as_str(), r.finish_reason.as_str()),
            (want.0.as_str(), want.1)
        );
    }
    // Chat through the template equals completing the rendered prompt.
    let rendered = "<user>hi\n<assistant>";
    for stream in [false, true] {
        let cfg = LoadConfig {
            prompts: vec!["hi".into()],
            chat: true,
            stream,
            max_tokens: 16,
            ..LoadConfig::new(url(&server), MODEL)
        };
        let r = &run_blocking(&cfg).unwrap().responses[0];
        assert_eq!(r.text, alone(&mut m, rendered, (16, 0.0, 0), &[]).0);
    }
    let idle = wait_idle(&server);
    assert_eq!((idle.failed, idle.cancelled), (0, 0), "{idle:?}");
    server.stop().unwrap();
}

#[test]
fn faults_are_400s_with_openai_bodies() {
    let server = start(2);
    let ok = json!({"model": MODEL, "prompt": "x = 1", "max_tokens": 4});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b.to_string()
    };
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("not JSON", "{\"model\": ".into(), None),
        ("not an object", "[1, 2]".into(), None),
        (
            "unknown field",
            with("frobnicate", json!(1)),
            Some("frobnicate"),
        ),
        (
            "unknown model",
            with("model", json!("gpt-4")),
            Some("model"),
        ),
        (
            "no prompt",
            json!({"model": MODEL}).to_string(),
            Some("prompt"),
        ),
        (
            "prompt type",
            with("prompt", json!({"a": 1})),
            Some("prompt"),
        ),
        (
            "token id past the vocabulary",
            with("prompt", json!([1, 99999999])),
            Some("prompt"),
        ),
        (
            "over the context",
            with("prompt", json!("x ".repeat(5000))),
            Some("prompt"),
        ),
        (
            "max_tokens 0",
            with("max_tokens", json!(0)),
            Some("max_tokens"),
        ),
        (
            "max_tokens over the context",
            with("max_tokens", json!(1u64 << 40)),
            Some("max_tokens"),
        ),
        (
            "negative temperature",
            with("temperature", json!(-0.5)),
            Some("temperature"),
        ),
        (
            "temperature a string",
            with("temperature", json!("hot")),
            Some("temperature"),
        ),
        ("n 0", with("n", json!(0)), Some("n")),
        ("n over the limit", with("n", json!(5)), Some("n")),
        ("negative seed", with("seed", json!(-1)), Some("seed")),
        ("empty stop", with("stop", json!([""])), Some("stop")),
        ("top_p", with("top_p", json!(0.5)), Some("top_p")),
        ("logprobs", with("logprobs", json!(3)), Some("logprobs")),
        (
            "stream_options without stream",
            with("stream_options", json!({})),
            Some("stream_options"),
        ),
        (
            "unknown spot option",
            with("spot", json!({"draft": 1})),
            Some("spot"),
        ),
        (
            "method the server cannot run",
            with("spot", json!({"method": "spot"})),
            None,
        ),
    ];
    for (what, body, param) in cases {
        let (status, v) = post(&server, "/v1/completions", &body);
        assert_eq!(status, 400, "{what}: {v}");
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error", "{what}: {v}");
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{what}: {v}");
        }
    }
    let chat = |messages: Value| json!({"model": MODEL, "messages": messages}).to_string();
    for (what, body) in [
        ("no messages", chat(json!([]))),
        (
            "bad role",
            chat(json!([{"role": "robot", "content": "hi"}])),
        ),
        ("no content", chat(json!([{"role": "user"}]))),
        (
            "image part",
            chat(json!([{"role": "user", "content": [{"type": "image_url"}]}])),
        ),
    ] {
        let (status, v) = post(&server, "/v1/chat/completions", &body);
        assert_eq!(status, 400, "{what}: {v}");
        assert!(
            v["error"]["param"]
                .as_str()
                .is_some_and(|p| p.starts_with("messages"))
        );
    }
    let (status, v) = post(&server, "/v1/nothing", "{}");
    assert_eq!(
        (status, v["error"]["type"].as_str()),
        (404, Some("invalid_request_error"))
    );
    // Nothing was started, nothing is held.
    let st = wait_idle(&server);
    assert_eq!((st.accepted, st.failed), (0, 0), "{st:?}");
    server.stop().unwrap();
}

/// Sends `body` on a raw connection and returns it (the response unread).
fn raw_post(s: &Server, body: &str) -> std::net::TcpStream {
    let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c
}

#[test]
fn a_client_that_disconnects_cancels_and_frees_its_cache() {
    let server = start(4);
    let before = wait_idle(&server);
    // Long decodes: 1,536 tokens one commit per forward take thousands of forwards.
    let long = |stream: bool| {
        json!({"model": MODEL, "prompt": "def main():", "max_tokens": 1536,
            "temperature": 1.0, "stream": stream})
        .to_string()
    };
    for stream in [true, false] {
        let mut c = raw_post(&server, &long(stream));
        if stream {
            // Read until the first block's chunk arrives: the decode is running.
            let mut buf = [0u8; 4096];
            let mut got = String::new();
            while !got.contains("data: ") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the stream ended early: {got}");
                got.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
        let t0 = Instant::now();
        let running = loop {
            let st = get_stats(&server);
            if st.live == 1 && st.cache_bytes > before.cache_bytes {
                break st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "never running: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(c);
        let after = wait_idle(&server);
        eprintln!(
            "stream {stream}: live / open slots / cache bytes while running {} / {} / {}, \
             after the client left {} / {} / {}",
            running.live,
            running.open_slots,
            running.cache_bytes,
            after.live,
            after.open_slots,
            after.cache_bytes
        );
        assert_eq!(after.cache_bytes, before.cache_bytes, "{after:?}");
        assert!(running.open_slots > after.open_slots);
    }
    let st = get_stats(&server);
    assert_eq!((st.cancelled, st.completed, st.failed), (2, 0, 0), "{st:?}");
    // The server still answers.
    let (status, _) = post(
        &server,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 4}).to_string(),
    );
    assert_eq!(status, 200);
    server.stop().unwrap();
}

#[test]
fn sixty_four_concurrent_streams_lose_and_cross_nothing() {
    let server = start(16);
    let prompts: Vec<String> = (0..64)
        .map(|i| format!("def f{i}(x):\n    return x + {}", i * 7))
        .collect();
    let cfg = LoadConfig {
        prompts: prompts.clone(),
        concurrency: 64,
        max_tokens: 16,
        temperature: 1.0,
        seed: 100,
        distinct_seeds: true,
        stream: true,
        timeout: Duration::from_secs(120),
        ..LoadConfig::new(url(&server), MODEL)
    };
    let report = match run_blocking(&cfg) {
        Ok(r) => r,
        Err(
            e @ (LoadError::Http { .. } | LoadError::Status { .. } | LoadError::Protocol { .. }),
        ) => {
            panic!("a stream failed: {e}")
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(report.responses.len(), 64);
    let mut ids: Vec<&str> = report.responses.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 64, "response ids repeat");
    let mut m = model();
    for (i, r) in report.responses.iter().enumerate() {
        assert_eq!(r.index, i);
        let want = alone(&mut m, &prompts[i], (16, 1.0, 100 + i as u64), &[]);
        assert_eq!(
            r.text, want.0,
            "stream {i} differs from its prompt decoded alone"
        );
    }
    let st = wait_idle(&server);
    assert_eq!(
        (st.accepted, st.completed, st.cancelled, st.failed),
        (64, 64, 0, 0),
        "{st:?}"
    );
    eprintln!(
        "64 streams: {:.2} s wall, p50 {:.3} s, p95 {:.3} s, {} merged forwards",
        report.wall.as_secs_f64(),
        report.latency_percentile(0.5),
        report.latency_percentile(0.95),
        st.forwards
    );
    server.stop().unwrap();
}

/// With API keys every route but `/health` needs one (401 with OpenAI's body otherwise, any of
/// the keys works); a body over the limit is a 413 naming it; a full queue is a 503 with
/// `Retry-After`; an address other than loopback without a key is refused at start.
#[test]
fn keys_limits_and_exposure() {
    let server = start_with(ServeConfig {
        addr: "127.0.0.1:0".into(),
        max_pending: 1,
        api_keys: vec!["first-key".into(), "second-key".into()],
        max_body_bytes: 4096,
        ..ServeConfig::default()
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |path: &str, key: Option<&str>, body: String| {
        rt.block_on(async {
            let mut r = reqwest::Client::new()
                .post(format!("{}{path}", url(&server)))
                .header("content-type", "application/json")
                .body(body);
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            let r = r.send().await.unwrap();
            let retry = r.headers().get("retry-after").cloned();
            (
                r.status().as_u16(),
                retry,
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    let body = json!({"model": MODEL, "prompt": "def f(x):", "max_tokens": 4}).to_string();
    for key in [None, Some("wrong"), Some("first-key!"), Some("")] {
        let (status, _, v) = send("/v1/completions", key, body.clone());
        assert_eq!(status, 401, "{key:?}: {v}");
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    for key in ["first-key", "second-key"] {
        let (status, _, v) = send("/v1/completions", Some(key), body.clone());
        assert_eq!(status, 200, "{v}");
    }
    let (status, _, _) = send("/v1/models", None, String::new());
    assert_eq!(status, 401);
    let health = rt.block_on(async {
        reqwest::get(format!("{}/health", url(&server)))
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(health, 200);
    // Over the body limit: 413 naming it, before any parsing.
    let big = json!({"model": MODEL, "prompt": "x".repeat(5000)}).to_string();
    let (status, _, v) = send("/v1/completions", Some("first-key"), big);
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 4096 bytes"),
        "{v}"
    );
    // max_pending 1: a request with n = 2 choices can never be held (a 400, not a 503 to
    // retry); one request while another decodes is refused with Retry-After.
    let two = json!({"model": MODEL, "prompt": "x", "n": 2, "max_tokens": 4}).to_string();
    let (status, _, v) = send("/v1/completions", Some("second-key"), two);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "too_many_choices");
    assert_eq!(v["error"]["param"], "n");
    let mut busy = std::net::TcpStream::connect(server.addr()).unwrap();
    let long = json!({"model": MODEL, "prompt": "x", "max_tokens": 256}).to_string();
    write!(
        busy,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer first-key\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{long}",
        long.len()
    )
    .unwrap();
    let t0 = Instant::now();
    while get_stats(&server).live + get_stats(&server).queued == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, retry, v) = send("/v1/completions", Some("second-key"), body.clone());
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(retry.as_ref().and_then(|h| h.to_str().ok()), Some("1"));
    drop(busy);
    server.stop().unwrap();
    // Reachable from other machines without a key: refused, unless allowed explicitly.
    let open = ServeConfig {
        addr: "0.0.0.0:0".into(),
        ..ServeConfig::default()
    };
    match start_with(open.clone()) {
        Err(spot_serve::ServeError::Setting { field, .. }) => assert_eq!(field, "api_keys"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let allowed = start_with(ServeConfig {
        allow_unauthenticated: true,
        ..open
    })
    .unwrap();
    allowed.stop().unwrap();
}

/// What a raw connection gets back (until the server closes it or `wait` passes): the status
/// (0 for none) and everything read.
fn read_reply(c: &mut std::net::TcpStream, wait: Duration) -> (u16, String) {
    c.set_read_timeout(Some(wait)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Waits until the server has closed every connection (a client's close reaches it a moment
/// after the client returns).
fn settle(s: &Server) {
    let t0 = Instant::now();
    while s.open_connections() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connections stay open"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The bounds a client can run into, each an OpenAI-style error naming it: prompt tokens,
/// `max_tokens` × choices, open connections (503 with `Retry-After`), a body that does not
/// arrive (408), headers that do not arrive and an idle keep-alive connection (closed after
/// the read timeout, freeing their slots). Then `/metrics` counts what happened.
#[test]
fn limits_timeouts_and_metrics() {
    let server = start_with(ServeConfig {
        addr: "127.0.0.1:0".into(),
        max_prompt_tokens: Some(8),
        max_request_tokens: 16,
        max_connections: 2,
        read_timeout: Duration::from_millis(1500),
        ..ServeConfig::default()
    })
    .unwrap();
    let long = json!({"model": MODEL, "prompt": "def f(x):\n    return x * x + 1 if x else 0",
        "max_tokens": 4});
    let (status, v) = post(&server, "/v1/completions", &long.to_string());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "prompt_too_long");
    assert_eq!(v["error"]["param"], "prompt");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 8")
    );
    settle(&server);
    let wide = json!({"model": MODEL, "prompt": "x", "max_tokens": 6, "n": 3});
    let (status, v) = post(&server, "/v1/completions", &wide.to_string());
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "request_too_large");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 16")
    );
    settle(&server);
    let fits = json!({"model": MODEL, "prompt": "x", "max_tokens": 8, "n": 2});
    let (status, v) = post(&server, "/v1/completions", &fits.to_string());
    assert_eq!(status, 200, "{v}");
    let mut generated = v["usage"]["completion_tokens"].as_f64().unwrap();

    settle(&server);
    // Two slow clients hold both connections: one sends half its headers, one a body shorter
    // than its Content-Length. A third connection is answered 503 naming the limit.
    let mut half_headers = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(half_headers, "POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
    let mut short_body = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(
        short_body,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"model\""
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = raw_post(&server, &fits.to_string());
    let (status, text) = read_reply(&mut third, Duration::from_secs(5));
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("too_many_connections") && text.contains("2 connections"));
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    // After the read timeout: the short body is a 408 naming the timeout, the half-sent
    // headers are closed without an answer.
    let t0 = Instant::now();
    let (status, text) = read_reply(&mut short_body, Duration::from_secs(10));
    assert_eq!(status, 408, "{text}");
    assert!(
        text.contains("body_timeout") && text.contains("1.5 s"),
        "{text}"
    );
    let (status, text) = read_reply(&mut half_headers, Duration::from_secs(10));
    assert!(status == 0 || status == 408, "{text}");
    assert!(t0.elapsed() < Duration::from_secs(8));
    // The slots are free again; a keep-alive connection left idle is closed after the read
    // timeout, freeing its slot too.
    settle(&server);
    let mut idle = raw_post(&server, &fits.to_string());
    let t0 = Instant::now();
    let (status, text) = read_reply(&mut idle, Duration::from_secs(30));
    assert_eq!(status, 200, "{text}");
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "the idle connection stayed open"
    );
    settle(&server);
    let (_, json) = text.split_once("\r\n\r\n").unwrap();
    let v: Value = serde_json::from_str(json).unwrap();
    generated += v["usage"]["completion_tokens"].as_f64().unwrap();

    let metrics = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let r = reqwest::get(format!("{}/metrics", url(&server)))
                .await
                .unwrap();
            assert!(
                r.headers()["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("application/openmetrics-text")
            );
            r.text().await.unwrap()
        })
    };
    let value = |line: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{line}` in\n{metrics}"))
    };
    assert_eq!(
        value(r#"spot_http_requests_total{endpoint="/v1/completions",status="400"}"#),
        2.0
    );
    assert_eq!(
        value(r#"spot_http_requests_total{endpoint="/v1/completions",status="200"}"#),
        2.0
    );
    assert_eq!(
        value(r#"spot_http_requests_total{endpoint="/v1/completions",status="408"}"#),
        1.0
    );
    assert_eq!(value("spot_completion_tokens_total"), generated);
    assert_eq!(
        value(r#"spot_choices_total{endpoint="/v1/completions",status="200"}"#),
        4.0
    );
    assert_eq!(
        value("spot_forwards_total"),
        get_stats(&server).forwards as f64
    );
    assert_eq!(value("spot_live_requests"), 0.0);
    assert_eq!(value("spot_draining"), 0.0);
    assert_eq!(
        value(r#"spot_request_duration_seconds_count{endpoint="/v1/completions",method="df"}"#),
        2.0
    );
    assert!(metrics.trim_end().ends_with("# EOF"));
    server.stop().unwrap();
}

/// Stopping drains: `/health` and new requests are 503 with `Retry-After` while a request
/// in flight finishes whole (equal to decoding alone); with a drain timeout too short for it,
/// it is cancelled instead and answered 503, and the server still stops cleanly.
#[test]
fn stopping_drains_then_cancels_at_the_timeout() {
    for (drain_timeout, finishes) in [(Duration::from_secs(120), true), (Duration::ZERO, false)] {
        let server = start_with(ServeConfig {
            addr: "127.0.0.1:0".into(),
            drain_timeout,
            ..ServeConfig::default()
        })
        .unwrap();
        let addr = server.addr();
        let body = json!({"model": MODEL, "prompt": "def fib(n):", "max_tokens": 128});
        let mut c = raw_post(&server, &body.to_string());
        let t0 = Instant::now();
        while get_stats(&server).live == 0 {
            assert!(t0.elapsed() < Duration::from_secs(60), "never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        let stopping = std::thread::spawn(move || server.stop().unwrap());
        if finishes {
            std::thread::sleep(Duration::from_millis(100));
            let mut health = std::net::TcpStream::connect(addr).unwrap();
            write!(
                health,
                "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            )
            .unwrap();
            let (status, text) = read_reply(&mut health, Duration::from_secs(10));
            assert_eq!(status, 503, "{text}");
            assert!(text.contains("draining") && text.to_ascii_lowercase().contains("retry-after"));
            let mut late = std::net::TcpStream::connect(addr).unwrap();
            let b = body.to_string();
            write!(
                late,
                "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{b}",
                b.len()
            )
            .unwrap();
            let (status, text) = read_reply(&mut late, Duration::from_secs(10));
            assert_eq!(status, 503, "{text}");
            assert!(text.contains("server_shutting_down"), "{text}");
        }
        let (status, text) = read_reply(&mut c, Duration::from_secs(120));
        let drained = stopping.join().unwrap();
        assert_eq!(drained.in_flight, 1);
        if finishes {
            assert_eq!(status, 200, "{text}");
            assert_eq!(drained.cancelled, 0);
            let (_, json) = text.split_once("\r\n\r\n").unwrap();
            let v: Value = serde_json::from_str(json).unwrap();
            let (want, _) = alone(&mut model(), "def fib(n):", (128, 0.0, 0), &[]);
            assert_eq!(v["choices"][0]["text"], want);
        } else {
            assert_eq!(status, 503, "{text}");
            assert!(text.contains("server_shutting_down"), "{text}");
            assert_eq!(drained.cancelled, 1);
        }
    }
}
