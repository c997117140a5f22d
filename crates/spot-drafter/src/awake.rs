//! Keeping a worker of the pool awake while a tree is drafted.
//!
//! The drafters pair small calls with `rayon::join` (the token module's step beside the order
//! network's call, a call's states split over the threads), several times a round, a few
//! hundred microseconds each. Between two such joins the pool's other worker has nothing to
//! do and goes to sleep, and the next join wakes it: on a 2-vCPU virtual machine the calling
//! thread pays 11-14 µs for the wake before its own half starts, and the other half starts
//! 30-48 µs after the join began (`docs/drafter.md`). [`keep_awake`] leaves a job on the pool
//! that spins, running whatever work it finds ([`rayon::yield_now`]), until nothing has come
//! for [`WINDOW`]: the joins of a round then find a worker awake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the spinning job waits for work before it ends: longer than the gap between two
/// drafting calls of a round (the builder's own work, a few tens of microseconds), far
/// shorter than a forward.
pub(crate) const WINDOW: Duration = Duration::from_micros(150);

/// Whether a spinning job is alive (one is enough).
static SPINNING: AtomicBool = AtomicBool::new(false);

/// Leaves a job on the current pool that keeps one worker awake until [`WINDOW`] passes with
/// no work to run, unless one is alive already. Does nothing outside a pool or in a pool of
/// one thread. The job runs other work of the pool as it finds it, so nothing waits on it.
pub(crate) fn keep_awake() {
    if rayon::current_thread_index().is_none() || rayon::current_num_threads() < 2 {
        return;
    }
    if SPINNING.swap(true, Ordering::AcqRel) {
        return;
    }
    rayon::spawn(|| {
        let mut idle = Instant::now();
        while idle.elapsed() < WINDOW {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => idle = Instant::now(),
                _ => std::hint::spin_loop(),
            }
        }
        SPINNING.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spinning job ends by itself once no work comes, in a pool of two threads, and
    /// work handed to the pool meanwhile runs (here a join's second half).
    #[test]
    fn the_spinning_job_runs_work_and_ends() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool");
        let sum = pool.install(|| {
            let mut sum = 0u64;
            keep_awake();
            assert!(SPINNING.load(Ordering::Acquire), "no spinning job was left");
            for i in 0..200u64 {
                keep_awake();
                let (a, b) = rayon::join(|| i, || i * 2);
                sum += a + b;
            }
            sum
        });
        assert_eq!(sum, 3 * (0..200).sum::<u64>());
        let t = Instant::now();
        while SPINNING.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !SPINNING.load(Ordering::Acquire),
            "the spinning job never ended"
        );
    }
}
