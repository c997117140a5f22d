//! A counting global allocator with caps: while the suite runs, one allocation larger than
//! [`SINGLE_CAP`], or a thread holding more than [`LIVE_CAP`] bytes, is recorded as a
//! violation (the case that caused it fails); one larger than [`HARD_CAP`] is refused (the
//! process aborts after naming the case) because it could not be served on this machine.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Largest single allocation a load of the suite's small seed files may need.
pub const SINGLE_CAP: usize = 64 << 20;
/// Largest number of bytes one loading thread may hold at once.
pub const LIVE_CAP: isize = 256 << 20;
/// Allocations above this are refused outright.
pub const HARD_CAP: usize = 1 << 30;

/// Whether the caps apply (the suite's binary holds only hostile-input tests).
static ARMED: AtomicBool = AtomicBool::new(false);
/// Largest allocation above [`SINGLE_CAP`] since the last [`take_violation`] (0: none).
static OVER: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static OVER_LIVE: Cell<isize> = const { Cell::new(0) };
    static OVER_HERE: Cell<usize> = const { Cell::new(0) };
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    static CASE: Cell<(&'static str, usize)> = const { Cell::new(("", 0)) };
}

/// The capped allocator (installed by the suite's `main.rs`).
pub struct Capped;

fn grow(by: isize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get() + by;
        l.set(now);
        if by > 0 {
            let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
            if now > LIVE_CAP {
                let _ = OVER_LIVE.try_with(|o| o.set(o.get().max(now)));
            }
        }
    });
}

/// Checks one request of `size` bytes; `false` refuses it.
fn admit(size: usize) -> bool {
    if !ARMED.load(Ordering::Relaxed) {
        return true;
    }
    if size > HARD_CAP {
        refuse(size);
        return false;
    }
    if size > SINGLE_CAP {
        // A case's own thread keeps its violations; helper threads (a backend's pool) report
        // to whichever case ends next.
        if IN_CASE.try_with(Cell::get).unwrap_or(false) {
            let _ = OVER_HERE.try_with(|o| o.set(o.get().max(size)));
        } else {
            OVER.fetch_max(size, Ordering::Relaxed);
        }
    }
    true
}

/// Names the case on stderr without allocating, before the refusal aborts the process.
fn refuse(size: usize) {
    let (loader, case) = CASE.try_with(Cell::get).unwrap_or(("?", 0));
    let mut buf = [0u8; 160];
    let mut at = 0;
    for part in [
        b"hostile: refused an allocation of ".as_slice(),
        digits(size, &mut [0; 20]),
        b" bytes in loader `",
        loader.as_bytes(),
        b"` case ",
        digits(case, &mut [0; 20]),
        b"\n",
    ] {
        let n = part.len().min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&part[..n]);
        at += n;
    }
    let _ = std::io::stderr().write_all(&buf[..at]);
}

fn digits(mut v: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// A new allocation of `size` bytes by `alloc`, when the caps admit it, counted when it succeeds.
fn counted(size: usize, alloc: impl FnOnce() -> *mut u8) -> *mut u8 {
    if !admit(size) {
        return std::ptr::null_mut();
    }
    let p = alloc();
    if !p.is_null() {
        grow(size as isize);
    }
    p
}

// SAFETY: every call forwards to `System` with the caller's layout; the bookkeeping touches only
// atomics and const-initialised thread-locals without destructors (no allocation, no unwinding).
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        counted(layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        counted(layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        grow(-(layout.size() as isize));
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admit(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            grow(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Turns the caps on for the rest of the process.
pub fn arm() {
    ARMED.store(true, Ordering::Relaxed);
}

/// Marks the start of a case on this thread: names it for a refusal message and resets the
/// thread's peak. Returns the bytes the thread holds before it.
pub fn begin(loader: &'static str, case: usize) -> isize {
    CASE.with(|c| c.set((loader, case)));
    OVER_LIVE.with(|o| o.set(0));
    OVER_HERE.with(|o| o.set(0));
    IN_CASE.with(|c| c.set(true));
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    live
}

/// After a case begun at `base` live bytes: the peak the case added, and a violation
/// (a single allocation above [`SINGLE_CAP`] anywhere, or this thread above [`LIVE_CAP`]).
pub fn end(base: isize) -> (usize, Option<String>) {
    let peak = PEAK.with(Cell::get) - base;
    IN_CASE.with(|c| c.set(false));
    let here = OVER_HERE.with(Cell::get);
    let anywhere = OVER.swap(0, Ordering::Relaxed);
    let over_live = OVER_LIVE.with(Cell::get);
    let violation = if here > 0 {
        Some(format!("allocated {here} bytes at once (cap {SINGLE_CAP})"))
    } else if anywhere > 0 {
        Some(format!(
            "a thread allocated {anywhere} bytes at once during the case (cap {SINGLE_CAP})"
        ))
    } else if over_live > 0 {
        Some(format!("held {over_live} bytes (cap {LIVE_CAP})"))
    } else {
        None
    };
    (peak.max(0) as usize, violation)
}
