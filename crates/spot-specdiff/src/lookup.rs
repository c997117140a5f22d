//! A training-free drafter for any autoregressive target: prompt lookup (n-gram matching in
//! the text so far). Not a diffusion model; a baseline, and a drafter that needs no weights,
//! so the SpecDiff-2 round can run on real targets before a trained drafter exists.

use std::sync::Arc;

use spot_core::{Result, TokenId};

use crate::drafter::{DiffusionDrafter, Marginals};
use crate::store::{LookupStore, context_followers};

/// Drafts by prompt lookup: for each drafted position, the tokens that followed earlier
/// occurrences of the last `n` tokens (longest `n` first, down to 1), most recent first, each
/// weighted by how often it followed; a position with no match repeats the previous guess's
/// candidates. The guess for each position is its most frequent candidate, which the next
/// position's lookup continues from.
///
/// [`with_store`](Self::with_store) adds retrieval: each position drafts the more probable of
/// the text's own match and a [`LookupStore`]'s (the target's continuations of training-side
/// prompts), at calibrated probabilities (see [`crate::store`]).
#[derive(Clone, Debug)]
pub struct LookupDrafter {
    vocab: usize,
    max_n: usize,
    candidates: usize,
    store: Option<Arc<LookupStore>>,
}

impl LookupDrafter {
    /// A drafter over `vocab` tokens matching n-grams of up to `max_n` tokens (at least 1),
    /// with `candidates` tokens per position (at least 1).
    pub fn new(vocab: usize, max_n: usize, candidates: usize) -> Self {
        Self {
            vocab,
            max_n: max_n.max(1),
            candidates: candidates.max(1),
            store: None,
        }
    }

    /// A retrieval drafter over `vocab` tokens with `candidates` tokens per position: each
    /// position drafts the more probable of two guesses, from the text so far (up to 3
    /// tokens matched) and from `store` (2 to 6), at the acceptance rate the store measured
    /// for such guesses (see [`crate::store`]); a position with no match at all drafts the
    /// last token at probability 0.
    ///
    /// ```
    /// use spot_specdiff::store::{Continuation, LookupStore};
    /// use spot_specdiff::{DiffusionDrafter, LookupDrafter, Marginals};
    ///
    /// let said = |p: u32| Continuation { prompt: vec![p], tokens: (10..30).collect() };
    /// let store = LookupStore::new(&(0..4).map(said).collect::<Vec<_>>());
    /// let mut drafter = LookupDrafter::with_store(64, store, 2);
    /// let mut m = Marginals::default();
    /// drafter.propose(&[7, 10, 11, 12, 13, 14], 3, &mut m)?;
    /// assert_eq!((m.at(0).0[0], m.at(1).0[0], m.at(2).0[0]), (15, 16, 17));
    /// assert!(m.at(0).1[0] > 0.9, "the target always wrote this: calibrated high");
    /// # Ok::<(), spot_core::Error>(())
    /// ```
    pub fn with_store(vocab: usize, store: LookupStore, candidates: usize) -> Self {
        Self {
            store: Some(Arc::new(store)),
            ..Self::new(vocab, crate::store::CONTEXT_MAX_N, candidates)
        }
    }

    /// The store, when the drafter has one.
    pub fn store(&self) -> Option<&LookupStore> {
        self.store.as_deref()
    }

    /// Candidates and probabilities of one position from the store and the text so far.
    fn retrieve(
        &self,
        store: &LookupStore,
        text: &[TokenId],
        scratch: &mut Vec<(TokenId, u32)>,
        ids: &mut Vec<TokenId>,
        probs: &mut Vec<f32>,
    ) {
        ids.clear();
        probs.clear();
        match store.guess(text, scratch) {
            Some((g, p)) => {
                let top = g.followers[0].1 as f32;
                for &(id, count) in g.followers.iter().take(self.candidates) {
                    ids.push(id);
                    probs.push(p * count as f32 / top);
                }
            }
            None => {
                ids.push(text.last().copied().unwrap_or(0));
                probs.push(0.0);
            }
        }
    }
}

impl DiffusionDrafter for LookupDrafter {
    fn name(&self) -> &str {
        if self.store.is_some() {
            "lookup+store"
        } else {
            "lookup"
        }
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// One draft of up to 16 tokens, cut where its running probability falls below 0.5:
    /// measured on SmolLM2-135M-Instruct (`docs/specdiff.md`), the floor that kept the store
    /// faster than plain decoding at T = 0 and 1; K = 8 and no floor made every round verify
    /// 128 rows.
    fn recommended(&self) -> crate::SpecDiffConfig {
        crate::SpecDiffConfig {
            k: 1,
            gamma: 16,
            drafter_temperature: 0.0,
            min_draft_prob: 0.5,
            // A lookup costs next to nothing beside a forward; drafted rows do not.
            pace: Some(crate::Pace {
                draft_cost: 0.01,
                ..crate::Pace::cpu()
            }),
            ..crate::SpecDiffConfig::default()
        }
    }

    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        *out = Marginals::new(self.candidates);
        if gamma == 0 {
            // A round the pace skips: nothing to look up (and no copy of the context).
            return Ok(());
        }
        let mut text = context.to_vec();
        let mut found = Vec::new();
        let (mut ids, mut probs) = (Vec::new(), Vec::new());
        for _ in 0..gamma {
            if let Some(store) = &self.store {
                self.retrieve(store, &text, &mut found, &mut ids, &mut probs);
            } else if context_followers(&text, self.max_n, &mut found) > 0 {
                let total: u32 = found.iter().map(|c| c.1).sum();
                ids.clear();
                probs.clear();
                for c in found.iter().take(self.candidates) {
                    ids.push(c.0);
                    probs.push(c.1 as f32 / total as f32);
                }
            } else if ids.is_empty() {
                // Nothing matched yet: the last token, with no confidence.
                ids.push(text.last().copied().unwrap_or(0));
                probs.push(0.0);
            }
            // Pad to the candidate count with the first candidate at probability 0.
            while ids.len() < self.candidates {
                ids.push(ids[0]);
                probs.push(0.0);
            }
            out.push(&ids, &probs)?;
            text.push(ids[0]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_repeated_text() {
        let mut d = LookupDrafter::new(100, 3, 2);
        let mut m = Marginals::default();
        // "1 2 3 4 1 2 3 5 1 2" -> after "1 2": "3" (twice), then after "2 3": "5" (most
        // recent of 4 and 5, equal counts), then after "3 5": "1".
        d.propose(&[1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 3, &mut m)
            .unwrap();
        assert_eq!(m.at(0).0, &[3, 3]);
        assert_eq!(m.at(1).0, &[5, 4]);
        assert_eq!(m.at(1).1, &[0.5, 0.5]);
        assert_eq!(m.at(2).0[0], 1);
        // No match at all: the last token, probability 0.
        d.propose(&[7], 2, &mut m).unwrap();
        assert_eq!(m.at(0), (&[7, 7][..], &[0.0, 0.0][..]));
    }
}
