//! The HTTP routes: OpenAI's completions, chat completions (plain and streamed as server-sent
//! events, one event per finished block) and models, plus `/stats`, `/metrics` and `/health`;
//! and the layers around them: the request log and counters, then the key check.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};
use spot_core::CancelHandle;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::conn::Connections;
use crate::engine::{Completion, EngineStats, Event, Submission};
use crate::error::ApiError;
use crate::frontend::Frontend;
use crate::metrics::{self, Finished, Metrics};
use crate::openai::{self, Parsed};

/// State shared by the handlers.
pub(crate) struct Shared {
    pub frontend: Frontend,
    /// The engine's queue; taken (closed) when the server stops.
    pub submit: Mutex<Option<Sender<Submission>>>,
    pub stats: Arc<Mutex<EngineStats>>,
    pub limits: Limits,
    pub next_id: AtomicU64,
    pub metrics: Metrics,
    pub drain: Drain,
    pub connections: Arc<Connections>,
    /// Choices accepted and not ended, counted here (not from the engine's counters, which
    /// lag a step) so that concurrent requests cannot pass `max_pending` together.
    pub held: Arc<AtomicUsize>,
}

/// A request's choices counted in [`Shared::held`] until each ends (or the request drops).
struct Held {
    n: usize,
    count: Arc<AtomicUsize>,
}

impl Held {
    /// Counts `n` more choices unless that passes `max`; else the count now.
    fn reserve(count: &Arc<AtomicUsize>, n: usize, max: usize) -> Result<Self, usize> {
        let mut now = count.load(Ordering::SeqCst);
        loop {
            if now + n > max {
                return Err(now);
            }
            match count.compare_exchange_weak(now, now + n, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    return Ok(Self {
                        n,
                        count: Arc::clone(count),
                    });
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// One choice ended.
    fn release_one(&mut self) {
        if self.n > 0 {
            self.n -= 1;
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::SeqCst);
    }
}

/// The per-request bounds.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub max_pending: usize,
    pub max_body_bytes: usize,
    pub read_timeout: Duration,
    pub max_prompt_tokens: Option<usize>,
    pub max_request_tokens: usize,
    pub log_prompts: bool,
}

/// Whether the server drains, and the completion requests it still answers.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    draining: AtomicBool,
    in_flight: Arc<AtomicUsize>,
}

impl Drain {
    pub(crate) fn start(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Completion requests being answered (streams included).
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn enter(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(&self.in_flight))
    }
}

/// One completion request counted in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The server's number for a request (its log lines, `x-request-id`, and its response id).
#[derive(Clone, Copy, Debug)]
struct RequestNo(u64);

/// The router of a server: the routes, behind the key check (when `keys` is not empty),
/// behind the request log and counters.
pub(crate) fn router(shared: Arc<Shared>, keys: Vec<String>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .fallback(|| async {
            ApiError::bad_request(
                "no such route; this server has /v1/completions, /v1/chat/completions, \
                 /v1/models, /stats, /metrics and /health",
            )
            .with_status(StatusCode::NOT_FOUND)
        })
        .layer(middleware::from_fn_with_state(Arc::new(keys), authorize))
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), observe))
        .with_state(shared)
}

/// Numbers the request, counts its answer by route and status, and logs it (never its
/// body). Completion requests log again when their decodes end ([`Run`]).
async fn observe(State(s): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    let no = s.next_id.fetch_add(1, Ordering::Relaxed);
    req.extensions_mut().insert(RequestNo(no));
    let endpoint = metrics::endpoint(req.uri().path());
    let verb = req.method().clone();
    let start = Instant::now();
    let mut response = next.run(req).await;
    let status = response.status().as_u16();
    s.metrics.request(endpoint, status);
    response
        .headers_mut()
        .insert("x-request-id", HeaderValue::from(no));
    let ms = millis(start.elapsed());
    if matches!(endpoint, "/health" | "/metrics") {
        tracing::debug!(target: "spot_serve::http", id = no, verb = %verb, endpoint, status, ms);
    } else {
        tracing::info!(target: "spot_serve::http", id = no, verb = %verb, endpoint, status, ms);
    }
    response
}

/// Every route but `/health` needs one of `keys` as a bearer token (when there are keys).
async fn authorize(State(keys): State<Arc<Vec<String>>>, req: Request, next: Next) -> Response {
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
    next.run(req).await
}

/// Milliseconds to a tenth, for the logs.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
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

    fn endpoint(self) -> &'static str {
        match self {
            Kind::Completion => "/v1/completions",
            Kind::Chat => "/v1/chat/completions",
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

async fn completions(State(s): State<Arc<Shared>>, req: Request) -> Response {
    answer(s, Kind::Completion, req).await
}

async fn chat_completions(State(s): State<Arc<Shared>>, req: Request) -> Response {
    answer(s, Kind::Chat, req).await
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

async fn metrics_text(State(s): State<Arc<Shared>>) -> Response {
    let now = s.stats.lock().map(|g| *g).unwrap_or_default();
    let text = s
        .metrics
        .render(&now, s.connections.open(), s.drain.draining());
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `ok`, or 503 `{"status": "draining"}` with `Retry-After` once the server drains.
async fn health(State(s): State<Arc<Shared>>) -> Response {
    if s.drain.draining() {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "draining"})),
        )
            .into_response();
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            HeaderValue::from_static("1"),
        );
        r
    } else {
        "ok".into_response()
    }
}

/// The 503 of a request that arrives while the server drains.
fn draining() -> ApiError {
    ApiError::bad_request("the server is shutting down; try another replica or again later")
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .with_code("server_shutting_down")
}

/// The body, read within the read timeout and the body limit (408 and 413 naming them).
async fn read_body(s: &Shared, body: Body) -> Result<Bytes, ApiError> {
    let limit = s.limits.max_body_bytes;
    let read = tokio::time::timeout(s.limits.read_timeout, axum::body::to_bytes(body, limit));
    match read.await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(ApiError::bad_request(format!(
                    "the body is over this server's limit of {limit} bytes"
                ))
                .with_status(StatusCode::PAYLOAD_TOO_LARGE)
                .with_code("body_too_large"))
            } else {
                Err(ApiError::bad_request(format!("cannot read the body: {e}")))
            }
        }
        Err(_) => Err(ApiError::bad_request(format!(
            "the body did not arrive within this server's read timeout of {} s",
            s.limits.read_timeout.as_secs_f64()
        ))
        .with_status(StatusCode::REQUEST_TIMEOUT)
        .with_code("body_timeout")),
    }
}

/// The prompt and request-size limits of a parsed request.
fn check_sizes(limits: &Limits, kind: Kind, parsed: &Parsed) -> Result<(), ApiError> {
    let field = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    if let Some(max) = limits.max_prompt_tokens
        && let Some(&longest) = parsed.prompt_tokens.iter().max()
        && longest > max
    {
        return Err(ApiError::invalid(
            field,
            format!("the prompt has {longest} tokens, over this server's limit of {max}"),
        )
        .with_code("prompt_too_long"));
    }
    if parsed.jobs.len() > limits.max_pending {
        // Never admissible, however idle the server: a 400, not a 503 to retry.
        return Err(ApiError::invalid(
            "n",
            format!(
                "the request has {} choices (`n` × prompts), over the {} requests this server \
                 holds at most",
                parsed.jobs.len(),
                limits.max_pending
            ),
        )
        .with_code("too_many_choices"));
    }
    let per_choice = parsed.jobs.first().map_or(0, |j| j.spec.max_tokens);
    let total = per_choice.saturating_mul(parsed.jobs.len());
    if total > limits.max_request_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens {per_choice} × {} choices is {total} tokens, over this server's \
                 limit of {} per request",
                parsed.jobs.len(),
                limits.max_request_tokens
            ),
        )
        .with_code("request_too_large"));
    }
    Ok(())
}

/// Parses, submits, and answers plainly or as a stream.
async fn answer(s: Arc<Shared>, kind: Kind, req: Request) -> Response {
    match respond(s, kind, req).await {
        Ok(r) => r,
        Err(e) => {
            // A body that was not read whole (too large, too slow): the connection cannot
            // carry another request, so it closes after this answer and frees its slot.
            let unread = matches!(
                e.status,
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
            );
            let mut r = e.into_response();
            if unread {
                r.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
    }
}

async fn respond(s: Arc<Shared>, kind: Kind, req: Request) -> Result<Response, ApiError> {
    let start = Instant::now();
    let no = req.extensions().get::<RequestNo>().map_or(0, |n| n.0);
    if s.drain.draining() {
        return Err(draining());
    }
    let in_flight = s.drain.enter();
    let bytes = read_body(&s, req.into_body()).await?;
    let parsed = match kind {
        Kind::Completion => openai::completion(&s.frontend, &bytes)?,
        Kind::Chat => openai::chat(&s.frontend, &bytes)?,
    };
    check_sizes(&s.limits, kind, &parsed)?;
    let held = Held::reserve(&s.held, parsed.jobs.len(), s.limits.max_pending).map_err(|now| {
        ApiError::bad_request(format!(
            "the server holds {now} requests (at most {}); try again later",
            s.limits.max_pending
        ))
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .with_code("queue_full")
    })?;
    let prompt_text = match (s.limits.log_prompts, parsed.jobs.first()) {
        (true, Some(j)) => s.frontend.tokenizer.decode(&j.spec.prompt).ok(),
        _ => None,
    };
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
    {
        let submit = s.submit.lock().map_err(|_| engine_gone())?;
        let Some(submit) = submit.as_ref() else {
            return Err(draining());
        };
        submit
            .send(Submission { jobs, events: tx })
            .map_err(|_| engine_gone())?;
    }
    let guard = match rx.recv().await {
        Some(Event::Accepted(handles)) => Cancel(handles),
        Some(Event::Rejected(e)) => return Err(ApiError::bad_request(e)),
        _ => return Err(engine_gone()),
    };
    let head = Head {
        id: format!("{}-{no}", kind.prefix()),
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
        log: RunLog {
            no,
            start,
            first_block: None,
            failed: None,
            prompt_text,
            held,
            _in_flight: in_flight,
        },
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
    log: RunLog,
}

/// What a [`Run`] logs and counts when it ends.
struct RunLog {
    no: u64,
    start: Instant,
    first_block: Option<Duration>,
    /// The status of the error that ended it, if one did.
    failed: Option<u16>,
    /// The first prompt's text, when the server logs prompts.
    prompt_text: Option<String>,
    held: Held,
    _in_flight: InFlight,
}

impl Drop for Run {
    fn drop(&mut self) {
        // 499: the client went away before the last choice ended.
        let status = match (self.log.failed, self.left) {
            (Some(s), _) => s,
            (None, 0) => 200,
            (None, _) => 499,
        };
        let done = Finished {
            endpoint: self.head.kind.endpoint(),
            method: &self.head.method,
            status,
            choices: self.choices.len(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            duration: self.log.start.elapsed(),
            first_block: self.log.first_block,
        };
        self.shared.metrics.completion(&done);
        let first_block_ms = done.first_block.map(millis);
        tracing::info!(
            target: "spot_serve::completion",
            id = self.log.no,
            endpoint = done.endpoint,
            method = %done.method,
            status,
            choices = done.choices,
            prompt_tokens = done.prompt_tokens,
            completion_tokens = done.completion_tokens,
            ms = millis(done.duration),
            first_block_ms,
            prompt = self.log.prompt_text.as_deref(),
        );
    }
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
                Some(Event::Block { .. }) => {
                    self.log
                        .first_block
                        .get_or_insert_with(|| self.log.start.elapsed());
                }
                Some(_) => {}
                None => return Err(self.fail(engine_gone())),
            }
        }
        match self.body() {
            Ok(v) => Ok(v),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The whole response of a run whose choices have all ended.
    fn body(&self) -> Result<Value, ApiError> {
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

    /// Notes `e` as what ended the request.
    fn fail(&mut self, e: ApiError) -> ApiError {
        self.log.failed = Some(e.status.as_u16());
        e
    }

    fn done(&mut self, choice: usize, output: Result<Completion, String>) -> Result<(), ApiError> {
        self.log.held.release_one();
        let out = output.map_err(internal).and_then(|out| {
            if out.cancelled {
                // Only the server cancels a decode whose client is still here: at shutdown,
                // once the drain timeout has passed.
                Err(ApiError::bad_request(
                    "the server shut down before this request finished (its drain timeout \
                     passed)",
                )
                .with_status(StatusCode::SERVICE_UNAVAILABLE)
                .with_code("server_shutting_down"))
            } else {
                Ok(out)
            }
        });
        let out = out.map_err(|e| self.fail(e))?;
        self.shared.metrics.decode(
            self.head.kind.endpoint(),
            &self.head.method,
            out.tokens.len(),
            &out.work,
        );
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
                        let e = run.fail(engine_gone());
                        return Some((vec![data(&e.body())], (run, include_usage, true)));
                    }
                };
                match run.stream_event(event) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Some((out, (run, include_usage, false))),
                    Err(e) => {
                        let e = run.fail(e);
                        return Some((vec![data(&e.body())], (run, include_usage, true)));
                    }
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
                self.log
                    .first_block
                    .get_or_insert_with(|| self.log.start.elapsed());
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
