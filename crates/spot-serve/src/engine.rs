//! The decoding engine: one thread that owns the model and a [`BatchDriver`], and runs it for
//! every HTTP request at once (continuous batching: requests join and leave the running batch
//! between forwards).
//!
//! The HTTP side sends [`Job`]s through a channel; the engine turns them into
//! [`Request`]s with the server's factory, answers [`Event::Accepted`] (with their cancel
//! handles) or [`Event::Rejected`], and then streams every finished block and the final output
//! back to the job's channel. A job whose channel is closed (the client went away) is
//! cancelled at the next step, so its cache slot is freed.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use spot_core::{
    BatchDriver, BlockDiffusionModel, CancelHandle, DecodeOutput, Request, RequestId, StepStrategy,
    TokenId,
};
use spot_hf::StopStrings;
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

/// Turns a [`JobSpec`] into a [`Request`] on the engine thread (with the model at hand: a
/// strategy may read it). An error refuses the HTTP request with a 400 naming it.
pub type Factory<M, S> = Box<dyn FnMut(&mut M, &JobSpec) -> Result<Request<S>, BoxError>>;

/// The engine thread's state: the model and the factory of its requests.
pub struct Engine<M, S: StepStrategy> {
    /// The model every request runs on.
    pub model: M,
    /// How a job becomes a request.
    pub factory: Factory<M, S>,
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
        output: Result<DecodeOutput, String>,
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

/// Runs the engine until the submission channel closes. Counters go to `stats` after every
/// step.
pub(crate) fn run<M, S>(
    mut engine: Engine<M, S>,
    max_batch: usize,
    submissions: Receiver<Submission>,
    stats: Arc<Mutex<EngineStats>>,
) -> Result<(), String>
where
    M: BlockDiffusionModel,
    S: StepStrategy,
    S::Error: Display,
{
    let mut driver: BatchDriver<S> = BatchDriver::new(max_batch).map_err(|e| e.to_string())?;
    let mut routes: HashMap<RequestId, Route> = HashMap::new();
    let mut totals = EngineStats::default();
    loop {
        if driver.is_idle() {
            match submissions.recv() {
                Ok(s) => admit(&mut engine, &mut driver, &mut routes, &mut totals, s),
                Err(_) => return Ok(()),
            }
        }
        loop {
            match submissions.try_recv() {
                Ok(s) => admit(&mut engine, &mut driver, &mut routes, &mut totals, s),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if driver.is_idle() => return Ok(()),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        for r in routes.values() {
            if r.events.is_closed() {
                r.cancel.cancel();
            }
        }
        let finished = match driver.step(&mut engine.model) {
            Ok(f) => f,
            Err(e) => {
                // The driver itself failed (not one request): fail everything it holds.
                let e = e.to_string();
                for (_, r) in routes.drain() {
                    let _ = r.events.send(Event::Done {
                        choice: r.choice,
                        output: Err(e.clone()),
                    });
                    totals.failed += 1;
                }
                totals.forwards += driver.forwards();
                driver = BatchDriver::new(max_batch).map_err(|e| e.to_string())?;
                publish(&stats, &totals, &driver, &engine.model);
                continue;
            }
        };
        while let Some((id, event)) = driver.next_event() {
            if let Some(r) = routes.get(&id) {
                let _ = r.events.send(Event::Block {
                    choice: r.choice,
                    tokens: event.tokens,
                });
            }
        }
        for f in finished {
            let Some(r) = routes.remove(&f.id) else {
                continue;
            };
            let output = f.output.map_err(|e| e.to_string());
            match &output {
                Ok(o) if o.cancelled => totals.cancelled += 1,
                Ok(_) => totals.completed += 1,
                Err(_) => totals.failed += 1,
            }
            let _ = r.events.send(Event::Done {
                choice: r.choice,
                output,
            });
        }
        publish(&stats, &totals, &driver, &engine.model);
    }
}

/// Makes the requests of a submission, all or none, and queues them.
fn admit<M, S>(
    engine: &mut Engine<M, S>,
    driver: &mut BatchDriver<S>,
    routes: &mut HashMap<RequestId, Route>,
    totals: &mut EngineStats,
    s: Submission,
) where
    M: BlockDiffusionModel,
    S: StepStrategy,
{
    let mut made = Vec::with_capacity(s.jobs.len());
    for job in s.jobs {
        match (engine.factory)(&mut engine.model, &job.spec) {
            Ok(r) => {
                let r = match job.stops {
                    Some(stops) => r.with_stop_check(stops),
                    None => r,
                };
                made.push((job.choice, r));
            }
            Err(e) => {
                let _ = s.events.send(Event::Rejected(e.to_string()));
                return;
            }
        }
    }
    let handles = made.iter().map(|(_, r)| r.cancel_handle()).collect();
    if s.events.send(Event::Accepted(handles)).is_err() {
        return; // the client is gone already
    }
    for (choice, r) in made {
        let cancel = r.cancel_handle();
        let id = driver.submit(r);
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

fn publish<M: BlockDiffusionModel, S: StepStrategy>(
    stats: &Mutex<EngineStats>,
    totals: &EngineStats,
    driver: &BatchDriver<S>,
    model: &M,
) {
    let now = EngineStats {
        live: driver.live(),
        queued: driver.queued(),
        open_slots: model.cache_usage().slots,
        cache_bytes: model.cache_usage().bytes,
        forwards: totals.forwards + driver.forwards(),
        ..*totals
    };
    if let Ok(mut s) = stats.lock() {
        *s = now;
    }
}
