//! Runs a loader over damaged copies of its seed files: each case under the allocation caps,
//! with a time cap, panics caught; the outcome of every case is tallied by damage class.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::alloc;
use crate::mutate::{CLASSES, Format, Rng, mutate};

/// What a load returns: `Ok` (it loaded), or the name of the typed error's variant.
pub type Outcome = Result<(), String>;

/// A loader's entry point over a folder.
pub type LoadFn = fn(&Path) -> Outcome;

/// One seed: a working folder whose `file` is damaged, then loaded with `load`.
pub struct Seed {
    pub dir: PathBuf,
    pub file: String,
    pub format: Format,
    pub load: LoadFn,
}

/// Inputs per loader: 10,000 (what CI runs); `SPOT_HOSTILE_CASES` overrides.
pub fn cases() -> usize {
    std::env::var("SPOT_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The damage stream's seed: fixed, so every run tries the same inputs and a failure
/// reproduces; `SPOT_HOSTILE_SEED` explores others.
pub fn stream_seed() -> u64 {
    std::env::var("SPOT_HOSTILE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5107)
}

/// The longest a single case may take before the suite calls it a hang.
const TIME_CAP: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Tally {
    inputs: usize,
    loaded: usize,
    errors: BTreeMap<String, usize>,
    by_class: BTreeMap<usize, (usize, usize)>,
    /// (class, error variant) -> count.
    class_errors: BTreeMap<(usize, String), usize>,
    slowest: Duration,
    peak: usize,
    failures: Vec<String>,
}

/// The variant name of a typed error's `Debug` form (`Json { .. }` -> `Json`).
pub fn kind(e: impl std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    let end = s.find([' ', '(', '{']).unwrap_or(s.len());
    s[..end].to_string()
}

/// Runs `name` over `cases()` damaged inputs cycling through `seeds`, checks that no case
/// panicked, hung, or allocated past the caps, and writes the tally to
/// `CARGO_TARGET_TMPDIR/hostile-NAME.md` (and stdout).
pub fn run(name: &'static str, seeds: Vec<Seed>) {
    let (inputs, failures) = check(name, seeds, cases());
    assert!(
        failures.is_empty(),
        "{name}: {} of {inputs} inputs failed (SPOT_HOSTILE_SEED={}); first: {:#?}",
        failures.len(),
        stream_seed(),
        &failures[..failures.len().min(8)]
    );
}

/// Runs `n` damaged inputs through `name`'s seeds and returns the number run and the
/// failures (panics, hangs, allocations past the caps), after writing the tally.
pub fn check(name: &'static str, seeds: Vec<Seed>, n: usize) -> (usize, Vec<String>) {
    alloc::arm();
    // Every seed must load undamaged: otherwise the damage is not what fails it.
    for s in &seeds {
        if let Err(e) = (s.load)(&s.dir) {
            panic!(
                "{name}: the undamaged seed {} fails: {e}",
                s.dir.join(&s.file).display()
            );
        }
    }
    let current = Arc::new(Mutex::new((0usize, Instant::now())));
    let done = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (current, done) = (current.clone(), done.clone());
        std::thread::Builder::new()
            .name(format!("hostile-{name}"))
            .stack_size(64 << 20)
            .spawn(move || {
                let originals: Vec<Vec<u8>> = seeds
                    .iter()
                    .map(|s| std::fs::read(s.dir.join(&s.file)).expect("seed file"))
                    .collect();
                let mut rng =
                    Rng::new(stream_seed() ^ (name.len() as u64).wrapping_mul(0x1000_0001));
                let mut t = Tally::default();
                for i in 0..n {
                    let k = i % seeds.len();
                    let s = &seeds[k];
                    let (class, bytes) = mutate(&originals[k], s.format, &mut rng);
                    let path = s.dir.join(&s.file);
                    std::fs::write(&path, &bytes).expect("write the damaged file");
                    *current.lock().unwrap() = (i, Instant::now());
                    let base = alloc::begin(name, i);
                    let start = Instant::now();
                    let r = catch_unwind(AssertUnwindSafe(|| (s.load)(&s.dir)));
                    let took = start.elapsed();
                    let (peak, violation) = alloc::end(base);
                    std::fs::write(&path, &originals[k]).expect("restore the seed file");
                    t.inputs += 1;
                    t.slowest = t.slowest.max(took);
                    t.peak = t.peak.max(peak);
                    let entry = t.by_class.entry(class).or_default();
                    entry.0 += 1;
                    let what = format!("case {i} ({}, seed {})", CLASSES[class], path.display());
                    match r {
                        Ok(Ok(())) => {
                            t.loaded += 1;
                            entry.1 += 1;
                        }
                        Ok(Err(e)) => {
                            *t.class_errors.entry((class, e.clone())).or_default() += 1;
                            *t.errors.entry(e).or_default() += 1;
                        }
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            t.failures.push(format!("{what}: panicked: {msg}"));
                        }
                    }
                    if let Some(v) = violation {
                        t.failures.push(format!("{what}: {v}"));
                    }
                    if took > TIME_CAP {
                        t.failures.push(format!("{what}: took {took:?}"));
                    }
                    done.store(i + 1, Ordering::Relaxed);
                }
                t
            })
            .expect("spawn the loader thread")
    };
    // The watchdog: a case past the time cap fails the test even if it never returns.
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        let (i, since) = *current.lock().unwrap();
        if done.load(Ordering::Relaxed) <= i && since.elapsed() > TIME_CAP * 3 {
            panic!("{name}: case {i} hangs (over {:?})", TIME_CAP * 3);
        }
    }
    let t = worker
        .join()
        .expect("the loader thread panicked outside a case");
    report(name, &t);
    (t.inputs, t.failures)
}

fn report(name: &str, t: &Tally) {
    let mut errors: Vec<(&String, &usize)> = t.errors.iter().collect();
    errors.sort_by(|a, b| b.1.cmp(a.1));
    let errors = errors
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let classes = t
        .by_class
        .iter()
        .map(|(c, (n, ok))| format!("{} {n} ({ok} loaded)", CLASSES[*c]))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "| {name} | {} | {} | {} | {errors} | {classes} | {:.1} | {:.1} |\n",
        t.inputs,
        t.loaded,
        t.failures.len(),
        t.slowest.as_secs_f64() * 1e3,
        t.peak as f64 / (1 << 20) as f64,
    );
    print!("{text}");
    // Then one line per (class, outcome) for docs/robustness.md's table by class.
    let mut text = text;
    for (c, (n, ok)) in &t.by_class {
        text += &format!("class\t{}\tinputs\t{n}\n", CLASSES[*c]);
        text += &format!("class\t{}\tloaded\t{ok}\n", CLASSES[*c]);
    }
    for ((c, e), n) in &t.class_errors {
        text += &format!("class\t{}\t{e}\t{n}\n", CLASSES[*c]);
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}.md"));
    let _ = std::fs::write(out, text);
}
