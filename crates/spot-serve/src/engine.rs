//! The decoding engine: one thread that owns the model and its batch (an [`Engine`]: a
//! [`BatchDriver`] for block-diffusion models, a [`SpecDiffBatch`] for autoregressive ones),
//! and runs it for every HTTP request at once (continuous batching: requests join and leave
//! the running batch between forwards).
//!
//! The HTTP side sends [`Job`]s through a channel; the engine turns them into requests with
//! the server's factory, answers [`Event::Accepted`] (with their cancel
//! handles) or [`Event::Rejected`], and then streams every finished block and the final output
//! back to the job's channel. A job whose channel is closed (the client went away) is
//! cancelled at the next step, so its cache slot is freed.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Value, json};
use spot_core::{
    AutoregressiveModel, BatchDriver, BlockDiffusionModel, CacheUsage, CancelHandle, DecodeOutput,
    Request, RequestId, StepStrategy, TokenId,
};
use spot_hf::StopStrings;
use spot_specdiff::{DiffusionDrafter, SpecDiffBatch, SpecDiffOutput, SpecDiffRequest};
use tokio::sync::mpsc::UnboundedSender;

/// A boxed error of a [`Factory`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one choice of one HTTP request asks the engine to decode. The decoding method and
/// budget are the server's unless the request overrides them.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    /// Prompt ids (after the chat template, when a chat request).
    pub prompt: Vec<TokenId>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Noise seed (choice `i` of a request with seed `s` uses `s + i`).
    pub seed: u64,
    /// Decoding method named by the request (`spot.method`), else the server's.
    pub method: Option<String>,
    /// Draft budget named by the request (`spot.budget`), else the server's.
    pub budget: Option<usize>,
}

/// Turns a [`JobSpec`] into a block-diffusion [`Request`] on the engine thread (with the
/// model at hand: a strategy may read it). An error refuses the HTTP request with a 400
/// naming it.
pub type Factory<M, S> = Box<dyn FnMut(&mut M, &JobSpec) -> Result<Request<S>, BoxError>>;

/// Turns a [`JobSpec`] into a [`SpecDiffRequest`] (SpecDiff-2, or
/// [`SpecDiffRequest::plain`] for draft-free decoding) on the engine thread.
pub type ArFactory<M> = Box<dyn FnMut(&mut M, &JobSpec) -> Result<SpecDiffRequest, BoxError>>;

/// A request that left an [`Engine`]'s batch: its id, and its completion or why it failed.
pub type Left = (RequestId, Result<Completion, String>);

/// A finished decode, as a response reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The generated ids (cut after a stop id when decoding stops there).
    pub tokens: Vec<TokenId>,
    /// Whether a stop id or stop string ended it (`finish_reason: "stop"`).
    pub stopped: bool,
    /// Whether it was cancelled (the client went away).
    pub cancelled: bool,
    /// The work counters a response's `spot` field reports; `nfe` is the model forwards the
    /// request needed (its own, as if decoded alone).
    pub work: Value,
}

/// What the engine's thread drives: a model and the requests decoding on it, batched. The
/// server calls it from one thread only: [`start`](Self::start) once, then jobs in and steps
/// until it shuts down.
///
/// [`DiffusionEngine`] serves block-diffusion models ([`BatchDriver`]); [`ArEngine`] serves
/// autoregressive ones ([`SpecDiffBatch`]: SpecDiff-2 and draft-free requests in shared
/// forwards).
pub trait Engine {
    /// A request made from a job, not yet running.
    type Request;

    /// Sets the in-flight limit (requests decoded together at most); called once before the
    /// first job.
    fn start(&mut self, max_batch: usize) -> Result<(), BoxError>;

    /// Turns a job into a request with its stop strings; an error refuses the HTTP request
    /// with a 400 naming it.
    fn request(
        &mut self,
        job: &JobSpec,
        stops: Option<StopStrings>,
    ) -> Result<Self::Request, BoxError>;

    /// The handle that cancels `request` once it runs.
    fn cancel_handle(request: &Self::Request) -> CancelHandle;

    /// Queues a request; it joins the running batch at a later step.
    fn submit(&mut self, request: Self::Request) -> RequestId;

    /// Whether no request is queued or running.
    fn is_idle(&self) -> bool;

    /// One step of the batch: the requests that left it (done, cancelled or failed). An
    /// error is a failure of the whole batch: every request it held is dropped (their slots
    /// closed) and the engine is empty and ready again.
    fn step(&mut self) -> Result<Vec<Left>, String>;

    /// Tokens some request committed since the last call (a finished block, or a round's
    /// tokens), for streaming.
    fn next_event(&mut self) -> Option<(RequestId, Vec<TokenId>)>;

    /// Requests running and queued, open cache slots and bytes, and forwards run in all.
    fn usage(&self) -> EngineStats;
}

/// The engine of a block-diffusion model: one [`BatchDriver`] over it.
pub struct DiffusionEngine<M, S: StepStrategy> {
    model: M,
    factory: Factory<M, S>,
    driver: BatchDriver<S>,
    max_batch: usize,
    forwards: u64,
}

impl<M, S: StepStrategy> DiffusionEngine<M, S> {
    /// An engine over `model` whose jobs become requests through `factory`.
    pub fn new(model: M, factory: Factory<M, S>) -> Self {
        Self {
            model,
            factory,
            driver: BatchDriver::default(),
            max_batch: 1,
            forwards: 0,
        }
    }
}

impl<M, S> Engine for DiffusionEngine<M, S>
where
    M: BlockDiffusionModel,
    S: StepStrategy,
    S::Error: Display,
{
    type Request = Request<S>;

    fn start(&mut self, max_batch: usize) -> Result<(), BoxError> {
        self.driver = BatchDriver::new(max_batch)?;
        self.max_batch = max_batch;
        Ok(())
    }

    fn request(
        &mut self,
        job: &JobSpec,
        stops: Option<StopStrings>,
    ) -> Result<Request<S>, BoxError> {
        let r = (self.factory)(&mut self.model, job)?;
        Ok(match stops {
            Some(stops) => r.with_stop_check(stops),
            None => r,
        })
    }

    fn cancel_handle(request: &Request<S>) -> CancelHandle {
        request.cancel_handle()
    }

    fn submit(&mut self, request: Request<S>) -> RequestId {
        self.driver.submit(request)
    }

    fn is_idle(&self) -> bool {
        self.driver.is_idle()
    }

    fn step(&mut self) -> Result<Vec<Left>, String> {
        let finished = match self.driver.step(&mut self.model) {
            Ok(f) => f,
            Err(e) => {
                self.forwards += self.driver.forwards();
                self.driver = BatchDriver::new(self.max_batch).map_err(|e| e.to_string())?;
                return Err(e.to_string());
            }
        };
        Ok(left(
            finished.into_iter().map(|f| (f.id, f.output)),
            |o: DecodeOutput| Completion {
                work: json!({
                    "nfe": o.stats.work.nfe,
                    "forwards": o.stats.work.block_forwards,
                    "tokens_per_forward": o.stats.tokens_per_forward(),
                    "draft_nodes": o.stats.draft_nodes,
                    "accepted_nodes": o.stats.accepted_nodes,
                }),
                tokens: o.tokens,
                stopped: o.stopped,
                cancelled: o.cancelled,
            },
        ))
    }

    fn next_event(&mut self) -> Option<(RequestId, Vec<TokenId>)> {
        self.driver.next_event().map(|(id, e)| (id, e.tokens))
    }

    fn usage(&self) -> EngineStats {
        let forwards = self.forwards + self.driver.forwards();
        usage(
            (self.driver.live(), self.driver.queued()),
            self.model.cache_usage(),
            forwards,
        )
    }
}

/// The engine of an autoregressive model: one [`SpecDiffBatch`] over it and its drafter.
/// Draft-free jobs ([`SpecDiffRequest::plain`]) share its forwards with SpecDiff-2 ones.
pub struct ArEngine<M> {
    target: M,
    drafter: Box<dyn DiffusionDrafter>,
    factory: ArFactory<M>,
    batch: SpecDiffBatch,
    max_batch: usize,
    forwards: u64,
}

impl<M> ArEngine<M> {
    /// An engine over `target`, drafting with `drafter`, whose jobs become requests through
    /// `factory`.
    pub fn new(target: M, drafter: Box<dyn DiffusionDrafter>, factory: ArFactory<M>) -> Self {
        Self {
            target,
            drafter,
            factory,
            batch: SpecDiffBatch::default(),
            max_batch: 1,
            forwards: 0,
        }
    }
}

impl<M: AutoregressiveModel> Engine for ArEngine<M> {
    type Request = SpecDiffRequest;

    fn start(&mut self, max_batch: usize) -> Result<(), BoxError> {
        self.batch = SpecDiffBatch::new(max_batch)?;
        self.max_batch = max_batch;
        Ok(())
    }

    fn request(
        &mut self,
        job: &JobSpec,
        stops: Option<StopStrings>,
    ) -> Result<SpecDiffRequest, BoxError> {
        let r = (self.factory)(&mut self.target, job)?;
        Ok(match stops {
            Some(stops) => r.with_stop_check(stops),
            None => r,
        })
    }

    fn cancel_handle(request: &SpecDiffRequest) -> CancelHandle {
        request.cancel_handle()
    }

    fn submit(&mut self, request: SpecDiffRequest) -> RequestId {
        self.batch.submit(request)
    }

    fn is_idle(&self) -> bool {
        self.batch.pending() == 0
    }

    fn step(&mut self) -> Result<Vec<Left>, String> {
        let finished = match self.batch.step(&mut self.target, self.drafter.as_mut()) {
            Ok(f) => f,
            Err(e) => {
                self.forwards += self.batch.forwards();
                self.batch = SpecDiffBatch::new(self.max_batch).map_err(|e| e.to_string())?;
                return Err(e.to_string());
            }
        };
        Ok(left(
            finished.into_iter().map(|f| (f.id, f.output)),
            |o: SpecDiffOutput| Completion {
                work: json!({
                    "nfe": o.forwards,
                    "forwards": o.forwards,
                    "tokens_per_forward": o.tokens.len() as f64 / o.forwards.max(1) as f64,
                    "positions": o.report.positions,
                    "other_branch": o.report.other_branch,
                }),
                tokens: o.tokens,
                stopped: o.stopped,
                cancelled: o.cancelled,
            },
        ))
    }

    fn next_event(&mut self) -> Option<(RequestId, Vec<TokenId>)> {
        self.batch.next_event()
    }

    fn usage(&self) -> EngineStats {
        let forwards = self.forwards + self.batch.forwards();
        usage(
            (self.batch.live(), self.batch.queued()),
            self.target.cache_usage(),
            forwards,
        )
    }
}

/// A choice of an HTTP request, sent to the engine.
pub(crate) struct Job {
    pub spec: JobSpec,
    pub stops: Option<StopStrings>,
    /// Index of the choice in its HTTP request.
    pub choice: usize,
}

/// What the engine sends back about the jobs of one HTTP request.
#[derive(Debug)]
pub(crate) enum Event {
    /// Every job became a request; their cancel handles, in job order.
    Accepted(Vec<CancelHandle>),
    /// None was started: the first job's factory error.
    Rejected(String),
    /// A finished block of a choice (its generated tokens, prompt tail excluded).
    Block { choice: usize, tokens: Vec<TokenId> },
    /// A choice is done: its output, or why it failed.
    Done {
        choice: usize,
        output: Result<Completion, String>,
    },
}

/// The jobs of one HTTP request and where their events go.
pub(crate) struct Submission {
    pub jobs: Vec<Job>,
    pub events: UnboundedSender<Event>,
}

/// The engine's counters, as `GET /stats` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EngineStats {
    /// Requests in the running batch.
    pub live: usize,
    /// Requests waiting to join it.
    pub queued: usize,
    /// Cache slots open in the model (slot 0 included).
    pub open_slots: usize,
    /// Bytes the open slots' caches hold.
    pub cache_bytes: u64,
    /// Merged scoring forwards run.
    pub forwards: u64,
    /// Requests (choices) accepted.
    pub accepted: u64,
    /// Requests that decoded to the end.
    pub completed: u64,
    /// Requests cancelled (the client went away).
    pub cancelled: u64,
    /// Requests that failed.
    pub failed: u64,
}

struct Route {
    choice: usize,
    events: UnboundedSender<Event>,
    cancel: CancelHandle,
}

/// The counters of an engine with `live` running and `queued` waiting requests.
fn usage((live, queued): (usize, usize), cache: CacheUsage, forwards: u64) -> EngineStats {
    EngineStats {
        live,
        queued,
        open_slots: cache.slots,
        cache_bytes: cache.bytes,
        forwards,
        ..EngineStats::default()
    }
}

/// The requests that left a batch, their outputs made [`Completion`]s by `completion`.
fn left<O, E: Display>(
    finished: impl Iterator<Item = (RequestId, Result<O, E>)>,
    completion: impl Fn(O) -> Completion,
) -> Vec<Left> {
    finished
        .map(|(id, output)| (id, output.map(&completion).map_err(|e| e.to_string())))
        .collect()
}

/// Runs the engine until the submission channel closes. Counters go to `stats` after every
/// step. Once `abort` is set, every request is cancelled at the next step (a server that
/// stops after its drain timeout).
pub(crate) fn run<E: Engine>(
    mut engine: E,
    max_batch: usize,
    submissions: Receiver<Submission>,
    stats: Arc<Mutex<EngineStats>>,
    abort: Arc<AtomicBool>,
) -> Result<(), String> {
    engine.start(max_batch).map_err(|e| e.to_string())?;
    let mut routes: HashMap<RequestId, Route> = HashMap::new();
    let mut totals = EngineStats::default();
    loop {
        if engine.is_idle() {
            match submissions.recv() {
                Ok(s) => admit(&mut engine, &mut routes, &mut totals, s),
                Err(_) => return Ok(()),
            }
        }
        loop {
            match submissions.try_recv() {
                Ok(s) => admit(&mut engine, &mut routes, &mut totals, s),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if engine.is_idle() => return Ok(()),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        let aborting = abort.load(Ordering::SeqCst);
        for r in routes.values() {
            if aborting || r.events.is_closed() {
                r.cancel.cancel();
            }
        }
        let finished = match engine.step() {
            Ok(f) => f,
            Err(e) => {
                // The batch itself failed (not one request): fail everything it held.
                totals.failed += routes.len() as u64;
                publish(&stats, &totals, &engine);
                for (_, r) in routes.drain() {
                    let _ = r.events.send(Event::Done {
                        choice: r.choice,
                        output: Err(e.clone()),
                    });
                }
                continue;
            }
        };
        for (_, output) in &finished {
            match output {
                Ok(o) if o.cancelled => totals.cancelled += 1,
                Ok(_) => totals.completed += 1,
                Err(_) => totals.failed += 1,
            }
        }
        // Counters first: a client that has its answer and then reads `/stats` sees its
        // request counted.
        publish(&stats, &totals, &engine);
        while let Some((id, tokens)) = engine.next_event() {
            if let Some(r) = routes.get(&id) {
                let _ = r.events.send(Event::Block {
                    choice: r.choice,
                    tokens,
                });
            }
        }
        for (id, output) in finished {
            if let Some(r) = routes.remove(&id) {
                let _ = r.events.send(Event::Done {
                    choice: r.choice,
                    output,
                });
            }
        }
    }
}

/// Makes the requests of a submission, all or none, and queues them.
fn admit<E: Engine>(
    engine: &mut E,
    routes: &mut HashMap<RequestId, Route>,
    totals: &mut EngineStats,
    s: Submission,
) {
    let mut made = Vec::with_capacity(s.jobs.len());
    for job in s.jobs {
        match engine.request(&job.spec, job.stops) {
            Ok(r) => made.push((job.choice, r)),
            Err(e) => {
                let _ = s.events.send(Event::Rejected(e.to_string()));
                return;
            }
        }
    }
    let handles = made.iter().map(|(_, r)| E::cancel_handle(r)).collect();
    if s.events.send(Event::Accepted(handles)).is_err() {
        return; // the client is gone already
    }
    for (choice, r) in made {
        let cancel = E::cancel_handle(&r);
        let id = engine.submit(r);
        routes.insert(
            id,
            Route {
                choice,
                events: s.events.clone(),
                cancel,
            },
        );
        totals.accepted += 1;
    }
}

fn publish<E: Engine>(stats: &Mutex<EngineStats>, totals: &EngineStats, engine: &E) {
    let now = EngineStats {
        accepted: totals.accepted,
        completed: totals.completed,
        cancelled: totals.cancelled,
        failed: totals.failed,
        ..engine.usage()
    };
    if let Ok(mut s) = stats.lock() {
        *s = now;
    }
}
