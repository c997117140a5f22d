//! A job the pool's other thread runs beside the calling thread's work, many times a call,
//! without waking a thread each time.
//!
//! `rayon::join` hands its second closure to a sleeping worker: the calling thread pays for
//! the wake before its own closure starts, and the worker starts later still (on a 2-core
//! virtual machine 11-14 µs and 30-48 µs a join, against a 200 µs order-network call). The
//! set builder pairs a join-model prediction with an order-scorer call at every expansion,
//! about 8 times a round, so it keeps a helper instead: one `rayon::join` per tree, whose
//! second half spins on an atomic state and runs each posted job; the calling thread runs a
//! job itself when no helper has taken it yet (a pool of one thread, or a busy one), so
//! nothing waits on a thread that never comes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// No job outstanding.
const IDLE: u8 = 0;
/// A job is posted and nobody runs it yet.
const POSTED: u8 = 1;
/// The helper runs the job.
const RUNNING: u8 = 2;
/// The helper has run the job.
const DONE: u8 = 3;
/// The calling thread's work is over: the helper returns.
const STOP: u8 = 4;

/// The job's data and how to run it, shared by the calling thread and the helper.
pub(crate) struct Helper<'r, S> {
    job: Mutex<S>,
    state: AtomicU8,
    run: &'r (dyn Fn(&mut S) + Sync),
}

/// Runs `main` on the calling thread with a helper that runs `run` on `job` whenever `main`
/// posts it ([`Helper::post`], [`Helper::wait`]); returns `main`'s result and the job.
pub(crate) fn with_helper<S: Send, R: Send>(
    job: S,
    run: &(dyn Fn(&mut S) + Sync),
    main: impl FnOnce(&Helper<'_, S>) -> R + Send,
) -> (R, S) {
    let helper = Helper {
        job: Mutex::new(job),
        state: AtomicU8::new(IDLE),
        run,
    };
    let (r, ()) = rayon::join(
        || {
            // Stops the helper however `main` ends (an unwinding panic included).
            let _stop = Stop(&helper.state);
            main(&helper)
        },
        || helper.serve(),
    );
    let job = helper
        .job
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    (r, job)
}

/// Tells the helper to return when dropped.
struct Stop<'a>(&'a AtomicU8);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(STOP, Ordering::Release);
    }
}

/// Marks a job run when dropped, a panicking one included (the caller then stops spinning;
/// `rayon::join` passes the panic on).
struct Ran<'a>(&'a AtomicU8);

impl Drop for Ran<'_> {
    fn drop(&mut self) {
        // After a stop the state stays `STOP`.
        let _ = self
            .0
            .compare_exchange(RUNNING, DONE, Ordering::Release, Ordering::Relaxed);
    }
}

impl<S> Helper<'_, S> {
    /// Sets up the next job with `set` (after the outstanding one, if any, has run) and
    /// posts it.
    pub(crate) fn post(&self, set: impl FnOnce(&mut S)) {
        set(&mut self.wait());
        self.state.store(POSTED, Ordering::Release);
    }

    /// The job once the posted one has run (by the helper, or here when no helper has taken
    /// it); with nothing posted, the job as it is.
    pub(crate) fn wait(&self) -> MutexGuard<'_, S> {
        loop {
            match self.state.load(Ordering::Acquire) {
                POSTED => {
                    if self
                        .state
                        .compare_exchange(POSTED, IDLE, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        let mut job = self.lock();
                        (self.run)(&mut job);
                        return job;
                    }
                }
                RUNNING => std::hint::spin_loop(),
                DONE => {
                    self.state.store(IDLE, Ordering::Relaxed);
                    return self.lock();
                }
                _ => return self.lock(),
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, S> {
        self.job.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The helper's loop: runs each posted job until the stop.
    fn serve(&self) {
        loop {
            match self.state.load(Ordering::Acquire) {
                STOP => return,
                POSTED => {
                    if self
                        .state
                        .compare_exchange(POSTED, RUNNING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        let _ran = Ran(&self.state);
                        (self.run)(&mut self.lock());
                    }
                }
                _ => std::hint::spin_loop(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every posted job that is waited for (or followed by another) runs once, in order,
    /// whoever runs it: with a pool of two threads (the
    /// helper takes most) and of one (the caller runs them all).
    #[test]
    fn every_posted_job_runs_once_in_order() {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a pool");
            let (sum, job) = pool.install(|| {
                with_helper(
                    (0u64, Vec::new()),
                    &|j: &mut (u64, Vec<u64>)| {
                        let x = j.0;
                        j.1.push(x * x);
                    },
                    |h| {
                        let mut sum = 0;
                        for i in 0..2000u64 {
                            h.post(|j| j.0 = i);
                            if i % 3 == 0 {
                                sum += h.wait().1.last().copied().unwrap_or(u64::MAX);
                            }
                        }
                        // The last job runs once waited for.
                        drop(h.wait());
                        sum
                    },
                )
            });
            let squares: Vec<u64> = (0..2000).map(|i| i * i).collect();
            assert!(
                job.1 == squares,
                "{threads} threads: {} jobs ran",
                job.1.len()
            );
            assert_eq!(sum, (0..2000).step_by(3).map(|i| i * i).sum::<u64>());
        }
    }

    /// A panic in the caller's work stops the helper and reaches the caller.
    #[test]
    fn a_panic_in_the_work_ends_the_helper() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                with_helper(0u32, &|j: &mut u32| *j += 1, |h| {
                    h.post(|_| {});
                    panic!("work failed")
                })
            })
        }));
        assert!(caught.is_err());
    }
}
