//! HTTP requests under hostile input: one [`Server`] on the shipped model (draft-free decoding,
//! a toy chat template) with small limits (64 KiB bodies, `max_tokens` 4 by default, at most 4
//! choices per request, one API key) takes at least 10,000 damaged requests
//! (`SPOT_HOSTILE_CASES` overrides) through its real HTTP stack, over raw [`TcpStream`]s from
//! [`CLIENTS`] client threads, so that a request can lie about its length, carry invalid UTF-8
//! or garbage headers, end early or stall.
//!
//! Every case is made from its index and `SPOT_HOSTILE_SEED` alone (a case reproduces on its
//! own), from eight valid bodies of `/v1/completions` and `/v1/chat/completions` (string,
//! token-id and list prompts, chat messages with text parts, streamed and not, `n`, `stop`,
//! `seed`, `temperature`, `spot: {method, budget}`): the loaders' damage ([`mutate`]) and
//! request-aware damage (hostile numbers and types per field, nesting up to 100,000 deep,
//! invalid UTF-8, bad chat messages and prompts, unknown and repeated fields, bodies sent to
//! the other endpoint) under valid HTTP; and damaged HTTP (lying, invalid and repeated
//! `Content-Length`, chunked framing valid and broken, bad keys, huge and many headers, bad
//! header syntax, other methods, paths and versions, keep-alive sequences and pipelining, slow
//! writes, connections closed mid-request or abandoned, and stalls that the client drops after
//! [`STALL`]) around mostly probe bodies: a seed refused for one known field.
//!
//! Checks: every answer parses as HTTP/1.x with a status below 500; a 4xx with a body carries
//! OpenAI's `{"error": {"message": ...}}`; a 200 is the endpoint's object (plain, or a stream
//! that ends with `[DONE]`) with a fresh id, and never answers a request without the key; a
//! probe's 400 names its field, and an undamaged seed's 200 holds the texts that seed got
//! before the barrage (so a body misread, or an answer crossed between connections, fails); a
//! well-framed request is answered within [`CASE_TIMEOUT`] (a malformed one, or one whose
//! client closed its writing half, may instead be closed, or cut, by the server: tallied as such); no
//! server thread panics (a panic hook counts them); afterwards the server still answers a
//! valid request with the text it gave before the barrage, and its counters, once idle, agree
//! with `GET /stats` and balance with none failed.
//!
//! Cost: the server's factory decodes one token from the last 4 prompt tokens whatever a
//! request asks (the HTTP side still sees each request whole), and a valid damaged body that
//! asks for more than [`MAX_CHOICES`] choices is drawn again: a forward of the model costs
//! ~10 ms in a debug build, and the 10,000 cases take ~25 s on a 2-core machine.
//!
//! The server runs in this process, under the capped allocator ([`alloc`]): its threads'
//! allocations over the single cap are reported to the next case that ends (each case is
//! begun and ended on its client thread), and one over the hard cap stops the process, so a
//! size taken from a request and trusted fails the suite. A concurrent loader test may end
//! first and be named instead; the failure is still a failure.

use std::collections::{BTreeMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use burn_flex::Flex;
use serde_json::{Value, json};
use spot_core::{BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, Request};
use spot_models::DiffusionModel;
use spot_models::chat::ChatTemplate;
use spot_models::hf::Tokenizer;
use spot_serve::{Defaults, DiffusionEngine, Frontend, JobSpec, ServeConfig, Server};

use crate::alloc;
use crate::harness::{cases, stream_seed};
use crate::mutate::{self, CLASSES, Format, Rng};

const MODEL: &str = "sdar-tiny-code";
const KEY: &str = "hostile-key";
/// The server's body limit.
const MAX_BODY: usize = 64 << 10;
/// The server's `n` limit.
const MAX_N: usize = 4;
const TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}\
                        {% if add_generation_prompt %}<assistant>{% endif %}";
/// Client threads sending cases at once (their decodes share the server's batch).
const CLIENTS: usize = 8;
/// How long a case may wait for its answers before it fails (the server's own timeouts are
/// far longer: the suite never waits on them).
const CASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Failures after which the barrage stops (a dead server must not cost 10,000 timeouts).
const MAX_FAILURES: usize = 50;
/// How long a deliberately stalled connection is held before the client drops it.
const STALL: Duration = Duration::from_millis(50);
/// Choices (prompts × `n`) a valid damaged body may ask for; one asking for more is drawn
/// again (a body of 300 prompts would decode for seconds and prove little more).
const MAX_CHOICES: usize = 16;

/// The endpoints with a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    fn other(self) -> Self {
        match self {
            Endpoint::Completions => Endpoint::Chat,
            Endpoint::Chat => Endpoint::Completions,
        }
    }

    /// The `object` of an answer (`chunk`: of a streamed one).
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// A valid request body the damage starts from.
struct SeedBody {
    endpoint: Endpoint,
    body: Value,
}

/// The seed bodies: every field both endpoints read, each at least once; all answer 200.
fn seeds() -> Vec<SeedBody> {
    let c = |body| SeedBody {
        endpoint: Endpoint::Completions,
        body,
    };
    let h = |body| SeedBody {
        endpoint: Endpoint::Chat,
        body,
    };
    vec![
        c(json!({"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4})),
        c(
            json!({"model": MODEL, "prompt": [1234, 88, 5], "max_tokens": 4,
            "temperature": 0.7, "seed": 3}),
        ),
        c(
            json!({"model": MODEL, "prompt": ["import os\n", "x = 1"], "max_tokens": 3, "n": 2,
            "stop": ["\n", "return"], "seed": 9, "temperature": 1.0}),
        ),
        c(
            json!({"model": MODEL, "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2,
            "stream": true, "stream_options": {"include_usage": true}}),
        ),
        c(
            json!({"model": MODEL, "prompt": "class A:", "stream": true, "n": 2, "stop": "\n\n",
            "spot": {"method": "df", "budget": 8}, "top_p": 1, "user": "u", "echo": false,
            "best_of": 1}),
        ),
        h(
            json!({"model": MODEL, "messages": [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"}], "max_tokens": 4}),
        ),
        h(
            json!({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "def f"}, {"type": "text", "text": "(x):"}]}],
            "max_completion_tokens": 3, "stream": true, "temperature": 0.5, "seed": 1}),
        ),
        h(
            json!({"model": MODEL, "messages": [{"role": "developer", "content": "d"},
            {"role": "user", "content": "u", "name": "bob"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}],
            "n": 2, "max_tokens": 2, "spot": {"method": "df"}, "stop": ["x"],
            "logprobs": false, "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "frequency_penalty": 0,
            "presence_penalty": 0, "logit_bias": {}}),
        ),
    ]
}

/// The server: the shipped model, decoding draft-free, with the suite's limits (settings it
/// does not name keep their defaults). Its factory bounds the model's work per choice (the
/// last 4 prompt tokens, one new token): the HTTP side sees every request as it came, and no
/// damaged body can make a case cost seconds of forwards.
fn start() -> Server {
    let dir = crate::root().join("models").join(MODEL);
    let config = ServeConfig {
        addr: "127.0.0.1:0".into(),
        max_batch: 16,
        api_keys: vec![KEY.into()],
        max_body_bytes: MAX_BODY,
        ..ServeConfig::default()
    };
    Server::start(config, move || {
        let model = DiffusionModel::<Flex>::load(&dir, &Default::default())?;
        let info = model.info().clone();
        let frontend = Frontend {
            model_id: MODEL.into(),
            tokenizer: Tokenizer::open(&dir)?,
            template: Some(ChatTemplate::new(TEMPLATE, None, None)?),
            stop_ids: info.stop_ids.clone(),
            early_stop: true,
            max_positions: info.max_positions,
            vocab_size: info.vocab_size,
            max_n: MAX_N,
            defaults: Defaults {
                max_tokens: 4,
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
            // The model's work per choice is bounded here (not in what the server is sent):
            // the last 4 prompt tokens and one new token: one forward of one position (in a
            // debug build the model's output layer costs ~10 ms a forward).
            let cfg = DecodeConfig {
                block_size: 1,
                max_new_tokens: 1,
                temperature: job.temperature,
                seed: job.seed,
                ..DecodeConfig::for_model(m.info())
            };
            let prompt = &job.prompt[job.prompt.len().saturating_sub(4)..];
            Ok(Request::new(
                prompt,
                &cfg,
                m.info(),
                DraftFreeDecoder::new(),
            )?)
        });
        Ok((frontend, DiffusionEngine::new(model, factory)))
    })
    .expect("the server starts")
}

/// Panics on the server's threads (`spot-http`, `spot-engine`: every thread whose name starts
/// with `spot-`, and unnamed ones: the model's thread pool), counted by a panic hook installed
/// once in front of the default one. The suite's own threads are named (`hostile-*`, the
/// tests'), so a loader test's deliberate panic is not counted.
static SERVER_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count_server_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name();
            if name.is_none_or(|n| n.starts_with("spot-"))
                && let Ok(mut p) = SERVER_PANICS.lock()
            {
                p.push(format!("thread {}: {info}", name.unwrap_or("(unnamed)")));
            }
            previous(info);
        }));
    });
}

// ----------------------------------------------------------------------------------------
// Requests as bytes

/// A request as text: its request line, header lines and body.
#[derive(Clone)]
struct Req {
    line: Vec<u8>,
    headers: Vec<Vec<u8>>,
    body: Vec<u8>,
}

impl Req {
    /// A well-formed POST of `body` to `path` with the key, closing after the answer.
    fn post(path: &str, body: Vec<u8>) -> Self {
        Self {
            line: format!("POST {path} HTTP/1.1").into_bytes(),
            headers: vec![
                b"host: 127.0.0.1".to_vec(),
                format!("authorization: Bearer {KEY}").into_bytes(),
                b"content-type: application/json".to_vec(),
                format!("content-length: {}", body.len()).into_bytes(),
                b"connection: close".to_vec(),
            ],
            body,
        }
    }

    /// Replaces every `name` header line with one of `value` (in the first one's place), or
    /// removes them (`None`).
    fn header(&mut self, name: &str, value: Option<&[u8]>) {
        let prefix = format!("{}:", name.to_ascii_lowercase()).into_bytes();
        let named = |h: &Vec<u8>| h.to_ascii_lowercase().starts_with(&prefix);
        let at = self.headers.iter().position(named);
        self.headers.retain(|h| !named(h));
        if let Some(v) = value {
            let mut line = format!("{name}: ").into_bytes();
            line.extend_from_slice(v);
            let at = at.unwrap_or(self.headers.len()).min(self.headers.len());
            self.headers.insert(at, line);
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.line.clone();
        out.extend_from_slice(b"\r\n");
        for h in &self.headers {
            out.extend_from_slice(h);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// What the client does after writing a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Reads the answer.
    Read,
    /// Closes its writing half, then reads the answer (or the close).
    HalfClose,
    /// Waits [`STALL`] for an answer, then drops the connection.
    Stall,
    /// Drops the connection at once.
    Abandon,
}

/// One request on a case's connection.
struct Step {
    bytes: Vec<u8>,
    /// Written in this many pieces, 2 ms apart (a slow client).
    pieces: usize,
    then: Then,
    /// Well-framed HTTP that the server must answer (else it may answer or close).
    framed: bool,
    /// Whether the request carries the key (`Some(false)`: a 2xx fails the case); `None`
    /// where either is right.
    authorized: Option<bool>,
    /// The endpoint a 200 answers for, when the request is routed to one.
    endpoint: Option<Endpoint>,
    /// A HEAD request: the answer has no body.
    head: bool,
    /// What the body must be answered with, when the body arrives whole.
    answer: Answer,
}

/// What a body that arrives whole must be answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Anything (within the checks every answer passes).
    Any,
    /// A probe, refused for this field: a 400 must name it (the body arrived whole and the
    /// answer is this request's), and a 200 fails.
    Refused(&'static str),
    /// A seed as it is: a 200 must hold the texts this seed got before the barrage.
    Seed(usize),
}

impl Step {
    /// `req`, well-framed, with the key, answered by `endpoint`.
    fn of(req: &Req, endpoint: Option<Endpoint>) -> Self {
        Self {
            bytes: req.bytes(),
            pieces: 1,
            then: Then::Read,
            framed: true,
            authorized: Some(true),
            endpoint,
            head: false,
            answer: Answer::Any,
        }
    }

    fn answer(mut self, answer: Answer) -> Self {
        self.answer = answer;
        self
    }

    fn malformed(mut self) -> Self {
        self.framed = false;
        self
    }

    fn then(mut self, then: Then) -> Self {
        self.then = then;
        self
    }
}

/// One case: its class (for the tally) and the requests it sends on one connection.
struct Case {
    class: String,
    steps: Vec<Step>,
    /// Every request written before the first answer is read.
    pipelined: bool,
}

impl Case {
    fn one(class: impl Into<String>, step: Step) -> Self {
        Self {
            class: class.into(),
            steps: vec![step],
            pipelined: false,
        }
    }
}

// ----------------------------------------------------------------------------------------
// Body damage

/// A step of a path into a JSON value.
#[derive(Clone, Debug)]
enum Key {
    Name(String),
    At(usize),
}

/// Every node under `v` (the root excluded) as a path.
fn nodes(v: &Value, at: &mut Vec<Key>, out: &mut Vec<Vec<Key>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(Key::Name(k.clone()));
                out.push(at.clone());
                nodes(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Key::At(i));
                out.push(at.clone());
                nodes(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn names(path: &[&str]) -> Vec<Key> {
    path.iter().map(|k| Key::Name(k.to_string())).collect()
}

/// The value at `path` in `v` (`Null` where it leads nowhere).
fn get<'a>(v: &'a Value, path: &[Key]) -> &'a Value {
    path.iter().fold(v, |v, k| match k {
        Key::Name(n) => &v[n.as_str()],
        Key::At(i) => &v[*i],
    })
}

/// Sets the node at `path` to `x`, making objects (and array slots) on the way.
fn put(v: &mut Value, path: &[Key], x: Value) {
    let Some((first, rest)) = path.split_first() else {
        *v = x;
        return;
    };
    let next = match first {
        Key::Name(k) => {
            if !v.is_object() {
                *v = json!({});
            }
            v.as_object_mut()
                .expect("an object")
                .entry(k.clone())
                .or_insert(Value::Null)
        }
        Key::At(i) => {
            if !v.is_array() {
                *v = json!([]);
            }
            let a = v.as_array_mut().expect("an array");
            let i = (*i).min(a.len());
            if i == a.len() {
                a.push(Value::Null);
            }
            &mut a[i]
        }
    };
    put(next, rest, x);
}

const HOLE: &str = "\u{1}hole\u{1}";

/// `body` with the node at `path` replaced by `raw` bytes, JSON or not.
fn splice(body: &Value, path: &[Key], raw: &[u8]) -> Vec<u8> {
    let mut v = body.clone();
    put(&mut v, path, Value::String(HOLE.into()));
    let text = serde_json::to_vec(&v).expect("JSON");
    let hole = serde_json::to_vec(HOLE).expect("JSON");
    match text.windows(hole.len()).position(|w| w == hole.as_slice()) {
        Some(at) => [&text[..at], raw, &text[at + hole.len()..]].concat(),
        None => text,
    }
}

/// Numbers as a client may write them: huge, negative, fractional, at the limits of u32, u64
/// and i64, at the context's edge, and not JSON at all.
const NUMBERS: &[&str] = &[
    "1e308",
    "-1e308",
    "1e999",
    "-1e999",
    "-1",
    "0",
    "-0",
    "1",
    "3",
    "4",
    "5",
    "0.5",
    "4.0",
    "4e0",
    "1e-320",
    "2044",
    "2048",
    "2049",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "NaN",
    "Infinity",
    "-Infinity",
    "0x10",
    "01",
    "+1",
    ".5",
    "1.",
    "1e",
    "--1",
];

/// The fields either endpoint reads (numbers first), and the nested ones.
const NUMBER_FIELDS: &[&[&str]] = &[
    &["max_tokens"],
    &["max_completion_tokens"],
    &["n"],
    &["seed"],
    &["temperature"],
    &["top_p"],
    &["frequency_penalty"],
    &["presence_penalty"],
    &["best_of"],
    &["spot", "budget"],
];
const FIELDS: &[&[&str]] = &[
    &["model"],
    &["prompt"],
    &["messages"],
    &["max_tokens"],
    &["max_completion_tokens"],
    &["temperature"],
    &["seed"],
    &["n"],
    &["stop"],
    &["stream"],
    &["stream_options"],
    &["stream_options", "include_usage"],
    &["spot"],
    &["spot", "method"],
    &["spot", "budget"],
    &["top_p"],
    &["frequency_penalty"],
    &["presence_penalty"],
    &["logit_bias"],
    &["user"],
    &["echo"],
    &["best_of"],
    &["suffix"],
    &["logprobs"],
    &["top_logprobs"],
    &["tools"],
    &["tool_choice"],
    &["response_format"],
];

/// A value of another type (or a hostile one of the same type), as JSON text.
fn other_type(rng: &mut Rng) -> Vec<u8> {
    const SMALL: &[&str] = &[
        "null",
        "true",
        "false",
        "\"\"",
        "\"x\"",
        "\"4\"",
        "\"sdar-tiny-code\"",
        "\"df\"",
        "[]",
        "{}",
        "[1]",
        "[\"a\"]",
        "[[1]]",
        "[null]",
        "{\"a\": 1}",
        "{\"role\": \"user\", \"content\": \"x\"}",
        "{\"type\": \"text\", \"text\": \"x\"}",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "\"\\udc00\\ud800\"",
        "\"\\ud83d\\ude00\"",
        "\"\\uffff\"",
        "[1, 2, 3, 4, 5, 6, 7, 8]",
        "-1",
        "1e308",
        "1.5",
    ];
    match rng.below(SMALL.len() + 3) {
        i if i < SMALL.len() => SMALL[i].as_bytes().to_vec(),
        i if i == SMALL.len() => format!("\"{}\"", "x".repeat(1 + rng.below(30_000))).into_bytes(),
        i if i == SMALL.len() + 1 => {
            let d = 1 + rng.below(200);
            format!("{}1{}", "[".repeat(d), "]".repeat(d)).into_bytes()
        }
        _ => {
            let n = 1 + rng.below(2_000);
            format!("[{}]", vec!["\"x\""; n].join(",")).into_bytes()
        }
    }
}

/// Bad chat messages (the value of `messages`).
const MESSAGES: &[&str] = &[
    "[]",
    "\"hi\"",
    "{\"role\": \"user\", \"content\": \"hi\"}",
    "[{\"content\": \"hi\"}]",
    "[{\"role\": \"user\"}]",
    "[{\"role\": \"user\", \"content\": null}]",
    "[{\"role\": \"user\", \"content\": 1}]",
    "[{\"role\": \"user\", \"content\": true}]",
    "[{\"role\": \"user\", \"content\": [\"hi\"]}]",
    "[{\"role\": \"user\", \"content\": [[\"hi\"]]}]",
    "[{\"role\": \"user\", \"content\": []}]",
    "[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]",
    "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]",
    "[{\"role\": \"user\", \"content\": [{\"text\": \"hi\"}]}]",
    "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]",
    "[{\"role\": \"user\", \"content\": {\"text\": \"hi\"}}]",
    "[{\"role\": \"user\", \"content\": \"\"}]",
    "[{\"role\": \"user\", \"content\": \"\\u0000\"}]",
    "[{\"role\": \"user\", \"content\": \"{{ 7 * 7 }}{% for x in range(99999999) %}x{% endfor %}\"}]",
    "[{\"role\": \"robot\", \"content\": \"hi\"}]",
    "[{\"role\": \"\", \"content\": \"hi\"}]",
    "[{\"role\": \"USER\", \"content\": \"hi\"}]",
    "[{\"role\": 1, \"content\": \"hi\"}]",
    "[{\"role\": null, \"content\": \"hi\"}]",
    "[{\"role\": [\"user\"], \"content\": \"hi\"}]",
    "[{\"role\": \"tool\", \"content\": \"hi\", \"tool_call_id\": \"1\"}]",
    "[{\"role\": \"function\", \"content\": \"hi\"}]",
    "[{\"role\": \"user\", \"content\": \"hi\", \"name\": {\"a\": 1}}]",
    "[{\"role\": \"user\", \"content\": \"hi\", \"role\": \"robot\"}]",
    "[{\"role\": \"assistant\", \"content\": \"x\"}]",
    "[{\"role\": \"system\", \"content\": \"x\"}]",
    "[null]",
    "[1]",
    "[[]]",
    "[\"user\", \"hi\"]",
];

/// Bad and edge-case prompts (the value of `prompt`); the ids are the model's mask (6143),
/// stop (6141, 6142) and first unknown (6144) ids.
fn prompt(rng: &mut Rng) -> Vec<u8> {
    const SMALL: &[&str] = &[
        "\"\"",
        "[]",
        "[\"\"]",
        "[[]]",
        "[[], [1]]",
        "[0]",
        "[6143]",
        "[6143, 6143, 6143]",
        "[6141, 6142]",
        "[6144]",
        "[-1]",
        "[1.5]",
        "[1e308]",
        "[18446744073709551616]",
        "[4294967296]",
        "[[1], [2], \"x\"]",
        "[1, \"x\"]",
        "[[\"x\"]]",
        "[null]",
        "[true]",
        "{\"a\": 1}",
        "\"\\u0000\"",
        "\" \"",
        "\"\\n\\n\\n\"",
        "\"<|endoftext|>\"",
        "\"\\ud83d\\ude00\"",
    ];
    match rng.below(SMALL.len() + 5) {
        i if i < SMALL.len() => SMALL[i].as_bytes().to_vec(),
        // Over the context (2,048 tokens), as text and as ids.
        i if i == SMALL.len() => format!("\"{}\"", "x ".repeat(5_000)).into_bytes(),
        i if i == SMALL.len() + 1 => format!("[{}]", vec!["7"; 2_045].join(",")).into_bytes(),
        // At the context's edge: 2,044 prompt tokens and 4 to generate.
        i if i == SMALL.len() + 2 => format!("[{}]", vec!["7"; 2_044].join(",")).into_bytes(),
        // Many prompts.
        i if i == SMALL.len() + 3 => {
            format!("[{}]", vec!["\"x\""; 1 + rng.below(16)].join(",")).into_bytes()
        }
        _ => format!("[{}]", vec!["[5]"; 1 + rng.below(16)].join(",")).into_bytes(),
    }
}

/// Byte sequences that are not UTF-8: bad continuation, a lone 0xFF, an encoded surrogate, an
/// overlong slash, a code point past U+10FFFF, a lone continuation byte, a cut sequence.
const NOT_UTF8: &[&[u8]] = &[
    b"\xc3\x28",
    b"\xff",
    b"\xed\xa0\x80",
    b"\xf0\x28\x8c\x28",
    b"\xc0\xaf",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b"\xe2\x82",
];

/// The choices a body asks for when it may be valid (prompts × `n`); 0 when the server
/// refuses it for `n` or it is not JSON.
fn choices(e: Endpoint, body: &[u8]) -> usize {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    let n = match &v["n"] {
        Value::Null => 1,
        x => x.as_u64().map_or(0, |n| n as usize),
    };
    if n > MAX_N {
        return 0;
    }
    let prompts = match (e, &v["prompt"]) {
        (Endpoint::Completions, Value::Array(a)) if !a.iter().all(Value::is_number) => a.len(),
        _ => 1,
    };
    prompts * n
}

/// A damaged body for `seed`: the class, the endpoint it is sent to, and the bytes; drawn
/// again while it asks for more than [`MAX_CHOICES`].
fn damaged_body(seed: &SeedBody, rng: &mut Rng) -> (String, Endpoint, Vec<u8>) {
    for _ in 0..16 {
        let (class, e, bytes) = damage(seed, rng);
        if choices(e, &bytes) <= MAX_CHOICES {
            return (class, e, bytes);
        }
    }
    (
        "body: clean".into(),
        seed.endpoint,
        serde_json::to_vec(&seed.body).expect("JSON"),
    )
}

fn damage(seed: &SeedBody, rng: &mut Rng) -> (String, Endpoint, Vec<u8>) {
    let clean = serde_json::to_vec(&seed.body).expect("JSON");
    let mut all = Vec::new();
    nodes(&seed.body, &mut Vec::new(), &mut all);
    let e = seed.endpoint;
    match rng.below(100) {
        // The loaders' damage: bytes and JSON nodes.
        0..35 => {
            let (class, bytes) = mutate::mutate(&clean, Format::Json, rng);
            (format!("body: {}", CLASSES[class]), e, bytes)
        }
        // A hostile number in a numeric field (or a token id).
        35..50 => {
            let mut paths: Vec<Vec<Key>> = NUMBER_FIELDS.iter().map(|p| names(p)).collect();
            paths.extend(
                all.iter()
                    .filter(|p| get(&seed.body, p).is_number())
                    .cloned(),
            );
            let path = rng.pick(&paths).clone();
            let raw = rng.pick(NUMBERS).as_bytes();
            ("body: number".into(), e, splice(&seed.body, &path, raw))
        }
        // Another type in a field (present or not), or in any node.
        50..65 => {
            let path = if rng.below(2) == 0 {
                names(FIELDS[rng.below(FIELDS.len())])
            } else {
                rng.pick(&all).clone()
            };
            let raw = other_type(rng);
            (
                "body: wrong type".into(),
                e,
                splice(&seed.body, &path, &raw),
            )
        }
        // Deep nesting: in a field, or as the whole body (100,000 deep is over the limit).
        65..70 => {
            let depth = *rng.pick(&[128usize, 129, 1_000, 30_000, 60_000, 100_000]);
            let shapes: [(&[u8], &[u8]); 2] = [(b"[", b"]"), (b"{\"a\":", b"}")];
            let (open, close) = *rng.pick(&shapes);
            let mut raw = open.repeat(depth);
            if rng.below(2) == 0 {
                raw.extend_from_slice(b"1");
                raw.extend(close.repeat(depth));
            }
            let bytes = if rng.below(4) == 0 {
                raw
            } else {
                let path = if rng.below(2) == 0 {
                    names(FIELDS[rng.below(FIELDS.len())])
                } else {
                    rng.pick(&all).clone()
                };
                splice(&seed.body, &path, &raw)
            };
            ("body: deep nesting".into(), e, bytes)
        }
        // Invalid UTF-8: in a string, in a key, or the body in another encoding.
        70..78 => {
            let bad = *rng.pick(NOT_UTF8);
            let bytes = match rng.below(5) {
                0 => [b"\xef\xbb\xbf".as_slice(), &clean].concat(),
                1 => {
                    // UTF-16LE with its byte-order mark.
                    let text = String::from_utf8_lossy(&clean).to_string();
                    let mut b = vec![0xff, 0xfe];
                    for u in text.encode_utf16() {
                        b.extend_from_slice(&u.to_le_bytes());
                    }
                    b
                }
                2 => {
                    // An unknown key that is not UTF-8.
                    let raw = [b"\"u\", \"k".as_slice(), bad, b"\": 1"].concat();
                    splice(&seed.body, &names(&["user"]), &raw)
                }
                _ => {
                    // Inside a string value: the model, a prompt, a role, a content, a stop.
                    let strings: Vec<&Vec<Key>> = all
                        .iter()
                        .filter(|p| get(&seed.body, p).is_string())
                        .collect();
                    let path = (*rng.pick(&strings)).clone();
                    let raw = [b"\"ab".as_slice(), bad, b"cd\""].concat();
                    splice(&seed.body, &path, &raw)
                }
            };
            ("body: invalid UTF-8".into(), e, bytes)
        }
        // Bad chat messages (at the chat endpoint), or bad prompts (at completions).
        78..90 => {
            if rng.below(2) == 0 {
                let mut body = seed.body.clone();
                if let Some(m) = body.as_object_mut() {
                    m.remove("prompt");
                    m.remove("echo");
                    m.remove("best_of");
                }
                let raw = rng.pick(MESSAGES).as_bytes();
                (
                    "body: chat messages".into(),
                    Endpoint::Chat,
                    splice(&body, &names(&["messages"]), raw),
                )
            } else {
                let mut body = seed.body.clone();
                if let Some(m) = body.as_object_mut() {
                    m.remove("messages");
                    m.remove("max_completion_tokens");
                    for k in ["logprobs", "tools", "tool_choice", "response_format"] {
                        m.remove(k);
                    }
                }
                let raw = prompt(rng);
                (
                    "body: prompt".into(),
                    Endpoint::Completions,
                    splice(&body, &names(&["prompt"]), &raw),
                )
            }
        }
        // Unknown fields (odd names, many of them, nested ones) and repeated ones.
        90..96 => {
            let bytes = match rng.below(4) {
                0 => {
                    let key = *rng.pick(&[
                        "frobnicate",
                        "",
                        "\\u0000",
                        "model ",
                        "Model",
                        "MAX_TOKENS",
                        "__proto__",
                        "spot.method",
                    ]);
                    let raw = format!("\"u\", \"{key}\": 1");
                    splice(&seed.body, &names(&["user"]), raw.as_bytes())
                }
                1 => {
                    let n = 1 + rng.below(3_000);
                    let extra: String = (0..n).map(|i| format!(", \"k{i}\": {i}")).collect();
                    let raw = format!("\"u\"{extra}");
                    splice(&seed.body, &names(&["user"]), raw.as_bytes())
                }
                2 => {
                    // A field the request knows, given twice (the first value wrong).
                    let field = *rng.pick(&["model", "max_tokens", "n", "stream", "prompt"]);
                    let raw = format!("\"u\", \"{field}\": \"wrong\", \"{field}\": 2");
                    splice(&seed.body, &names(&["user"]), raw.as_bytes())
                }
                _ => {
                    let at = *rng.pick(&[
                        &["spot", "draft"][..],
                        &["stream_options", "x"],
                        &["messages", "0", "x"],
                    ]);
                    let path: Vec<Key> = at
                        .iter()
                        .map(|k| match k.parse() {
                            Ok(i) => Key::At(i),
                            Err(_) => Key::Name(k.to_string()),
                        })
                        .collect();
                    splice(&seed.body, &path, b"1")
                }
            };
            ("body: unknown field".into(), e, bytes)
        }
        // The body sent to the other endpoint.
        _ => ("body: other endpoint".into(), e.other(), clean),
    }
}

/// Valid bodies made invalid by one field, which the 400 must name.
const PROBES: &[(&str, &str)] = &[
    ("n", "5"),
    ("temperature", "-1"),
    ("max_tokens", "0"),
    ("seed", "-1"),
    ("top_p", "0.5"),
    ("stop", "[\"\"]"),
    ("spot_probe", "1"),
];

/// `seed` refused for its `k`th probe field: the body and what it must be answered with.
fn probe(seed: &SeedBody, k: usize) -> (Vec<u8>, Answer) {
    let (field, raw) = PROBES[k % PROBES.len()];
    (
        splice(&seed.body, &names(&[field]), raw.as_bytes()),
        Answer::Refused(field),
    )
}

/// A body for an HTTP-level case: mostly a probe (cheap, and its 400 names the field), some
/// seeds as they are (decoded), some damaged.
fn some_body(seeds: &[SeedBody], rng: &mut Rng) -> (Endpoint, Vec<u8>, Answer) {
    let k = rng.below(seeds.len());
    let seed = &seeds[k];
    match rng.below(100) {
        0..86 => {
            let (body, answer) = probe(seed, rng.below(PROBES.len()));
            (seed.endpoint, body, answer)
        }
        86..92 => (
            seed.endpoint,
            serde_json::to_vec(&seed.body).expect("JSON"),
            Answer::Seed(k),
        ),
        _ => {
            let (_, e, b) = damaged_body(seed, rng);
            (e, b, Answer::Any)
        }
    }
}

// ----------------------------------------------------------------------------------------
// HTTP damage

fn content_length(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, _) = some_body(seeds, rng);
    let n = body.len();
    let mut req = Req::post(e.path(), body);
    let mut set = |v: &str| req.header("content-length", Some(v.as_bytes()));
    match rng.below(8) {
        0 => {
            // Shorter than the body: the rest is the next "request".
            set(&rng.below(n.max(1)).to_string());
            Case::one("http: content-length short", Step::of(&req, Some(e)))
        }
        1 => {
            set(&(n + 1 + rng.below(1_000)).to_string());
            Case::one(
                "http: content-length long, half-closed",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        2 => {
            set(&(n + 1 + rng.below(1_000)).to_string());
            Case::one(
                "http: content-length long, stalled",
                Step::of(&req, Some(e)).malformed().then(Then::Stall),
            )
        }
        3 => {
            // Over the body limit, most of it never sent.
            let lie = *rng.pick(&[MAX_BODY as u64 + 1, 1 << 30, 1 << 40, i64::MAX as u64]);
            set(&lie.to_string());
            Case::one(
                "http: content-length huge, stalled",
                Step::of(&req, Some(e)).malformed().then(Then::Stall),
            )
        }
        4 => {
            req.header("content-length", None);
            Case::one("http: content-length missing", Step::of(&req, Some(e)))
        }
        5 => {
            let v = *rng.pick(&[
                "abc",
                "-1",
                "+5",
                "1e3",
                "0x10",
                " ",
                "",
                "18446744073709551616",
                "99999999999999999999999999",
                "5, 6",
                "\u{ff}",
            ]);
            set(v);
            Case::one(
                "http: content-length invalid",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        6 => {
            // Two of them, equal or not.
            let other = if rng.below(2) == 0 { n } else { n / 2 };
            req.headers
                .push(format!("content-length: {other}").into_bytes());
            Case::one(
                "http: content-length twice",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        _ => {
            // Both a length and chunked framing (request smuggling's classic).
            req.headers.push(b"transfer-encoding: chunked".to_vec());
            Case::one(
                "http: content-length and chunked",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
    }
}

/// `body` in chunks of random sizes (hex upper or lower case, sometimes zero-padded, sometimes
/// with an extension), ending with the last chunk and maybe a trailer.
fn chunked(body: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let len = (1 + rng.below(body.len().min(4_096))).min(body.len() - at);
        let size = match rng.below(4) {
            0 => format!("{len:X}"),
            1 => format!("000{len:x}"),
            2 => format!("{len:x};ext=1"),
            _ => format!("{len:x}"),
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&body[at..at + len]);
        out.extend_from_slice(b"\r\n");
        at += len;
    }
    out.extend_from_slice(b"0\r\n");
    if rng.below(4) == 0 {
        out.extend_from_slice(b"x-trailer: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn chunked_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, answer) = some_body(seeds, rng);
    let mut req = Req::post(e.path(), Vec::new());
    req.header("content-length", None);
    req.header("transfer-encoding", Some(b"chunked"));
    let good = chunked(&body, rng);
    let last = good.len().saturating_sub(5); // where "0\r\n\r\n" starts, without a trailer
    match rng.below(9) {
        0 | 1 => {
            req.body = good;
            Case::one("http: chunked", Step::of(&req, Some(e)).answer(answer))
        }
        2 => {
            // Over the limit in chunks.
            req.body = chunked(&vec![b' '; MAX_BODY + 1 + rng.below(MAX_BODY)], rng);
            Case::one("http: chunked over the limit", Step::of(&req, Some(e)))
        }
        3 => {
            let size = *rng.pick(&["zz", "-1", "ffffffffffffffffff", "1 1", "", "0x10", "+1"]);
            req.body = [size.as_bytes(), b"\r\n", &body, b"\r\n0\r\n\r\n"].concat();
            Case::one(
                "http: chunk size invalid",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        4 => {
            // A chunk that says more than it holds.
            let size = body.len() + 1 + rng.below(100);
            req.body = [format!("{size:x}\r\n").as_bytes(), &body, b"\r\n0\r\n\r\n"].concat();
            Case::one(
                "http: chunk longer than its data",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        5 => {
            req.body = good[..last.min(good.len())].to_vec();
            let then = *rng.pick(&[Then::HalfClose, Then::Stall]);
            Case::one(
                "http: chunked without the last chunk",
                Step::of(&req, Some(e)).malformed().then(then),
            )
        }
        6 => {
            // A chunk's data without its line end.
            req.body = [
                format!("{:x}\r\n", body.len()).as_bytes(),
                &body,
                b"0\r\n\r\n",
            ]
            .concat();
            Case::one(
                "http: chunk without line end",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        7 => {
            let te = *rng.pick(&[
                "gzip",
                "chunked, gzip",
                "gzip, chunked",
                "identity",
                "Chunked",
                "chunked, chunked",
                "x-unknown",
            ]);
            req.header("transfer-encoding", Some(te.as_bytes()));
            req.body = good;
            Case::one(
                "http: transfer-encoding other",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        _ => {
            // A chunk-size line far longer than any size.
            req.body = [
                "0".repeat(1 + rng.below(20_000)).as_bytes(),
                format!("{:x}\r\n", body.len()).as_bytes(),
                &body,
                b"\r\n0\r\n\r\n",
            ]
            .concat();
            Case::one(
                "http: chunk size line long",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
    }
}

fn auth_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, answer) = some_body(seeds, rng);
    let mut req = Req::post(e.path(), body);
    let long = format!("Bearer {}", "k".repeat(1 + rng.below(20_000)));
    let keyed = |s: &str| s.replace("KEY", KEY).into_bytes();
    // (value, carries the key, well-framed)
    let (value, authorized, framed): (Option<Vec<u8>>, Option<bool>, bool) = match rng.below(20) {
        0 => (None, Some(false), true),
        1 => (Some(keyed("Bearer")), Some(false), true),
        2 => (Some(keyed("Bearer ")), Some(false), true),
        3 => (Some(keyed("Bearer wrong")), Some(false), true),
        4 => (Some(keyed("bearer KEY")), Some(false), true),
        5 => (Some(keyed("BEARER KEY")), Some(false), true),
        6 => (Some(keyed("Bearer  KEY")), Some(false), true),
        7 => (Some(keyed("Bearer KEYx")), Some(false), true),
        8 => (Some(keyed("Bearer hostile-ke")), Some(false), true),
        9 => (Some(keyed("Basic aG9zdGlsZS1rZXk6")), Some(false), true),
        10 => (Some(keyed("KEY")), Some(false), true),
        11 => (Some(b"Bearer \xff\xfe".to_vec()), Some(false), true),
        12 => (Some(keyed("Bearer KEY\0")), Some(false), false),
        13 => (Some(long.into_bytes()), Some(false), true),
        14 => (Some(keyed("Token KEY")), Some(false), true),
        15 => (Some(keyed("Bearer KEY, Bearer KEY")), Some(false), true),
        16 => (Some(keyed("Bearer\tKEY")), Some(false), true),
        // Trailing white space is not part of a header value: either answer is right.
        17 => (Some(keyed("Bearer KEY ")), None, true),
        18 => {
            // Two headers, the wrong one first or last.
            let (a, b) = if rng.below(2) == 0 {
                ("wrong", KEY)
            } else {
                (KEY, "wrong")
            };
            req.header("authorization", Some(format!("Bearer {a}").as_bytes()));
            req.headers
                .push(format!("authorization: Bearer {b}").into_bytes());
            return Case::one(
                "http: authorization twice",
                Step {
                    authorized: None,
                    ..Step::of(&req, Some(e)).answer(answer)
                },
            );
        }
        _ => {
            // `/health` needs no key (and takes no body).
            req.line = b"GET /health HTTP/1.1".to_vec();
            req.header("authorization", None);
            return Case::one(
                "http: health without a key",
                Step {
                    authorized: None,
                    ..Step::of(&req, None)
                },
            );
        }
    };
    req.header("authorization", value.as_deref());
    // Sometimes a route without a body: the key guards them too.
    let mut endpoint = Some(e);
    if rng.below(4) == 0 {
        let route = *rng.pick(&["/stats", "/v1/models", "/metrics"]);
        req.line = format!("GET {route} HTTP/1.1").into_bytes();
        endpoint = None;
    }
    let step = Step {
        authorized,
        framed,
        then: if framed { Then::Read } else { Then::HalfClose },
        ..Step::of(&req, endpoint).answer(answer)
    };
    Case::one("http: authorization", step)
}

fn header_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, answer) = some_body(seeds, rng);
    let mut req = Req::post(e.path(), body);
    match rng.below(6) {
        0 => {
            let size = *rng.pick(&[4usize << 10, 16 << 10, 60 << 10, 300 << 10, 1 << 20]);
            req.headers
                .push([b"x-pad: ".as_slice(), &vec![b'a'; size]].concat());
            let step = Step::of(&req, Some(e)).answer(answer);
            let step = if size > 60 << 10 {
                step.malformed().then(Then::HalfClose)
            } else {
                step
            };
            Case::one("http: huge header", step)
        }
        1 => {
            let count = *rng.pick(&[20usize, 95, 100, 101, 1_000, 10_000]);
            for i in 0..count {
                req.headers.push(format!("x-h{i}: {i}").into_bytes());
            }
            let step = Step::of(&req, Some(e)).answer(answer);
            let step = if count > 20 {
                step.malformed().then(Then::HalfClose)
            } else {
                step
            };
            Case::one("http: many headers", step)
        }
        2 => {
            let bads: [&[u8]; 9] = [
                b"x-bad header: 1",
                b"x-bad : 1",
                b"no colon here",
                b"(x): 1",
                b": empty name",
                b"x-\xc3\xa9: 1",
                b"x-nul: a\0b",
                b"x-cr: a\rb",
                b" x-leading-space: 1",
            ];
            let bad = *rng.pick(&bads);
            let at = rng.below(req.headers.len() + 1);
            req.headers.insert(at, bad.to_vec());
            Case::one(
                "http: header syntax",
                Step::of(&req, Some(e)).malformed().then(Then::HalfClose),
            )
        }
        3 => {
            // Framing the server may take or refuse: folded lines, bare line feeds, no host,
            // two hosts.
            let mut bytes = req.bytes();
            match rng.below(4) {
                0 => {
                    let at = rng.below(req.headers.len());
                    req.headers[at].extend_from_slice(b"\r\n  folded");
                    bytes = req.bytes();
                }
                1 => {
                    let head_end = bytes
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map_or(0, |p| p + 4);
                    let mut head: Vec<u8> = bytes[..head_end]
                        .iter()
                        .copied()
                        .filter(|&b| b != b'\r')
                        .collect();
                    head.extend_from_slice(&bytes[head_end..]);
                    bytes = head;
                }
                2 => {
                    req.header("host", None);
                    bytes = req.bytes();
                }
                _ => {
                    req.headers.push(b"host: example.com".to_vec());
                    bytes = req.bytes();
                }
            }
            Case::one(
                "http: header framing",
                Step {
                    bytes,
                    ..Step::of(&req, Some(e)).malformed().then(Then::HalfClose)
                },
            )
        }
        4 => {
            // Valid but odd: values that are not UTF-8 or ASCII, tabs, a long name, other
            // content types, `Expect`.
            let odd: Vec<u8> = match rng.below(9) {
                0 => b"x-obs: \xff\xfe\x80".to_vec(),
                1 => b"x-tab:\tvalue\t".to_vec(),
                2 => [
                    "x-".repeat(1 + rng.below(5_000)).as_bytes(),
                    b"name: 1".as_slice(),
                ]
                .concat(),
                3 => b"content-type: text/plain".to_vec(),
                4 => b"content-type: multipart/form-data; boundary=x".to_vec(),
                5 => b"content-type: application/json; charset=utf-16".to_vec(),
                6 => b"expect: 100-continue".to_vec(),
                7 => b"expect: 200-ok".to_vec(),
                _ => b"content-encoding: gzip".to_vec(),
            };
            if odd.starts_with(b"content-type") {
                req.header("content-type", None);
            }
            // A server may decode a gzip body (and refuse this one as such).
            let answer = if odd.starts_with(b"content-encoding") {
                Answer::Any
            } else {
                answer
            };
            req.headers.push(odd);
            Case::one(
                "http: odd header value",
                Step::of(&req, Some(e)).answer(answer),
            )
        }
        _ => {
            req.header("content-type", None);
            Case::one(
                "http: no content-type",
                Step::of(&req, Some(e)).answer(answer),
            )
        }
    }
}

fn line_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, answer) = some_body(seeds, rng);
    let mut req = Req::post(e.path(), body);
    let line = |m: &str, p: &str, v: &str| format!("{m} {p} {v}").into_bytes();
    match rng.below(3) {
        0 => {
            let (method, framed) = *rng.pick(&[
                ("GET", true),
                ("PUT", true),
                ("DELETE", true),
                ("PATCH", true),
                ("OPTIONS", true),
                ("HEAD", true),
                ("TRACE", true),
                ("post", true),
                ("FOO", true),
                ("P\0ST", false),
                ("", false),
                ("CONNECT", false),
                (
                    "POSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOSTPOST",
                    true,
                ),
            ]);
            req.line = line(method, e.path(), "HTTP/1.1");
            let step = Step {
                head: method == "HEAD",
                ..Step::of(&req, None).answer(answer)
            };
            let step = if framed {
                step
            } else {
                step.malformed().then(Then::HalfClose)
            };
            Case::one("http: method", step)
        }
        1 => {
            // (path, routed to the seed's endpoint, well-framed)
            let p = e.path();
            let long = |n: usize| format!("/{}", "a".repeat(n));
            let (path, same, framed): (String, bool, bool) = match rng.below(22) {
                0 => (format!("{p}?x=1&y"), true, true),
                1 => (format!("{p}?"), true, true),
                2 => (format!("{p}/"), false, true),
                3 => (format!("/{p}"), false, true),
                4 => (p.to_uppercase(), false, true),
                5 => (format!("{p}/../completions"), false, true),
                6 => (p.replace('c', "%63"), false, true),
                7 => (format!("{p}%00"), false, true),
                8 => (format!("{p};x"), false, true),
                9 => ("/".into(), false, true),
                10 => ("/v1/models".into(), false, true),
                11 => ("/stats".into(), false, true),
                12 => ("/metrics".into(), false, true),
                13 => ("/health".into(), false, true),
                14 => (format!("http://127.0.0.1{p}"), true, false),
                15 => ("*".into(), false, false),
                16 => (long(10_000), false, true),
                17 => (long(70_000), false, false),
                18 => (format!("{p}#frag"), false, false),
                19 => (format!("{p}\0"), false, false),
                20 => (format!("{p} x"), false, false),
                _ => ("/v1/\u{ff}".into(), false, false),
            };
            req.line = line("POST", &path, "HTTP/1.1");
            let step = Step {
                authorized: if path == "/health" { None } else { Some(true) },
                ..Step::of(&req, same.then_some(e)).answer(answer)
            };
            let step = if framed {
                step
            } else {
                step.malformed().then(Then::HalfClose)
            };
            Case::one("http: path", step)
        }
        _ => {
            let version = *rng.pick(&[
                "HTTP/1.0",
                "HTTP/2.0",
                "HTTP/1.2",
                "HTTP/9.9",
                "HTTP/1",
                "http/1.1",
                "HTTP/1.1 x",
                "",
                "HTTPS/1.1",
            ]);
            req.line = line("POST", e.path(), version);
            let step = Step::of(&req, Some(e)).answer(answer);
            let step = if version == "HTTP/1.0" {
                step
            } else {
                step.malformed().then(Then::HalfClose)
            };
            Case::one("http: version", step)
        }
    }
}

/// Two to four requests on one connection: one after another, or pipelined (all written
/// before the first answer is read); every answer must be its own request's.
fn keep_alive_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let n = 2 + rng.below(3);
    let first = rng.below(PROBES.len());
    let mut steps = Vec::new();
    for k in 0..n {
        // Probes refused for distinct fields, seeds (decoded) and damaged bodies, mixed.
        let s = rng.below(seeds.len());
        let seed = &seeds[s];
        let (e, body, answer) = match rng.below(4) {
            0 => {
                let (_, e, b) = damaged_body(seed, rng);
                (e, b, Answer::Any)
            }
            1 => (
                seed.endpoint,
                serde_json::to_vec(&seed.body).expect("JSON"),
                Answer::Seed(s),
            ),
            _ => {
                let (b, answer) = probe(seed, first + k);
                (seed.endpoint, b, answer)
            }
        };
        let mut req = Req::post(e.path(), body);
        if k + 1 < n {
            req.header("connection", None);
        }
        steps.push(Step::of(&req, Some(e)).answer(answer));
    }
    let pipelined = rng.below(2) == 0;
    Case {
        class: if pipelined {
            "http: pipelined"
        } else {
            "http: keep-alive"
        }
        .into(),
        steps,
        pipelined,
    }
}

/// A request cut short: the connection half-closed (the server sees the end) or dropped.
fn truncated_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, _) = some_body(seeds, rng);
    let req = Req::post(e.path(), body);
    let bytes = req.bytes();
    let line = req.line.len() + 2;
    let head = bytes.len() - req.body.len();
    let (class, cut) = match rng.below(3) {
        0 => ("truncated: request line", 1 + rng.below(line - 1)),
        1 => ("truncated: headers", line + rng.below(head - line)),
        _ => ("truncated: body", head + rng.below(req.body.len().max(1))),
    };
    let then = *rng.pick(&[Then::HalfClose, Then::Abandon]);
    Case::one(
        class,
        Step {
            bytes: bytes[..cut.min(bytes.len())].to_vec(),
            ..Step::of(&req, Some(e)).malformed().then(then)
        },
    )
}

/// A connection that goes quiet (nothing, half the headers, no body, all but the last byte),
/// dropped by the client after [`STALL`].
fn stalled_case(seeds: &[SeedBody], rng: &mut Rng) -> Case {
    let (e, body, _) = some_body(seeds, rng);
    let req = Req::post(e.path(), body);
    let bytes = req.bytes();
    let head = bytes.len() - req.body.len();
    let cut = match rng.below(4) {
        0 => 0,
        1 => rng.below(head),
        2 => head,
        _ => bytes.len() - 1,
    };
    Case::one(
        "stalled",
        Step {
            bytes: bytes[..cut].to_vec(),
            ..Step::of(&req, Some(e)).malformed().then(Then::Stall)
        },
    )
}

/// Case `i` of the stream: from its index and the stream's seed alone.
fn case(i: usize, seeds: &[SeedBody]) -> Case {
    let mut rng = Rng::new(
        stream_seed()
            .wrapping_mul(0x2545_F491_4F6C_DD1D)
            .wrapping_add(i as u64)
            ^ 0x7265_7175_6573_7473,
    );
    rng.next();
    match rng.below(1000) {
        0..600 => {
            let seed = rng.pick(seeds);
            let (class, e, body) = damaged_body(seed, &mut rng);
            let mut req = Req::post(e.path(), body);
            if rng.below(16) == 0 {
                // The same, kept alive, the client's writing half closed after it.
                req.header("connection", None);
                return Case::one(class, Step::of(&req, Some(e)).then(Then::HalfClose));
            }
            Case::one(class, Step::of(&req, Some(e)))
        }
        600..680 => content_length(seeds, &mut rng),
        680..740 => chunked_case(seeds, &mut rng),
        740..810 => auth_case(seeds, &mut rng),
        810..870 => header_case(seeds, &mut rng),
        870..930 => line_case(seeds, &mut rng),
        930..960 => keep_alive_case(seeds, &mut rng),
        960..975 => truncated_case(seeds, &mut rng),
        975..982 => stalled_case(seeds, &mut rng),
        982..988 => {
            // A valid request whose client goes away at once: its decodes are cancelled.
            let seed = rng.pick(seeds);
            let req = Req::post(
                seed.endpoint.path(),
                serde_json::to_vec(&seed.body).expect("JSON"),
            );
            Case::one(
                "abandoned",
                Step::of(&req, Some(seed.endpoint)).then(Then::Abandon),
            )
        }
        _ => {
            // A slow client: the request in pieces.
            let (e, body, answer) = some_body(seeds, &mut rng);
            let req = Req::post(e.path(), body);
            Case::one(
                "slow client",
                Step {
                    pieces: 2 + rng.below(7),
                    ..Step::of(&req, Some(e)).answer(answer)
                },
            )
        }
    }
}

// ----------------------------------------------------------------------------------------
// Reading answers

/// An HTTP answer.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What reading an answer gave.
enum Got {
    Answer(Response),
    /// The server closed (or reset) the connection before any byte of an answer.
    Closed,
    /// It closed in the middle of one (the bytes so far).
    Cut(Vec<u8>),
    /// Not a valid HTTP/1.1 answer.
    Garbage(String),
    TimedOut,
}

/// A client connection with the bytes read and not yet consumed.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes read in all.
    read: usize,
}

impl Conn {
    /// Reads more; `Ok(false)` at the end of the stream (or a reset), `Err` past `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<bool, ()> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(());
            }
            self.stream.set_read_timeout(Some(left)).map_err(|_| ())?;
            let mut chunk = [0u8; 16 << 10];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.read += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(());
                }
                Err(_) => return Ok(false),
            }
        }
    }

    /// Fills until the buffer holds `n` bytes.
    fn need(&mut self, n: usize, deadline: Instant) -> Result<(), Got> {
        while self.buf.len() < n {
            match self.fill(deadline) {
                Ok(true) => {}
                Ok(false) => return Err(Got::Cut(self.buf.clone())),
                Err(()) => return Err(Got::TimedOut),
            }
        }
        Ok(())
    }

    /// The position of the next CRLF at or after `from`.
    fn line_end(&mut self, from: usize, deadline: Instant) -> Result<usize, Got> {
        loop {
            if let Some(p) = self.buf[from.min(self.buf.len())..]
                .windows(2)
                .position(|w| w == b"\r\n")
            {
                return Ok(from + p);
            }
            if self.buf.len() > from + (1 << 20) {
                return Err(Got::Garbage("a line over 1 MiB".into()));
            }
            let len = self.buf.len();
            self.need(len + 1, deadline)?;
        }
    }

    /// The next answer (1xx answers skipped); the bytes after it stay for the next.
    fn response(&mut self, head_only: bool, deadline: Instant) -> Got {
        let (had, before) = (!self.buf.is_empty(), self.read);
        match self.try_response(head_only, deadline) {
            Ok(r) => Got::Answer(r),
            Err(Got::Cut(_)) if !had && self.read == before => Got::Closed,
            Err(g) => g,
        }
    }

    fn try_response(&mut self, head_only: bool, deadline: Instant) -> Result<Response, Got> {
        loop {
            let end = loop {
                if let Some(p) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break p;
                }
                if self.buf.len() > 1 << 20 {
                    return Err(Got::Garbage("a head over 1 MiB".into()));
                }
                let len = self.buf.len();
                self.need(len + 1, deadline)?;
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
            self.buf.drain(..end + 4);
            let mut lines = head.split("\r\n");
            let status_line = lines.next().unwrap_or_default();
            let mut parts = status_line.splitn(3, ' ');
            let version = parts.next().unwrap_or_default();
            let status: u16 = match parts.next().and_then(|s| s.parse().ok()) {
                Some(s) if version.starts_with("HTTP/1.") && (100..600).contains(&s) => s,
                _ => return Err(Got::Garbage(format!("status line {status_line:?}"))),
            };
            let mut headers = Vec::new();
            for l in lines {
                let Some((k, v)) = l.split_once(':') else {
                    return Err(Got::Garbage(format!("header line {l:?}")));
                };
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
            if (100..200).contains(&status) {
                continue;
            }
            let mut r = Response {
                status,
                headers,
                body: Vec::new(),
            };
            if head_only || status == 204 || status == 304 {
                return Ok(r);
            }
            if r.header("transfer-encoding")
                .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
            {
                loop {
                    let end = self.line_end(0, deadline)?;
                    let line = String::from_utf8_lossy(&self.buf[..end]).to_string();
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size, 16)
                        .map_err(|_| Got::Garbage(format!("chunk size {line:?}")))?;
                    self.buf.drain(..end + 2);
                    if size == 0 {
                        // Trailers, up to an empty line.
                        loop {
                            let end = self.line_end(0, deadline)?;
                            self.buf.drain(..end + 2);
                            if end == 0 {
                                return Ok(r);
                            }
                        }
                    }
                    self.need(size + 2, deadline)?;
                    r.body.extend_from_slice(&self.buf[..size]);
                    self.buf.drain(..size + 2);
                }
            }
            if let Some(len) = r.header("content-length") {
                let len: usize = len
                    .parse()
                    .map_err(|_| Got::Garbage(format!("content-length {len:?}")))?;
                self.need(len, deadline)?;
                r.body = self.buf.drain(..len).collect();
                return Ok(r);
            }
            // Neither: the body runs to the close.
            loop {
                match self.fill(deadline) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(()) => return Err(Got::TimedOut),
                }
            }
            r.body = std::mem::take(&mut self.buf);
            return Ok(r);
        }
    }
}

/// What the cases share: the server's address, the ids answered so far, and each seed's
/// texts before the barrage.
struct Ctx {
    addr: SocketAddr,
    ids: Mutex<HashSet<String>>,
    answers: Vec<Vec<String>>,
}

/// What the client saw of an answer.
struct Seen {
    /// The outcome's label.
    label: String,
    /// Choices a 200 finished.
    choices: usize,
    /// The texts of a 200's choices, by index.
    texts: Vec<String>,
}

/// Checks one answer against its step; the outcome, or why it fails.
fn check(r: &Response, step: &Step, ctx: &Ctx) -> Result<Seen, String> {
    let status = r.status;
    let seen = |label: String| Seen {
        label,
        choices: 0,
        texts: Vec::new(),
    };
    if status >= 500 {
        return Err(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&r.body[..r.body.len().min(500)])
        ));
    }
    if (200..300).contains(&status) && step.authorized == Some(false) {
        return Err(format!("answered {status} without a valid key"));
    }
    if (400..500).contains(&status) {
        if r.body.is_empty() {
            return Ok(seen(format!("{status} no body")));
        }
        let v: Value = serde_json::from_slice(&r.body).map_err(|_| {
            format!(
                "a {status} whose body is not JSON: {:?}",
                String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
            )
        })?;
        if !v["error"]["message"].is_string() {
            return Err(format!("a {status} without OpenAI's error body: {v}"));
        }
        if v["error"]["type"] == "server_error" {
            return Err(format!("a {status} of type server_error: {v}"));
        }
        if let Answer::Refused(p) = step.answer
            && status == 400
            && v["error"]["param"] != p
        {
            return Err(format!(
                "a 400 for a body refused for `{p}` names another field (a misread or \
                 crossed body?): {v}"
            ));
        }
        return Ok(seen(match v["error"]["code"].as_str() {
            Some(code) => format!("{status} {code}"),
            None => format!("{status}"),
        }));
    }
    if status != 200 {
        return Err(format!("answered {status}"));
    }
    let Some(e) = step.endpoint else {
        return Ok(seen("200 other route".into()));
    };
    if let Answer::Refused(p) = step.answer {
        return Err(format!(
            "a 200 for a body refused for `{p}` (a crossed answer?)"
        ));
    }
    if step.head {
        return Ok(seen("200 head".into()));
    }
    let fresh = |id: &Value| -> Result<(), String> {
        let id = id.as_str().ok_or("an answer without an id")?;
        let mut ids = ctx.ids.lock().map_err(|_| "ids poisoned")?;
        if !ids.insert(id.to_string()) {
            return Err(format!(
                "the id {id} was answered before (a crossed answer?)"
            ));
        }
        Ok(())
    };
    let streamed = r
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let mut texts: Vec<String> = Vec::new();
    let mut add = |i: &Value, text: &Value| {
        let i = i.as_u64().unwrap_or(u64::MAX) as usize;
        if let Some(t) = text.as_str()
            && i < 1 << 10
        {
            if texts.len() <= i {
                texts.resize(i + 1, String::new());
            }
            texts[i].push_str(t);
        }
    };
    let (label, choices) = if !streamed {
        let v: Value = serde_json::from_slice(&r.body)
            .map_err(|err| format!("a 200 whose body is not JSON ({err})"))?;
        if v["object"] != e.object(false) {
            return Err(format!(
                "a 200 for {} is not a {}: {v}",
                e.path(),
                e.object(false)
            ));
        }
        let choices = v["choices"].as_array().ok_or(format!("no choices: {v}"))?;
        if choices.is_empty() {
            return Err(format!("a 200 with no choices: {v}"));
        }
        for (i, c) in choices.iter().enumerate() {
            let text = match e {
                Endpoint::Completions => &c["text"],
                Endpoint::Chat => &c["message"]["content"],
            };
            let finish = c["finish_reason"].as_str();
            if c["index"] != i || !text.is_string() || !matches!(finish, Some("stop" | "length")) {
                return Err(format!("choice {i} is malformed: {v}"));
            }
            add(&c["index"], text);
        }
        fresh(&v["id"])?;
        ("200", choices.len())
    } else {
        // Server-sent events: JSON chunks of the endpoint's object, then `[DONE]`.
        let text = String::from_utf8_lossy(&r.body).to_string();
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        if data.last() != Some(&"[DONE]") {
            return Err(format!("a stream that does not end with [DONE]: {text:?}"));
        }
        let mut finished = 0;
        let mut id = None;
        for d in &data[..data.len() - 1] {
            let v: Value = serde_json::from_str(d)
                .map_err(|err| format!("a stream chunk not JSON ({err}): {d}"))?;
            if !v["error"].is_null() {
                return Err(format!("a stream that ends in an error: {v}"));
            }
            if v["object"] != e.object(true) {
                return Err(format!(
                    "a chunk for {} is not a {}: {v}",
                    e.path(),
                    e.object(true)
                ));
            }
            match &id {
                None => id = Some(v["id"].clone()),
                Some(first) if *first != v["id"] => {
                    return Err(format!("one stream with two ids: {first} and {}", v["id"]));
                }
                Some(_) => {}
            }
            for c in v["choices"].as_array().into_iter().flatten() {
                finished += usize::from(c["finish_reason"].is_string());
                match e {
                    Endpoint::Completions => add(&c["index"], &c["text"]),
                    Endpoint::Chat => add(&c["index"], &c["delta"]["content"]),
                }
            }
        }
        if finished == 0 {
            return Err(format!("a stream that finished no choice: {text:?}"));
        }
        fresh(id.as_ref().unwrap_or(&Value::Null))?;
        ("200 stream", finished)
    };
    if let Answer::Seed(k) = step.answer
        && let Some(want) = ctx.answers.get(k)
        && *want != texts
    {
        return Err(format!(
            "seed {k} is answered {texts:?}, and was answered {want:?} before the barrage \
             (a crossed answer?)"
        ));
    }
    Ok(Seen {
        label: label.into(),
        choices,
        texts,
    })
}

/// A request's bytes for a failure message: the first 300, escaped.
fn show(b: &[u8]) -> String {
    let head = String::from_utf8_lossy(&b[..b.len().min(300)])
        .escape_debug()
        .to_string();
    if b.len() > 300 {
        format!("{head}… ({} bytes)", b.len())
    } else {
        head
    }
}

/// What one case gave: an outcome label per step, failures, choices finished.
#[derive(Default)]
struct Ran {
    outcomes: Vec<String>,
    failures: Vec<String>,
    choices: usize,
    /// The last answer's texts.
    texts: Vec<String>,
}

/// Runs case `i` on a fresh connection.
fn run_case(ctx: &Ctx, case: &Case) -> Ran {
    let mut ran = Ran::default();
    let stream = match TcpStream::connect(ctx.addr) {
        Ok(s) => s,
        Err(e) => {
            ran.failures.push(format!("cannot connect: {e}"));
            return ran;
        }
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(CASE_TIMEOUT));
    let mut conn = Conn {
        stream,
        buf: Vec::new(),
        read: 0,
    };
    let start = Instant::now();
    let mut previous: Option<u16> = None;
    if case.pipelined {
        let all: Vec<u8> = case.steps.iter().flat_map(|s| s.bytes.clone()).collect();
        let _ = conn.stream.write_all(&all);
    }
    for step in &case.steps {
        let size = step.bytes.len().div_ceil(step.pieces.max(1)).max(1);
        let pieces = if case.pipelined {
            &[][..]
        } else {
            &step.bytes[..]
        };
        for (k, piece) in pieces.chunks(size).enumerate() {
            if k > 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            // A failed write (the server closed first) still reads what was answered.
            if conn.stream.write_all(piece).is_err() {
                break;
            }
        }
        let deadline = match step.then {
            Then::Abandon => {
                ran.outcomes.push("abandoned".into());
                return ran;
            }
            Then::HalfClose => {
                let _ = conn.stream.shutdown(Shutdown::Write);
                start + CASE_TIMEOUT
            }
            Then::Stall => Instant::now() + STALL,
            Then::Read => start + CASE_TIMEOUT,
        };
        let stall = step.then == Then::Stall;
        let fail = |why: String| format!("{why}\n    request: {}", show(&step.bytes));
        match conn.response(step.head, deadline) {
            Got::Answer(r) => match check(&r, step, ctx) {
                Ok(seen) => {
                    ran.choices += seen.choices;
                    ran.texts = seen.texts;
                    ran.outcomes.push(if stall {
                        format!("stalled, answered {}", seen.label)
                    } else {
                        seen.label
                    });
                    previous = Some(r.status);
                    if r.header("connection")
                        .is_some_and(|c| c.eq_ignore_ascii_case("close"))
                    {
                        break;
                    }
                }
                Err(why) => {
                    ran.failures.push(fail(why));
                    return ran;
                }
            },
            Got::TimedOut if stall => {
                ran.outcomes.push("stalled, dropped".into());
                return ran;
            }
            Got::TimedOut => {
                ran.failures.push(fail(format!(
                    "no answer within {:?} (a hang?)",
                    CASE_TIMEOUT
                )));
                return ran;
            }
            Got::Closed if stall => {
                ran.outcomes.push("stalled, closed by server".into());
                return ran;
            }
            Got::Closed if !step.framed => {
                ran.outcomes.push("closed by server".into());
                return ran;
            }
            // A client that closes its writing half has gone away for hyper (`half_close`
            // is off): a request still in flight then is cancelled, not answered.
            Got::Closed if step.then == Then::HalfClose => {
                ran.outcomes.push("half-closed, closed by server".into());
                return ran;
            }
            // A connection kept alive may be closed after an answer that was not a 200.
            Got::Closed if previous.is_some_and(|s| s != 200) => {
                ran.outcomes.push("closed by server after an error".into());
                return ran;
            }
            Got::Closed => {
                ran.failures.push(fail(
                    "closed without answering a well-framed request".into(),
                ));
                return ran;
            }
            // The server reads a half-close as the client leaving (it cancels the request's
            // decode), so the answer may be cut as well as missing.
            Got::Cut(b) if step.then == Then::HalfClose => {
                ran.outcomes
                    .push(format!("half-closed, cut by server ({} bytes)", b.len()));
                return ran;
            }
            Got::Cut(b) if !step.framed || stall => {
                ran.outcomes
                    .push(format!("closed mid-answer ({} bytes)", b.len()));
                return ran;
            }
            Got::Cut(b) => {
                ran.failures
                    .push(fail(format!("closed mid-answer: {}", show(&b))));
                return ran;
            }
            Got::Garbage(why) => {
                ran.failures
                    .push(fail(format!("not an HTTP answer: {why}")));
                return ran;
            }
        }
    }
    ran
}

// ----------------------------------------------------------------------------------------
// The test

/// A valid request's answer (the key given): status and JSON body.
fn send(addr: SocketAddr, req: &Req) -> (u16, Value) {
    let mut conn = Conn {
        stream: TcpStream::connect(addr).expect("connect"),
        buf: Vec::new(),
        read: 0,
    };
    conn.stream.write_all(&req.bytes()).expect("write");
    match conn.response(false, Instant::now() + Duration::from_secs(60)) {
        Got::Answer(r) => (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        ),
        _ => panic!("no answer to {}", show(&req.bytes())),
    }
}

/// Waits until the engine holds no request.
fn settle(server: &Server) -> spot_serve::EngineStats {
    let t0 = Instant::now();
    loop {
        let st = server.stats();
        if st.live == 0 && st.queued == 0 {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never idle: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Default)]
struct Tally {
    cases: usize,
    /// outcome -> count
    outcomes: BTreeMap<String, usize>,
    /// (class, outcome) -> count
    by_class: BTreeMap<(String, String), usize>,
    failures: Vec<String>,
    choices: usize,
    slowest: (Duration, usize),
    /// class -> (cases, time spent)
    time: BTreeMap<String, (usize, Duration)>,
}

/// At least 10,000 damaged requests (module docs).
#[test]
fn hostile_requests() {
    count_server_panics();
    // The hook counts a panic on a thread named as the server's (so zero below means none).
    let probe = std::thread::Builder::new()
        .name("spot-hook-check".into())
        .spawn(|| panic!("a deliberate panic: the hostile suite checks its panic hook"))
        .expect("spawn");
    assert!(probe.join().is_err());
    let caught = std::mem::take(&mut *SERVER_PANICS.lock().expect("panics"));
    assert_eq!(caught.len(), 1, "the panic hook missed a panic: {caught:?}");
    alloc::arm();
    let t0 = Instant::now();
    let server = start();
    let addr = server.addr();
    let started = t0.elapsed();
    let seeds = seeds();
    // Every seed is answered 200 undamaged (else the damage is not what fails a case); its
    // texts are what the seed must be answered with during the barrage.
    let mut ctx = Ctx {
        addr,
        ids: Mutex::new(HashSet::new()),
        answers: Vec::new(),
    };
    for (k, s) in seeds.iter().enumerate() {
        let req = Req::post(
            s.endpoint.path(),
            serde_json::to_vec(&s.body).expect("JSON"),
        );
        let ran = run_case(&ctx, &Case::one("seed", Step::of(&req, Some(s.endpoint))));
        assert!(
            ran.failures.is_empty() && ran.outcomes[0].starts_with("200"),
            "seed {k} is not answered 200: {:?} {:?}",
            ran.outcomes,
            ran.failures
        );
        ctx.answers.push(ran.texts);
    }
    let ctx = ctx;
    let failed = AtomicUsize::new(0);
    let reference = Req::post(
        "/v1/completions",
        serde_json::to_vec(&json!({"model": MODEL, "prompt": "def add(a, b):",
            "max_tokens": 4, "temperature": 0.0}))
        .expect("JSON"),
    );
    let (status, before) = send(addr, &reference);
    assert_eq!(status, 200, "{before}");
    let n = cases();
    let barrage = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let (seeds, ctx, failed) = (&seeds, &ctx, &failed);
                std::thread::Builder::new()
                    .name(format!("hostile-requests-{t}"))
                    .spawn_scoped(scope, move || {
                        let mut tally = Tally::default();
                        for i in (t..n).step_by(CLIENTS) {
                            if failed.load(Ordering::Relaxed) >= MAX_FAILURES {
                                break;
                            }
                            let case = case(i, seeds);
                            let base = alloc::begin("requests", i);
                            let start = Instant::now();
                            let mut ran = run_case(ctx, &case);
                            let took = start.elapsed();
                            let (_, violation) = alloc::end(base);
                            if let Some(v) = violation {
                                ran.failures.push(v);
                            }
                            tally.cases += 1;
                            tally.choices += ran.choices;
                            let spent = tally.time.entry(case.class.clone()).or_default();
                            spent.0 += 1;
                            spent.1 += took;
                            if took > tally.slowest.0 {
                                tally.slowest = (took, i);
                            }
                            for o in ran.outcomes {
                                *tally
                                    .by_class
                                    .entry((case.class.clone(), o.clone()))
                                    .or_default() += 1;
                                *tally.outcomes.entry(o).or_default() += 1;
                            }
                            failed.fetch_add(ran.failures.len(), Ordering::Relaxed);
                            for f in ran.failures {
                                tally
                                    .failures
                                    .push(format!("case {i} ({}): {f}", case.class));
                            }
                        }
                        tally
                    })
                    .expect("spawn a client")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a client thread panicked"))
            .collect()
    });
    let barrage = barrage.elapsed();
    let mut t = Tally::default();
    for x in tallies {
        t.cases += x.cases;
        t.choices += x.choices;
        t.failures.extend(x.failures);
        t.slowest = t.slowest.max(x.slowest);
        for (k, v) in x.outcomes {
            *t.outcomes.entry(k).or_default() += v;
        }
        for (k, v) in x.by_class {
            *t.by_class.entry(k).or_default() += v;
        }
        for (k, (n, d)) in x.time {
            let e = t.time.entry(k).or_default();
            e.0 += n;
            e.1 += d;
        }
    }
    // Afterwards: alive, the same answer as before, counters balanced once idle.
    let (status, after) = send(addr, &reference);
    let idle = settle(&server);
    let mut stats_req = Req::post("/stats", Vec::new());
    stats_req.line = b"GET /stats HTTP/1.1".to_vec();
    let (stats_status, stats) = send(addr, &stats_req);
    report(&t, barrage, started, &idle);
    assert_eq!(
        status, 200,
        "the server does not answer after the barrage: {after}"
    );
    assert_eq!(
        after["choices"][0]["text"], before["choices"][0]["text"],
        "the same request is answered differently after the barrage"
    );
    let panics = SERVER_PANICS.lock().map(|p| p.clone()).unwrap_or_default();
    assert!(panics.is_empty(), "server threads panicked: {panics:#?}");
    assert!(
        t.failures.is_empty() && t.cases == n,
        "{} of {} cases failed (SPOT_HOSTILE_SEED={}); first: {:#?}",
        t.failures.len(),
        t.cases,
        stream_seed(),
        &t.failures[..t.failures.len().min(12)]
    );
    assert_eq!(stats_status, 200, "{stats}");
    for (field, value) in [
        ("live", idle.live as u64),
        ("queued", idle.queued as u64),
        ("accepted", idle.accepted),
        ("completed", idle.completed),
        ("cancelled", idle.cancelled),
        ("failed", idle.failed),
    ] {
        assert_eq!(
            stats[field], value,
            "/stats {field} differs: {stats} vs {idle:?}"
        );
    }
    assert_eq!(
        idle.accepted,
        idle.completed + idle.cancelled + idle.failed,
        "{idle:?}"
    );
    assert_eq!(idle.failed, 0, "{idle:?}");
    // Every choice a client saw finish was completed (the reference requests' too).
    assert!(
        idle.completed >= t.choices as u64,
        "{} choices answered, {idle:?}",
        t.choices
    );
    server.stop().expect("the server stops");
}

fn report(t: &Tally, barrage: Duration, started: Duration, idle: &spot_serve::EngineStats) {
    let mut outcomes: Vec<(&String, &usize)> = t.outcomes.iter().collect();
    outcomes.sort_by(|a, b| b.1.cmp(a.1));
    let list = outcomes
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    for ((c, _), n) in &t.by_class {
        *classes.entry(c.as_str()).or_default() += n;
    }
    let classes = classes
        .iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let ok: usize = t
        .outcomes
        .iter()
        .filter(|(k, _)| k.starts_with("200"))
        .map(|(_, v)| v)
        .sum();
    let mut text = format!(
        "| requests | {} | {ok} | {} | {list} | {classes} | {:.1} (case {}) | - |\n",
        t.cases,
        t.failures.len(),
        t.slowest.0.as_secs_f64() * 1e3,
        t.slowest.1,
    );
    text += &format!(
        "barrage {:.1} s over {CLIENTS} clients (server start {:.1} s); engine once idle: \
         accepted {} completed {} cancelled {} failed {}, {} forwards\n",
        barrage.as_secs_f64(),
        started.as_secs_f64(),
        idle.accepted,
        idle.completed,
        idle.cancelled,
        idle.failed,
        idle.forwards,
    );
    let mut time: Vec<(&String, &(usize, Duration))> = t.time.iter().collect();
    time.sort_by_key(|x| std::cmp::Reverse(x.1.1));
    text += "client time by class: ";
    text += &time
        .iter()
        .take(10)
        .map(|(c, (n, d))| format!("{c} {:.1} s / {n}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ");
    text += "\n";
    print!("{text}");
    for ((c, o), n) in &t.by_class {
        text += &format!("class\t{c}\t{o}\t{n}\n");
    }
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile-requests.md");
    let _ = std::fs::write(out, text);
}
