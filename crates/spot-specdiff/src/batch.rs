//! Many SpecDiff-2 requests over one target: every step drafts for the requests that need a
//! draft, then runs **one** target forward over every request that needs scoring (one
//! [`ArGroup`] per request, each in its own cache slot, through
//! [`MeteredArModel::forward_each`]). Since a group's statistics are bit-identical to scoring
//! it alone, each request decodes exactly the tokens and counters it would alone.
//!
//! ```
//! use spot_core::{decode_autoregressive, ArConfig};
//! use spot_specdiff::toy::{ToyCausalModel, ToyDrafter};
//! use spot_specdiff::{SpecDiffBatch, SpecDiffConfig, SpecDiffRequest};
//!
//! let mut target = ToyCausalModel::new(48, 5);
//! let mut drafter = ToyDrafter::new(target.clone(), 0.1, 2);
//! let cfg = ArConfig { max_new_tokens: 32, temperature: 1.0, seed: 9, ..ArConfig::default() };
//! let sd = SpecDiffConfig { k: 3, gamma: 6, ..SpecDiffConfig::default() };
//! let info = spot_core::AutoregressiveModel::ar_info(&target).clone();
//! let prompts: [&[u32]; 3] = [&[1, 2], &[7, 8, 9], &[4]];
//! let mut batch = SpecDiffBatch::new(2)?;
//! for p in prompts {
//!     batch.submit(SpecDiffRequest::new(p, &cfg, sd, &info, 48)?);
//! }
//! let mut done = batch.run(&mut target, &mut drafter)?;
//! done.sort_by_key(|f| f.id);
//! for (f, p) in done.into_iter().zip(prompts) {
//!     assert_eq!(f.output?.tokens, decode_autoregressive(&mut target, p, &cfg)?.tokens);
//! }
//! # Ok::<(), spot_core::Error>(())
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use spot_core::{
    ArGroup, AutoregressiveModel, CacheSlot, Error, MeteredArModel, RequestId, Result, TokenId,
};

use crate::decoder::{ArNeed, SpecDiffOutput, SpecDiffRequest};
use crate::drafter::{DiffusionDrafter, Marginals};

/// A request that left a [`SpecDiffBatch`].
#[derive(Debug)]
pub struct ArFinished {
    /// The request's number, in submission order from 0.
    pub id: RequestId,
    /// Its output (the report's times: its own drafting, and the wall time of every target
    /// forward it was part of), or what failed.
    pub output: Result<SpecDiffOutput>,
}

struct Live {
    id: RequestId,
    slot: CacheSlot,
    request: SpecDiffRequest,
    error: Option<Error>,
    times: (Duration, Duration),
}

/// Continuous batching of [`SpecDiffRequest`]s over one [`AutoregressiveModel`]; see the
/// [module documentation](self).
pub struct SpecDiffBatch {
    max_in_flight: usize,
    next_id: RequestId,
    queue: VecDeque<(RequestId, SpecDiffRequest)>,
    live: Vec<Live>,
    marginals: Marginals,
    forwards: u64,
    events: VecDeque<(RequestId, Vec<TokenId>)>,
}

impl std::fmt::Debug for SpecDiffBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecDiffBatch")
            .field("max_in_flight", &self.max_in_flight)
            .field("queued", &self.queue.len())
            .field("live", &self.live.len())
            .field("forwards", &self.forwards)
            .finish()
    }
}

impl Default for SpecDiffBatch {
    /// A driver with one request in flight at a time.
    fn default() -> Self {
        Self {
            max_in_flight: 1,
            next_id: 0,
            queue: VecDeque::new(),
            live: Vec::new(),
            marginals: Marginals::default(),
            forwards: 0,
            events: VecDeque::new(),
        }
    }
}

impl SpecDiffBatch {
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
    pub fn submit(&mut self, request: SpecDiffRequest) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back((id, request));
        id
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        self.queue.len() + self.live.len()
    }

    /// Requests in the running batch.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Requests waiting to join it.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The next round's committed tokens of some request (in commit order), for streaming:
    /// every token of an output arrives in one of these before the request finishes (a stop
    /// check may cut the last ones from the output).
    pub fn next_event(&mut self) -> Option<(RequestId, Vec<TokenId>)> {
        self.events.pop_front()
    }

    /// Target forwards run so far (one per step that scored anything).
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// One step: admits queued requests (each gets a new, empty cache slot), drafts for every
    /// request that needs a draft, runs one target forward over every request that needs
    /// scoring, and returns the requests that finished or failed (their slots closed). A
    /// failed request leaves alone; the outer error is the target's failure on a whole
    /// forward (every running request is then dropped with its slot).
    pub fn step(
        &mut self,
        target: &mut dyn AutoregressiveModel,
        drafter: &mut dyn DiffusionDrafter,
    ) -> Result<Vec<ArFinished>> {
        while self.live.len() < self.max_in_flight {
            let Some((id, request)) = self.queue.pop_front() else {
                break;
            };
            let slot = target.open_slot()?;
            let live = Live {
                id,
                slot,
                request,
                error: None,
                times: Default::default(),
            };
            self.live.push(live);
        }
        for l in self.live.iter_mut().filter(|l| l.error.is_none()) {
            let (temperature, noise) = l.request.target_sampling();
            if let ArNeed::Draft { context, gamma } = l.request.need() {
                let t0 = Instant::now();
                drafter.target_sampling(temperature, noise);
                let drafted = drafter
                    .propose(context, gamma, &mut self.marginals)
                    .and_then(|()| l.request.drafted(&self.marginals));
                l.times.0 += t0.elapsed();
                l.error = drafted.err();
            }
        }
        self.score(target).inspect_err(|_| self.drop_all(target))?;
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.live.len() {
            let l = &self.live[i];
            if l.error.is_none() && !matches!(l.request.need(), ArNeed::Done) {
                i += 1;
                continue;
            }
            let mut l = self.live.swap_remove(i);
            target.close_slot(l.slot);
            let output = match l.error.take() {
                Some(e) => Err(e),
                None => l.request.output().ok_or(Error::RequestState {
                    expected: "a finished request",
                    got: "a failed one",
                }),
            };
            finished.push(ArFinished {
                id: l.id,
                output: output.map(|mut o| {
                    (o.report.draft_time, o.report.target_time) = l.times;
                    o
                }),
            });
        }
        Ok(finished)
    }

    /// Steps until every submitted request has finished; returns them in the order they
    /// finished.
    pub fn run(
        &mut self,
        target: &mut dyn AutoregressiveModel,
        drafter: &mut dyn DiffusionDrafter,
    ) -> Result<Vec<ArFinished>> {
        let mut done = Vec::new();
        while self.pending() > 0 {
            done.extend(self.step(target, drafter)?);
        }
        Ok(done)
    }

    /// One forward over every request that needs scoring.
    fn score(&mut self, target: &mut dyn AutoregressiveModel) -> Result<()> {
        let (waiting, groups): (Vec<usize>, Vec<ArGroup<'_>>) = self
            .live
            .iter()
            .enumerate()
            .filter(|(_, l)| l.error.is_none())
            .filter_map(|(i, l)| match l.request.need() {
                ArNeed::Score {
                    shared,
                    branches,
                    query,
                } => Some((
                    i,
                    ArGroup {
                        slot: l.slot,
                        shared,
                        branches,
                        query,
                    },
                )),
                _ => None,
            })
            .unzip();
        if groups.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let answers = MeteredArModel::new(target).forward_each(&groups)?;
        let wall = t0.elapsed();
        drop(groups);
        self.forwards += 1;
        for (&i, answer) in waiting.iter().zip(answers) {
            let l = &mut self.live[i];
            l.times.1 += wall;
            let before = l.request.tokens().len();
            l.error = answer
                .and_then(|s| l.request.scored(s.shared, s.branches))
                .err();
            if let Some(new) = l.request.tokens().get(before..).filter(|t| !t.is_empty()) {
                self.events.push_back((l.id, new.to_vec()));
            }
        }
        Ok(())
    }

    fn drop_all(&mut self, target: &mut dyn AutoregressiveModel) {
        for l in self.live.drain(..) {
            target.close_slot(l.slot);
        }
    }
}
