//! The HTTP routes: OpenAI's completions, chat completions (plain and streamed as server-sent
//! events, one event per finished block) and models, plus `/stats` and `/health`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};
use spot_core::CancelHandle;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::engine::{Completion, EngineStats, Event, Submission};
use crate::error::ApiError;
use crate::frontend::Frontend;
use crate::openai::{self, Parsed};

/// State shared by the handlers.
pub(crate) struct Shared {
    pub frontend: Frontend,
    pub submit: Mutex<Sender<Submission>>,
    pub stats: Arc<Mutex<EngineStats>>,
    pub max_pending: usize,
    pub next_id: AtomicU64,
}

/// The router of a server: the routes behind the key check (when `keys` is not empty) and the
/// body limit.
pub(crate) fn router(shared: Arc<Shared>, keys: Vec<String>, max_body: usize) -> Router {
    let limit = max_body;
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/stats", get(stats))
        .route("/health", get(|| async { "ok" }))
        .fallback(|| async {
            ApiError::bad_request(
                "no such route; this server has /v1/completions, \
                 /v1/chat/completions, /v1/models, /stats and /health",
            )
            .with_status(StatusCode::NOT_FOUND)
        })
        .with_state(shared)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            (Arc::new(keys), limit),
            authorize,
        ))
}

/// Every route but `/health` needs one of `keys` as a bearer token (when there are keys); a
/// body over the limit is a 413 naming it.
async fn authorize(
    State((keys, limit)): State<(Arc<Vec<String>>, usize)>,
    req: Request,
    next: Next,
) -> Response {
    if !keys.is_empty() && req.uri().path() != "/health" {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Every key is compared, each in time independent of where it differs.
        let known = keys
            .iter()
            .fold(false, |ok, k| ok | same(k.as_bytes(), given.as_bytes()));
        if !known {
            return ApiError::bad_request("a valid API key is needed: `Authorization: Bearer KEY`")
                .with_status(StatusCode::UNAUTHORIZED)
                .with_code("invalid_api_key")
                .into_response();
        }
    }
    let response = next.run(req).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::bad_request(format!(
            "the body is over this server's limit of {limit} bytes"
        ))
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
        .with_code("body_too_large")
        .into_response();
    }
    response
}

/// Whether `a == b`, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Which endpoint an answer is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

impl Kind {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }
    }

    /// A choice object: `text` for completions, `message` or `delta` for chat.
    fn choice(self, index: usize, text: Value, finish: Option<&str>, chunk: bool) -> Value {
        match (self, chunk) {
            (Kind::Completion, _) => json!({
                "index": index,
                "text": if text.is_null() { "".into() } else { text },
                "finish_reason": finish,
                "logprobs": null,
            }),
            (Kind::Chat, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": null,
            }),
            (Kind::Chat, true) => {
                let delta = if text.is_null() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
        }
    }
}

async fn completions(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(s, Kind::Completion, body).await
}

async fn chat_completions(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(s, Kind::Chat, body).await
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": s.frontend.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "spot",
        }],
    }))
    .into_response()
}

async fn stats(State(s): State<Arc<Shared>>) -> Response {
    let now = s.stats.lock().map(|g| *g).unwrap_or_default();
    axum::Json(now).into_response()
}

/// Parses, submits, and answers plainly or as a stream.
async fn answer(s: Arc<Shared>, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    match respond(s, kind, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn respond(
    s: Arc<Shared>,
    kind: Kind,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body.map_err(|e| {
        ApiError::bad_request(format!("cannot read the body: {e}")).with_status(e.status())
    })?;
    let parsed = match kind {
        Kind::Completion => openai::completion(&s.frontend, &bytes)?,
        Kind::Chat => openai::chat(&s.frontend, &bytes)?,
    };
    let pending = s.stats.lock().map(|g| g.live + g.queued).unwrap_or(0);
    if pending + parsed.jobs.len() > s.max_pending {
        return Err(ApiError::bad_request(format!(
            "the server holds {pending} requests (at most {}); try again later",
            s.max_pending
        ))
        .with_status(StatusCode::SERVICE_UNAVAILABLE));
    }
    let (tx, mut rx) = unbounded_channel();
    let Parsed {
        jobs,
        prompt_tokens,
        stream,
        include_usage,
        stops,
    } = parsed;
    let choices = jobs.len();
    let max_tokens = jobs.first().map_or(0, |j| j.spec.max_tokens);
    let method = jobs
        .first()
        .and_then(|j| j.spec.method.clone())
        .unwrap_or_else(|| s.frontend.defaults.method.clone());
    s.submit
        .lock()
        .map_err(|_| engine_gone())?
        .send(Submission { jobs, events: tx })
        .map_err(|_| engine_gone())?;
    let guard = match rx.recv().await {
        Some(Event::Accepted(handles)) => Cancel(handles),
        Some(Event::Rejected(e)) => return Err(ApiError::bad_request(e)),
        _ => return Err(engine_gone()),
    };
    let head = Head {
        id: format!(
            "{}-{}",
            kind.prefix(),
            s.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: s.frontend.model_id.clone(),
        kind,
        method,
    };
    let run = Run {
        shared: Arc::clone(&s),
        rx,
        guard,
        stops,
        choices: (0..choices).map(|_| ChoiceText::default()).collect(),
        left: choices,
        max_tokens,
        prompt_tokens: prompt_tokens.iter().sum(),
        completion_tokens: 0,
        head,
    };
    if stream {
        Ok(Sse::new(run.events(include_usage))
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        Ok(axum::Json(run.collect().await?).into_response())
    }
}

fn engine_gone() -> ApiError {
    ApiError::bad_request("the decoding engine has stopped")
        .with_status(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Cancels the request's decodes when dropped before they finished: a client that goes away
/// (its handler or stream is dropped) frees its cache slots at the engine's next step.
struct Cancel(Vec<CancelHandle>);

impl Drop for Cancel {
    fn drop(&mut self) {
        for h in &self.0 {
            h.cancel();
        }
    }
}

/// The fields every response object starts with.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    method: String,
}

impl Head {
    fn object(&self, choices: Vec<Value>, chunk: bool) -> Value {
        json!({
            "id": self.id,
            "object": self.kind.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// What a choice has streamed so far.
#[derive(Default)]
struct ChoiceText {
    tokens: Vec<u32>,
    sent: String,
    output: Option<Completion>,
}

/// One HTTP request's decodes in progress.
struct Run {
    shared: Arc<Shared>,
    rx: UnboundedReceiver<Event>,
    guard: Cancel,
    stops: Option<spot_hf::StopStrings>,
    choices: Vec<ChoiceText>,
    left: usize,
    max_tokens: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    head: Head,
}

fn finish_reason(out: &Completion) -> &'static str {
    if out.stopped { "stop" } else { "length" }
}

impl Run {
    /// Waits for every choice; the whole response.
    async fn collect(mut self) -> Result<Value, ApiError> {
        while self.left > 0 {
            match self.rx.recv().await {
                Some(Event::Done { choice, output }) => self.done(choice, output)?,
                Some(_) => {}
                None => return Err(engine_gone()),
            }
        }
        let mut choices = Vec::with_capacity(self.choices.len());
        let mut spot = Vec::with_capacity(self.choices.len());
        for (i, c) in self.choices.iter().enumerate() {
            let out = c.output.as_ref().ok_or_else(engine_gone)?;
            let text = self
                .shared
                .frontend
                .text(&out.tokens, self.stops.as_ref())
                .map_err(internal)?;
            choices.push(
                self.head
                    .kind
                    .choice(i, text.into(), Some(finish_reason(out)), false),
            );
            spot.push(work(out));
        }
        let mut v = self.head.object(choices, false);
        v["usage"] = self.usage();
        v["spot"] = json!({"method": self.head.method, "choices": spot});
        Ok(v)
    }

    fn done(&mut self, choice: usize, output: Result<Completion, String>) -> Result<(), ApiError> {
        let out = output.map_err(internal)?;
        self.completion_tokens += out.tokens.len();
        if let Some(c) = self.choices.get_mut(choice) {
            c.output = Some(out);
        }
        self.left -= 1;
        if self.left == 0 {
            self.guard.0.clear();
        }
        Ok(())
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }

    /// The server-sent events: a chunk per finished block that adds text, a last chunk per
    /// choice with its finish reason, the usage chunk when asked, then `[DONE]`.
    fn events(
        self,
        include_usage: bool,
    ) -> impl Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send {
        let first: Vec<SseEvent> = match self.head.kind {
            Kind::Chat => (0..self.choices.len())
                .map(|i| {
                    let c = json!({"index": i, "delta": {"role": "assistant", "content": ""},
                        "finish_reason": null, "logprobs": null});
                    data(&self.head.object(vec![c], true))
                })
                .collect(),
            Kind::Completion => Vec::new(),
        };
        let state = (self, include_usage, false);
        let rest = stream::unfold(state, |(mut run, include_usage, ended)| async move {
            if ended {
                return None;
            }
            loop {
                if run.left == 0 {
                    let mut out = Vec::new();
                    if include_usage {
                        let mut v = run.head.object(Vec::new(), true);
                        v["usage"] = run.usage();
                        out.push(data(&v));
                    }
                    out.push(SseEvent::default().data("[DONE]"));
                    return Some((out, (run, include_usage, true)));
                }
                let event = match run.rx.recv().await {
                    Some(e) => e,
                    None => {
                        let e = engine_gone();
                        return Some((vec![data(&e.body())], (run, include_usage, true)));
                    }
                };
                match run.stream_event(event) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Some((out, (run, include_usage, false))),
                    Err(e) => return Some((vec![data(&e.body())], (run, include_usage, true))),
                }
            }
        });
        stream::iter(first)
            .chain(rest.flat_map(stream::iter))
            .map(Ok)
    }

    /// The chunks one engine event adds to the stream.
    fn stream_event(&mut self, event: Event) -> Result<Vec<SseEvent>, ApiError> {
        let mut out = Vec::new();
        match event {
            Event::Block { choice, tokens } => {
                let Some(c) = self.choices.get_mut(choice) else {
                    return Ok(out);
                };
                c.tokens.extend_from_slice(&tokens);
                let visible = self.shared.frontend.visible(&c.tokens, self.max_tokens);
                let text = self
                    .shared
                    .frontend
                    .tokenizer
                    .decode(visible)
                    .map_err(|e| internal(e.to_string()))?;
                // Text that may still change: a partial character, or a possible stop string.
                let text = text.trim_end_matches('\u{FFFD}');
                let ready = match &self.stops {
                    Some(s) => s.streamable(text),
                    None => text,
                };
                if let Some(delta) = new_text(&c.sent, ready) {
                    c.sent.push_str(delta);
                    let v = self.head.kind.choice(choice, delta.into(), None, true);
                    out.push(data(&self.head.object(vec![v], true)));
                }
            }
            Event::Done { choice, output } => {
                self.done(choice, output)?;
                let Some(c) = self.choices.get_mut(choice) else {
                    return Ok(out);
                };
                let Some(o) = c.output.as_ref() else {
                    return Ok(out);
                };
                let text = self
                    .shared
                    .frontend
                    .text(&o.tokens, self.stops.as_ref())
                    .map_err(internal)?;
                if let Some(delta) = new_text(&c.sent, &text) {
                    let v = self.head.kind.choice(choice, delta.into(), None, true);
                    out.push(data(&self.head.object(vec![v], true)));
                    c.sent.push_str(delta);
                }
                let v = self
                    .head
                    .kind
                    .choice(choice, Value::Null, Some(finish_reason(o)), true);
                let mut last = self.head.object(vec![v], true);
                last["spot"] = json!({"method": self.head.method, "choice": work(o)});
                out.push(data(&last));
            }
            Event::Accepted(_) | Event::Rejected(_) => {}
        }
        Ok(out)
    }
}

/// The part of `now` after what was `sent`, when `now` extends it.
fn new_text<'a>(sent: &str, now: &'a str) -> Option<&'a str> {
    now.strip_prefix(sent).filter(|d| !d.is_empty())
}

/// A decode's work counters, as responses report them (`spot` field).
fn work(out: &Completion) -> Value {
    out.work.clone()
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn internal(e: String) -> ApiError {
    ApiError::bad_request(e).with_status(StatusCode::INTERNAL_SERVER_ERROR)
}
