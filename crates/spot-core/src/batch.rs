//! Many requests through one model: continuous batching of [`Request`]s.
//!
//! Every [`BatchDriver::step`] admits queued requests up to the in-flight limit (each gets a
//! cache slot of its own), runs the prefill of the new ones (one forward per request), then
//! runs **one** forward over the block states of every request that needs scoring, carrying
//! the finished blocks that requests append before them (one [`crate::ScoreGroup`] per
//! request, through [`MeteredModel::forward_each`]), and hands each request its results.
//! Requests join and leave between steps. Since a group's statistics are
//! bit-identical to scoring it alone, each request decodes exactly the tokens, counters and
//! events it would alone.
//!
//! ```
//! use spot_core::{BatchDriver, BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, Request};
//! use spot_core::toy::{ToyConfig, ToyModel};
//!
//! let mut model = ToyModel::new(ToyConfig::default());
//! let cfg = DecodeConfig { block_size: 8, max_new_tokens: 20, temperature: 1.0,
//!     ..DecodeConfig::default() };
//! let prompts: [&[u32]; 3] = [&[1, 2, 3], &[9; 13], &[4]];
//! let mut driver = BatchDriver::new(2)?;
//! for p in prompts {
//!     driver.submit(Request::new(p, &cfg, model.info(), DraftFreeDecoder::new())?);
//! }
//! let mut done = driver.run(&mut model)?;
//! done.sort_by_key(|f| f.id);
//! for (f, p) in done.into_iter().zip(prompts) {
//!     let alone = DraftFreeDecoder::new().decode(&mut model, p, &cfg)?;
//!     assert_eq!(f.output?, alone);
//! }
//! # Ok::<(), spot_core::Error>(())
//! ```

use std::collections::VecDeque;

use crate::config::DecodeOutput;
use crate::error::{Error, Result};
use crate::model::{BlockDiffusionModel, CacheSlot, MeteredModel, Prefix, ScoreGroup};
use crate::request::{BlockEvent, CancelHandle, Need, Request, StepStrategy};

/// A request's number in a [`BatchDriver`], in submission order from 0.
pub type RequestId = u64;

/// A request that left the batch.
pub struct Finished<S: StepStrategy> {
    /// The request's number.
    pub id: RequestId,
    /// Its output, or what failed.
    pub output: Result<DecodeOutput, S::Error>,
    /// Its strategy, handed back (a speculative decoder's report).
    pub strategy: S,
}

impl<S: StepStrategy> std::fmt::Debug for Finished<S>
where
    S::Error: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finished")
            .field("id", &self.id)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

struct Live<S: StepStrategy> {
    id: RequestId,
    slot: Option<CacheSlot>,
    request: Request<S>,
    error: Option<S::Error>,
}

/// Continuous batching of [`Request`]s over one [`BlockDiffusionModel`]; see the
/// [module documentation](self).
pub struct BatchDriver<S: StepStrategy> {
    max_in_flight: usize,
    next_id: RequestId,
    queue: VecDeque<(RequestId, Request<S>)>,
    live: Vec<Live<S>>,
    events: VecDeque<(RequestId, BlockEvent)>,
    forwards: u64,
}

impl<S: StepStrategy> std::fmt::Debug for BatchDriver<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchDriver")
            .field("max_in_flight", &self.max_in_flight)
            .field("queued", &self.queue.len())
            .field("live", &self.live.len())
            .field("forwards", &self.forwards)
            .finish()
    }
}

impl<S: StepStrategy> Default for BatchDriver<S> {
    /// A driver with one request in flight at a time.
    fn default() -> Self {
        Self {
            max_in_flight: 1,
            next_id: 0,
            queue: VecDeque::new(),
            live: Vec::new(),
            events: VecDeque::new(),
            forwards: 0,
        }
    }
}

impl<S: StepStrategy> BatchDriver<S> {
    /// A driver that keeps at most `max_in_flight` requests (at least 1) in the running batch.
    pub fn new(max_in_flight: usize) -> Result<Self> {
        if max_in_flight == 0 {
            return Err(Error::config("max_in_flight", "must be at least 1, got 0"));
        }
        Ok(Self {
            max_in_flight,
            ..Self::default()
        })
    }

    /// Queues a request; it joins the running batch at a later step.
    pub fn submit(&mut self, request: Request<S>) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back((id, request));
        id
    }

    /// A handle that cancels request `id` (queued or running), if it is still here.
    pub fn cancel_handle(&self, id: RequestId) -> Option<CancelHandle> {
        self.queue
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r.cancel_handle())
            .or_else(|| {
                self.live
                    .iter()
                    .find(|l| l.id == id)
                    .map(|l| l.request.cancel_handle())
            })
    }

    /// Requests in the running batch.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Requests waiting to join.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether no request is queued or running.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.live.is_empty()
    }

    /// Merged scoring forwards run so far.
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// The next finished-block event of any request.
    pub fn next_event(&mut self) -> Option<(RequestId, BlockEvent)> {
        self.events.pop_front()
    }

    /// One step (see the module documentation). Returns the requests that left the batch:
    /// done, cancelled or failed. An error of the model's merged forward fails every request
    /// in it; errors of one request fail only that request.
    pub fn step(&mut self, model: &mut dyn BlockDiffusionModel) -> Result<Vec<Finished<S>>> {
        let mut model = MeteredModel::new(model);
        while self.live.len() < self.max_in_flight {
            let Some((id, request)) = self.queue.pop_front() else {
                break;
            };
            let mut live = Live {
                id,
                slot: None,
                request,
                error: None,
            };
            match model.model().open_slot() {
                Ok(slot) => live.slot = Some(slot),
                Err(e) => live.error = Some(e.into()),
            }
            self.live.push(live);
        }
        for live in &mut self.live {
            if live.error.is_none()
                && let Err(e) = prefill(&mut model, live)
            {
                live.error = Some(e);
            }
        }
        self.score(&mut model);
        for live in &mut self.live {
            while let Some(e) = live.request.next_event() {
                self.events.push_back((live.id, e));
            }
        }
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.live.len() {
            let l = &self.live[i];
            if l.error.is_none() && !l.request.is_done() {
                i += 1;
                continue;
            }
            let live = self.live.swap_remove(i);
            if let Some(slot) = live.slot {
                model.model().close_slot(slot);
            }
            let (output, strategy) = live.request.finish_parts();
            let output = match live.error {
                Some(e) => Err(e),
                None => output,
            };
            finished.push(Finished {
                id: live.id,
                output,
                strategy,
            });
        }
        Ok(finished)
    }

    /// Steps until every request has left; returns them in the order they finished.
    pub fn run(&mut self, model: &mut dyn BlockDiffusionModel) -> Result<Vec<Finished<S>>> {
        let mut all = Vec::new();
        while !self.is_idle() {
            all.extend(self.step(model)?);
        }
        Ok(all)
    }

    /// One merged forward over every live request that needs scoring, with the finished
    /// blocks they append and their look-aheads.
    fn score(&mut self, model: &mut MeteredModel<'_>) {
        let (members, groups) = self.gather(|need, slot| match need {
            Need::Score {
                states,
                query,
                carry,
            } => Some(ScoreGroup::new(slot, states, query).carrying(carry)),
            _ => None,
        });
        if groups.is_empty() {
            return;
        }
        let result = model.forward_each(&groups);
        drop(groups);
        self.forwards += 1;
        let all = self.shaped(result, &members, "score groups per merged forward");
        for (i, scores) in members.into_iter().zip(all) {
            let live = &mut self.live[i];
            let answered = match scores {
                Ok(scores) => live.request.scored_group(scores),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = answered {
                live.error = Some(e);
            }
        }
    }

    /// The live requests with a slot and no error whose need `pick` takes: their indices, and
    /// what `pick` made of each need.
    fn gather<'a, T>(
        &'a self,
        pick: impl Fn(Need<'a>, CacheSlot) -> Option<T>,
    ) -> (Vec<usize>, Vec<T>) {
        let mut members = Vec::new();
        let mut taken = Vec::new();
        for (i, live) in self.live.iter().enumerate() {
            if live.error.is_some() {
                continue;
            }
            if let Some(slot) = live.slot
                && let Some(t) = pick(live.request.need(), slot)
            {
                members.push(i);
                taken.push(t);
            }
        }
        (members, taken)
    }

    /// The per-member results of a merged call, or (on its error, or a result of the wrong
    /// length) none, every member failed with the error.
    fn shaped<T>(
        &mut self,
        result: Result<Vec<T>>,
        members: &[usize],
        what: &'static str,
    ) -> Vec<T> {
        let error = match result {
            Ok(all) if all.len() == members.len() => return all,
            Ok(all) => Error::ShapeMismatch {
                what,
                expected: members.len(),
                actual: all.len(),
            }
            .to_string(),
            Err(e) => e.to_string(),
        };
        for &i in members {
            self.live[i].error = Some(Error::model(error.clone()).into());
        }
        Vec::new()
    }
}

/// Runs the prefill `live` needs, if any (one forward per request; appends are merged).
fn prefill<S: StepStrategy>(
    model: &mut MeteredModel<'_>,
    live: &mut Live<S>,
) -> Result<(), S::Error> {
    let Some(slot) = live.slot else {
        return Ok(());
    };
    if let Need::Prefill {
        prefix,
        block_size,
        generation_end,
    } = live.request.need()
    {
        let prefix = Prefix {
            tokens: prefix,
            block_size,
            generation_end,
        };
        let update = model.reset_prefix_in(slot, prefix)?;
        live.request.prefix_done(update)?;
    }
    Ok(())
}
