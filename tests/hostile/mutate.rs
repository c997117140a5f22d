//! Deterministic damage to seed files: byte-level (truncations, bit flips, interesting bytes,
//! insertions, deletions, repeats, invalid UTF-8, deep nesting) and structure-aware (JSON
//! values: type swaps, huge, negative and off-by-one numbers, removed and unknown keys, long
//! strings, grown arrays; safetensors: lying header lengths and damaged headers).

use serde_json::{Map, Number, Value};

/// A SplitMix64 stream: the same seed gives the same inputs on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// One of `xs` (not empty), uniformly.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// How a seed file is structured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON text (configs, tokenizers, drafter tables, manifests).
    Json,
    /// Safetensors: a little-endian u64 header length, a JSON header, tensor data.
    Safetensors,
    /// Opaque bytes (trajectory files, templates).
    Bytes,
}

/// The classes of damage, as reported in the summary.
pub const CLASSES: [&str; 14] = [
    "truncation",
    "bit flips",
    "byte overwrite",
    "insertion",
    "deletion",
    "repeat",
    "invalid UTF-8",
    "deep nesting",
    "JSON number",
    "JSON type swap",
    "JSON key",
    "lying length",
    "header JSON",
    "tensor data",
];

/// One damaged copy of `seed` and the index of its class in [`CLASSES`].
pub fn mutate(seed: &[u8], format: Format, rng: &mut Rng) -> (usize, Vec<u8>) {
    match format {
        Format::Json if rng.below(2) == 0 => {
            if let Some(v) = json_mutation(seed, rng) {
                return v;
            }
            bytes_mutation(seed, rng)
        }
        Format::Safetensors => match rng.below(4) {
            0 => (11, lying_length(seed, rng)),
            3 => (13, data_damage(seed, rng)),
            1 => header_mutation(seed, rng).unwrap_or_else(|| bytes_mutation(seed, rng)),
            _ => {
                // Byte damage, mostly inside the header where the structure is.
                let header = header_len(seed).map_or(seed.len(), |h| (8 + h).min(seed.len()));
                let (class, mut head) = bytes_mutation(&seed[..header], rng);
                if class != 0 || rng.below(2) == 0 {
                    head.extend_from_slice(&seed[header..]);
                }
                (class, head)
            }
        },
        _ => bytes_mutation(seed, rng),
    }
}

fn bytes_mutation(seed: &[u8], rng: &mut Rng) -> (usize, Vec<u8>) {
    let mut b = seed.to_vec();
    let n = b.len().max(1);
    let class = rng.below(8);
    match class {
        0 => {
            // Truncation: anywhere, biased to the first bytes where headers live.
            let cut = if rng.below(2) == 0 {
                rng.below(64.min(n))
            } else {
                rng.below(n)
            };
            b.truncate(cut);
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
            }
        }
        2 => {
            const INTERESTING: &[u8] = b"\x00\xff\x7f\x80\"{}[]:,-9e.\\0 ";
            for _ in 0..1 + rng.below(4) {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] = *rng.pick(INTERESTING);
                }
            }
        }
        3 => {
            let at = rng.below(n);
            let len = 1 + rng.below(16);
            let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            b.splice(at.min(b.len())..at.min(b.len()), junk);
        }
        4 => {
            let at = rng.below(n).min(b.len());
            let end = (at + 1 + rng.below(64)).min(b.len());
            b.drain(at..end);
        }
        5 => {
            let at = rng.below(n).min(b.len());
            let end = (at + 1 + rng.below(256)).min(b.len());
            let chunk = b[at..end].to_vec();
            for _ in 0..1 + rng.below(64) {
                b.splice(end..end, chunk.iter().copied());
            }
        }
        6 => {
            const BAD: &[&[u8]] = &[b"\xc3\x28", b"\xff", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28"];
            let at = rng.below(n).min(b.len());
            b.splice(at..at, rng.pick(BAD).iter().copied());
        }
        _ => {
            let depth = *rng.pick(&[64usize, 200, 5_000, 100_000]);
            let (open, close) = *rng.pick(&[(b"[", b"]"), (b"{", b"}"), (b"(", b")")]);
            let mut nest = open.repeat(depth);
            if rng.below(2) == 0 {
                nest.extend(close.repeat(depth));
            }
            let at = rng.below(n).min(b.len());
            b.splice(at..at, nest);
        }
    }
    (class, b)
}

/// Every node of `v` as a path of keys / indices.
fn paths(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<(Vec<PathStep>, bool)>) {
    out.push((at.clone(), v.is_number()));
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(PathStep::Key(k.clone()));
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            // Long arrays (vocabularies, weights): a sample of their elements.
            let step = (a.len() / 16).max(1);
            for (i, x) in a.iter().enumerate().step_by(step) {
                at.push(PathStep::Index(i));
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn node<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut v = v;
    for s in path {
        v = match s {
            PathStep::Key(k) => v.get_mut(k.as_str())?,
            PathStep::Index(i) => v.get_mut(*i)?,
        };
    }
    Some(v)
}

fn json_mutation(seed: &[u8], rng: &mut Rng) -> Option<(usize, Vec<u8>)> {
    let mut v: Value = serde_json::from_slice(seed).ok()?;
    let class = mutate_value(&mut v, rng);
    Some((class, serde_json::to_vec(&v).ok()?))
}

/// Damages one node of `v`; returns the class.
fn mutate_value(v: &mut Value, rng: &mut Rng) -> usize {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    // Prefer numbers: sizes, ids and offsets are what allocations follow.
    let numbers: Vec<&Vec<PathStep>> = all.iter().filter(|p| p.1).map(|p| &p.0).collect();
    let path = if !numbers.is_empty() && rng.below(2) == 0 {
        (*rng.pick(&numbers)).clone()
    } else {
        rng.pick(&all).0.clone()
    };
    let Some(target) = node(v, &path) else {
        return 9;
    };
    match rng.below(3) {
        0 => {
            *target = number(target, rng);
            8
        }
        1 => {
            *target = swapped(rng);
            9
        }
        _ => {
            match target {
                Value::Object(m) if !m.is_empty() && rng.below(2) == 0 => {
                    let k = m
                        .keys()
                        .nth(rng.below(m.len()))
                        .cloned()
                        .unwrap_or_default();
                    m.remove(&k);
                }
                Value::Object(m) => {
                    m.insert("spot_unknown_field".into(), Value::from(1));
                }
                Value::Array(a) if !a.is_empty() => match rng.below(3) {
                    0 => {
                        a.remove(rng.below(a.len()));
                    }
                    1 => a.clear(),
                    _ => {
                        let x = a[rng.below(a.len())].clone();
                        for _ in 0..1 + rng.below(300) {
                            a.push(x.clone());
                        }
                    }
                },
                other => *other = swapped(rng),
            }
            10
        }
    }
}

/// A hostile replacement for a number: huge, negative, zero, off by one, scaled, fractional.
fn number(old: &Value, rng: &mut Rng) -> Value {
    let base = old.as_f64().unwrap_or(1.0);
    let int = old.as_i64().unwrap_or(1);
    match rng.below(12) {
        0 => Value::from(u64::MAX),
        1 => Value::from(1_000_000_000_000u64),
        2 => Value::from(i64::MIN),
        3 => Value::from(-1),
        4 => Value::from(0),
        5 => Value::from(int.saturating_add(1)),
        6 => Value::from(int.saturating_sub(1)),
        7 => Value::from(int.saturating_mul(*rng.pick(&[2i64, 16, 1000, 1 << 20, 1 << 32]))),
        8 => Number::from_f64(base * 1e300).map_or(Value::Null, Value::Number),
        9 => Number::from_f64(base + 0.5).map_or(Value::Null, Value::Number),
        10 => Value::from(1u64 << 31),
        _ => Value::from(u32::MAX),
    }
}

fn swapped(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::Null,
        1 => Value::Bool(true),
        2 => Value::from("x"),
        3 => Value::from("\u{0}\u{fffd}".repeat(1 + rng.below(4))),
        4 => Value::Array(Vec::new()),
        5 => Value::Object(Map::new()),
        6 => Value::from("a".repeat(100_000)),
        _ => {
            let mut v = Value::from(1);
            for _ in 0..100 {
                v = Value::Array(vec![v]);
            }
            v
        }
    }
}

fn header_len(b: &[u8]) -> Option<usize> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    usize::try_from(n).ok().filter(|&n| n <= b.len() - 8)
}

fn lying_length(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    let real = header_len(seed).unwrap_or(0) as u64;
    let lie = match rng.below(8) {
        0 => u64::MAX,
        1 => 1 << 40,
        2 => b.len() as u64,
        3 => (b.len() as u64).saturating_sub(7),
        4 => real + 1,
        5 => real.saturating_sub(1),
        6 => 0,
        _ => rng.next() % (b.len() as u64 * 2).max(1),
    };
    if b.len() >= 8 {
        b[..8].copy_from_slice(&lie.to_le_bytes());
    }
    b
}

/// The header JSON damaged (shapes, offsets, dtypes, names, metadata) and written back with its
/// new length (or, sometimes, the old one).
fn header_mutation(seed: &[u8], rng: &mut Rng) -> Option<(usize, Vec<u8>)> {
    let h = header_len(seed)?;
    let mut v: Value = serde_json::from_slice(&seed[8..8 + h]).ok()?;
    if rng.below(3) == 0 {
        // A dtype that lies about the element size.
        let names: Vec<String> = v.as_object()?.keys().cloned().collect();
        let name = rng.pick(&names).clone();
        if let Some(Value::Object(t)) = v.get_mut(&name) {
            let dtype = *rng.pick(&["F64", "I8", "BOOL", "U64", "F8_E4M3", "XX", "BF16", "F32"]);
            t.insert("dtype".into(), Value::from(dtype));
        }
    } else {
        mutate_value(&mut v, rng);
    }
    let header = serde_json::to_vec(&v).ok()?;
    let len = if rng.below(8) == 0 { h } else { header.len() };
    let mut out = (len as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&seed[8 + h..]);
    Some((12, out))
}

/// Tensor bytes overwritten (NaN and infinity patterns, sign flips, random bytes); the header
/// is kept.
fn data_damage(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    let start = header_len(seed).map_or(0, |h| 8 + h);
    if start >= b.len() {
        return b;
    }
    for _ in 0..1 + rng.below(8) {
        let i = start + rng.below(b.len() - start);
        b[i] = match rng.below(4) {
            0 => 0xff,
            1 => 0x7f,
            2 => b[i] ^ 0x80,
            _ => rng.next() as u8,
        };
    }
    b
}
