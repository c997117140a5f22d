//! Retrieval drafting: the target's own continuations of training-side prompts, indexed by
//! n-gram, and the acceptance calibration fitted on them.
//!
//! A [`LookupStore`] holds continuations the target wrote itself (what `spot generate --json`
//! writes: one JSON object per line with `prompt_ids` and `tokens`). A
//! [`LookupDrafter`](crate::LookupDrafter) built [`with_store`](crate::LookupDrafter::with_store)
//! makes two guesses for each drafted position, one from the text so far (prompt lookup:
//! what followed earlier occurrences of its last 1-3 tokens) and one from the store (what
//! followed the longest of its last 2-6 tokens in the target's continuations: phrases the
//! target tends to write), gives each a **calibrated** probability, the rate at which such
//! guesses (same source, match length, share and count of the top follower) were right on
//! the store's own continuations, and drafts the more probable one. With calibrated
//! probabilities `SpecDiffConfig::min_draft_prob` cuts drafts where acceptance really falls
//! off, so a round verifies few rows the target will not accept.
//!
//! The calibration is fitted when the store is built: the continuations are split in
//! [`FOLDS`] folds, and at every generated position of a fold's continuations both guesses
//! (the text so far, and a store of the other folds) are checked against the token the
//! target wrote, so a guess is never scored against the continuation it was taken from.
//! Building is deterministic: the same continuations give the same store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use spot_core::TokenId;

/// Longest n-gram (in tokens) the store indexes.
pub const STORE_MAX_N: usize = 6;
/// Shortest n-gram the store indexes (a single token matches too much to be worth it).
pub const STORE_MIN_N: usize = 2;
/// Folds of the calibration fit: each fold's continuations are guessed from a store of the
/// others, so counts in the fit are close to the whole store's.
pub const FOLDS: usize = 8;
/// Tokens at the end of the text so far that a retrieval guess searches for its own match
/// (so a guess costs at most this much, whatever the context length).
pub const CONTEXT_WINDOW: usize = 4096;
/// Longest continuation (prompt plus generated tokens) a store file may hold per line.
pub const MAX_CONTINUATION: usize = 8192;
/// Followers kept per n-gram (most frequent first).
const KEPT: usize = 8;
/// Longest n-gram matched in the text so far (as [`LookupDrafter::new`](crate::LookupDrafter::new)'s
/// default of the command line).
pub(crate) const CONTEXT_MAX_N: usize = 3;

/// A file that cannot be read as a lookup store; each names the file (and the line).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file cannot be read.
    #[error("cannot read lookup store {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a continuation.
    #[error("lookup store {path}, line {line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// No line holds a continuation.
    #[error("lookup store {path} holds no continuation (lines with \"prompt_ids\" and \"tokens\")")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// One continuation the target wrote: its prompt and the tokens it generated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Continuation {
    /// The prompt's ids.
    pub prompt: Vec<TokenId>,
    /// The generated ids.
    pub tokens: Vec<TokenId>,
}

/// Where a guess came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The text so far.
    Context,
    /// The store.
    Store,
}

/// The tokens that followed one matched n-gram, most frequent first (ties: first seen).
#[derive(Clone, Debug)]
pub(crate) struct Guess {
    /// Candidate ids and how often each followed.
    pub followers: Vec<(TokenId, u32)>,
    /// Matched length.
    pub n: usize,
    /// Where the match was found.
    pub source: Source,
}

impl Guess {
    /// The calibration cell of this guess: source × match length (1-4+) × share of the top
    /// follower (quartiles) × its count (1, 2, 3+).
    fn cell(&self) -> usize {
        let total: u32 = self.followers.iter().map(|f| f.1).sum();
        let top = self.followers.first().map_or(0, |f| f.1);
        let share = if total > 0 {
            f64::from(top) / f64::from(total)
        } else {
            0.0
        };
        let source = usize::from(self.source == Source::Store);
        let n = self.n.clamp(1, 4) - 1;
        let quartile = ((share * 4.0) as usize).min(3);
        let count = (top as usize).clamp(1, 3) - 1;
        ((source * 4 + n) * 4 + quartile) * 3 + count
    }
}

/// Cells of the calibration table (see [`Guess::cell`]).
const CELLS: usize = 2 * 4 * 4 * 3;

/// Acceptance counts per calibration cell.
#[derive(Clone, Debug, PartialEq)]
struct Calibration {
    hits: Vec<u32>,
    trials: Vec<u32>,
}

impl Calibration {
    fn new() -> Self {
        Self {
            hits: vec![0; CELLS],
            trials: vec![0; CELLS],
        }
    }

    /// Acceptance rate of a cell, with half a hit in two pseudo-trials (an unseen cell: 0.25).
    fn rate(&self, cell: usize) -> f32 {
        (self.hits[cell] as f32 + 0.5) / (self.trials[cell] as f32 + 2.0)
    }
}

/// The n-gram index of a set of continuations (their generated tokens).
#[derive(Clone, Debug, Default)]
struct Index {
    map: HashMap<Vec<TokenId>, Vec<(TokenId, u32)>>,
}

impl Index {
    fn build<'a>(conts: impl IntoIterator<Item = &'a Continuation>) -> Self {
        let mut map: HashMap<Vec<TokenId>, Vec<(TokenId, u32)>> = HashMap::new();
        for c in conts {
            let t = &c.tokens;
            for end in 1..t.len() {
                let next = t[end];
                for n in STORE_MIN_N..=STORE_MAX_N.min(end) {
                    let f = map.entry(t[end - n..end].to_vec()).or_default();
                    match f.iter_mut().find(|e| e.0 == next) {
                        Some(e) => e.1 += 1,
                        None => f.push((next, 1)),
                    }
                }
            }
        }
        for f in map.values_mut() {
            // Stable: equal counts keep the order they were first seen in.
            f.sort_by_key(|e| std::cmp::Reverse(e.1));
            f.truncate(KEPT);
        }
        Self { map }
    }

    /// The longest indexed suffix of `text` (down to [`STORE_MIN_N`]) and its followers.
    fn longest(&self, text: &[TokenId]) -> Option<(usize, &[(TokenId, u32)])> {
        (STORE_MIN_N..=STORE_MAX_N.min(text.len()))
            .rev()
            .find_map(|n| self.map.get(&text[text.len() - n..]).map(|f| (n, &f[..])))
    }
}

/// The tokens that followed earlier occurrences of the longest suffix of `text` (up to
/// `max_n` tokens, down to 1) within `text` itself, most frequent first, ties most recent
/// first; the matched length (0 and no followers when nothing matched).
pub(crate) fn context_followers(
    text: &[TokenId],
    max_n: usize,
    out: &mut Vec<(TokenId, u32)>,
) -> usize {
    out.clear();
    for n in (1..=max_n.min(text.len().saturating_sub(1))).rev() {
        let key = &text[text.len() - n..];
        // Most recent occurrence first (recency breaks count ties).
        for start in (0..text.len() - n).rev() {
            if &text[start..start + n] == key {
                let next = text[start + n];
                match out.iter_mut().find(|c| c.0 == next) {
                    Some(c) => c.1 += 1,
                    None => out.push((next, 1)),
                }
            }
        }
        if !out.is_empty() {
            out.sort_by_key(|e| std::cmp::Reverse(e.1));
            return n;
        }
    }
    0
}

/// The two guesses for the position after `text`: from the text itself (its last
/// [`CONTEXT_WINDOW`] tokens) and from `index`; each `None` when it matches nothing.
fn guesses(
    text: &[TokenId],
    index: &Index,
    scratch: &mut Vec<(TokenId, u32)>,
) -> [Option<Guess>; 2] {
    let recent = &text[text.len().saturating_sub(CONTEXT_WINDOW)..];
    let n = context_followers(recent, CONTEXT_MAX_N, scratch);
    let context = (n > 0).then(|| Guess {
        followers: scratch.clone(),
        n,
        source: Source::Context,
    });
    let store = index.longest(text).map(|(n, f)| Guess {
        followers: f.to_vec(),
        n,
        source: Source::Store,
    });
    [context, store]
}

/// The target's own continuations indexed by n-gram, with the acceptance rates of guesses
/// measured on them. Build it with [`LookupStore::new`] or [`LookupStore::open`]; draft with
/// [`LookupDrafter::with_store`](crate::LookupDrafter::with_store).
#[derive(Clone, Debug)]
pub struct LookupStore {
    index: Index,
    calibration: Calibration,
    continuations: usize,
    tokens: usize,
}

impl LookupStore {
    /// Indexes `conts` and fits the calibration on them ([`FOLDS`]-fold: each fold's guesses
    /// come from a store of the others).
    pub fn new(conts: &[Continuation]) -> Self {
        let folds = conts.len().clamp(1, FOLDS);
        let mut calibration = Calibration::new();
        for fold in 0..folds {
            let others = conts.iter().enumerate().filter(|(i, _)| i % folds != fold);
            let index = Index::build(others.map(|(_, c)| c));
            for c in conts.iter().skip(fold).step_by(folds) {
                score(c, &index, &mut calibration);
            }
        }
        Self {
            index: Index::build(conts),
            calibration,
            continuations: conts.len(),
            tokens: conts.iter().map(|c| c.tokens.len()).sum(),
        }
    }

    /// Reads a store file (JSON lines, each an object with `prompt_ids` and `tokens`, arrays
    /// of token ids below `vocab`, together at most [`MAX_CONTINUATION`]; other fields, such
    /// as the rest of what `spot generate --json` writes, are ignored; blank lines are
    /// skipped) and builds it.
    pub fn open(path: &Path, vocab: usize) -> Result<Self, StoreError> {
        let text = std::fs::read_to_string(path).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut conts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |reason: String| StoreError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                reason,
            };
            let value: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
            let ids = |field: &str| -> Result<Vec<TokenId>, StoreError> {
                let list = value
                    .get(field)
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| bad(format!("\"{field}\" is missing or not an array")))?;
                list.iter()
                    .map(|v| match v.as_u64() {
                        Some(t) if (t as usize) < vocab => Ok(t as TokenId),
                        _ => Err(bad(format!(
                            "\"{field}\" holds {v}, not a token id below the vocabulary of {vocab}"
                        ))),
                    })
                    .collect()
            };
            let c = Continuation {
                prompt: ids("prompt_ids")?,
                tokens: ids("tokens")?,
            };
            if c.prompt.len() + c.tokens.len() > MAX_CONTINUATION {
                return Err(bad(format!(
                    "{} prompt and generated tokens, more than {MAX_CONTINUATION}",
                    c.prompt.len() + c.tokens.len()
                )));
            }
            conts.push(c);
        }
        if conts.is_empty() {
            return Err(StoreError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Self::new(&conts))
    }

    /// Continuations indexed.
    pub fn continuations(&self) -> usize {
        self.continuations
    }

    /// Generated tokens indexed.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// The guess for the position after `text` and its calibrated probability: the more
    /// probable of the text's own and the store's (on a tie the longer match, then the
    /// text's); `None` when neither matches.
    pub(crate) fn guess(
        &self,
        text: &[TokenId],
        scratch: &mut Vec<(TokenId, u32)>,
    ) -> Option<(Guess, f32)> {
        let [context, store] = guesses(text, &self.index, scratch);
        let rate = |g: Guess| {
            let p = self.calibration.rate(g.cell());
            (g, p)
        };
        match (context.map(rate), store.map(rate)) {
            (Some(c), Some(s)) if (s.1, s.0.n) > (c.1, c.0.n) => Some(s),
            (Some(c), _) => Some(c),
            (None, s) => s,
        }
    }

    /// Measured acceptance (hits, trials) of the fitted guesses, per source (text so far,
    /// store), summed over match lengths and shares: what the calibration rests on.
    pub fn fit_counts(&self) -> [(u32, u32); 2] {
        let mut out = [(0, 0); 2];
        for cell in 0..CELLS {
            let o = &mut out[cell / (CELLS / 2)];
            o.0 += self.calibration.hits[cell];
            o.1 += self.calibration.trials[cell];
        }
        out
    }
}

/// Checks both guesses at every generated position of `c` against the token the target
/// wrote there, counting each in its cell.
fn score(c: &Continuation, index: &Index, cal: &mut Calibration) {
    let mut text = c.prompt.clone();
    let mut scratch = Vec::new();
    for &truth in &c.tokens {
        for g in guesses(&text, index, &mut scratch).into_iter().flatten() {
            let cell = g.cell();
            cal.trials[cell] += 1;
            cal.hits[cell] += u32::from(g.followers.first().map(|f| f.0) == Some(truth));
        }
        text.push(truth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cont(prompt: &[TokenId], tokens: &[TokenId]) -> Continuation {
        Continuation {
            prompt: prompt.to_vec(),
            tokens: tokens.to_vec(),
        }
    }

    #[test]
    fn the_store_finds_the_longest_indexed_suffix() {
        let conts = [cont(&[9], &[1, 2, 3, 4, 5]), cont(&[9], &[7, 2, 3, 6, 8])];
        let index = Index::build(&conts);
        let mut scratch = Vec::new();
        // "1 2 3" was followed by 4 only; "2 3" by 4 and 6 (equal counts, 4 first seen).
        let [c, s] = guesses(&[0, 1, 2, 3], &index, &mut scratch);
        let s = s.unwrap();
        assert!(c.is_none());
        assert_eq!((s.n, s.source, s.followers[0].0), (3, Source::Store, 4));
        let [_, s] = guesses(&[0, 0, 2, 3], &index, &mut scratch);
        assert_eq!(
            s.map(|s| (s.n, s.followers)),
            Some((2, vec![(4, 1), (6, 1)]))
        );
        // The text's own match: "2 3" was followed by 11 earlier in it.
        let [c, s] = guesses(&[5, 2, 3, 11, 5, 2, 3], &index, &mut scratch);
        let c = c.unwrap();
        assert_eq!((c.n, c.source, c.followers[0].0), (3, Source::Context, 11));
        assert_eq!(s.map(|s| s.n), Some(2));
        // Nothing at all.
        assert!(
            guesses(&[40, 41], &index, &mut scratch)
                .iter()
                .all(Option::is_none)
        );
        let store = LookupStore::new(&conts);
        assert_eq!((store.continuations(), store.tokens()), (2, 10));
    }

    #[test]
    fn the_more_probable_guess_is_drafted() {
        let conts = [cont(&[9], &[1, 2, 3, 4, 5]), cont(&[9], &[7, 2, 3, 6, 8])];
        let mut store = LookupStore::new(&conts);
        let text = [5, 2, 3, 11, 5, 2, 3];
        let mut scratch = Vec::new();
        let [c, s] = guesses(&text, &store.index, &mut scratch);
        let (c, s) = (c.unwrap().cell(), s.unwrap().cell());
        for (hits, winner) in [(90, 4), (10, 11)] {
            let cal = &mut store.calibration;
            (cal.hits[s], cal.trials[s]) = (hits, 100);
            (cal.hits[c], cal.trials[c]) = (50, 100);
            let (g, p) = store.guess(&text, &mut scratch).unwrap();
            assert_eq!(g.followers[0].0, winner, "store rate {hits}%");
            assert!((p - store.calibration.rate(g.cell())).abs() < 1e-6);
        }
    }

    #[test]
    fn calibration_measures_acceptance_on_held_out_folds() {
        // The target always writes the same sentence: guesses from the other folds' copies are
        // always right, so store guesses calibrate high.
        let sentence: Vec<TokenId> = (10..40).collect();
        let conts: Vec<_> = (0..4).map(|i| cont(&[i], &sentence)).collect();
        let s = LookupStore::new(&conts);
        let [context, store] = s.fit_counts();
        assert_eq!(context.1, 0, "the text so far never repeats: {context:?}");
        assert!(store.1 > 50 && store.0 == store.1, "{store:?}");
        let mut scratch = Vec::new();
        let (_, p) = s.guess(&[0, 10, 11, 12, 13, 14, 15], &mut scratch).unwrap();
        assert!(p > 0.9, "{p}");
        // Continuations that disagree everywhere after their shared start calibrate low.
        let conts: Vec<_> = (0..8)
            .map(|i| cont(&[i], &[1, 2, 3, 100 + i, 200 + i, 300 + i]))
            .collect();
        let s = LookupStore::new(&conts);
        let (g, p) = s.guess(&[7, 1, 2, 3], &mut scratch).unwrap();
        assert_eq!(g.source, Source::Store);
        assert!(p < 0.3, "{p}");
    }

    #[test]
    fn files_are_read_and_bad_lines_name_the_line() {
        let dir = std::env::temp_dir().join(format!("spot-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.jsonl");
        std::fs::write(
            &path,
            "{\"prompt_ids\":[1,2],\"tokens\":[3,4,5],\"text\":\"x\"}\n\n{\"prompt_ids\":[],\"tokens\":[3,4,6]}\n",
        )
        .unwrap();
        let s = LookupStore::open(&path, 10).unwrap();
        assert_eq!((s.continuations(), s.tokens()), (2, 6));
        let err = LookupStore::open(&path, 6).unwrap_err().to_string();
        assert!(
            err.contains("line 3") && err.contains("\"tokens\" holds 6"),
            "{err}"
        );
        std::fs::write(&path, "{\"prompt_ids\":[1]}\n").unwrap();
        let err = LookupStore::open(&path, 10).unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("\"tokens\" is missing"),
            "{err}"
        );
        std::fs::write(&path, "[1, 2\n").unwrap();
        assert!(matches!(
            LookupStore::open(&path, 10),
            Err(StoreError::Line { line: 1, .. })
        ));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            LookupStore::open(&path, 10),
            Err(StoreError::Empty { .. })
        ));
        let missing = dir.join("missing.jsonl");
        assert!(matches!(
            LookupStore::open(&missing, 10),
            Err(StoreError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
