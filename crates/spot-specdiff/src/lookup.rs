//! A training-free drafter for any autoregressive target: prompt lookup (n-gram matching in
//! the text so far). Not a diffusion model; a baseline, and a drafter that needs no weights,
//! so the SpecDiff-2 round can run on real targets before a trained drafter exists.

use spot_core::{Result, TokenId};

use crate::drafter::{DiffusionDrafter, Marginals};

/// Drafts by prompt lookup: for each drafted position, the tokens that followed earlier
/// occurrences of the last `n` tokens (longest `n` first, down to 1), most recent first, each
/// weighted by how often it followed; a position with no match repeats the previous guess's
/// candidates. The guess for each position is its most frequent candidate, which the next
/// position's lookup continues from.
#[derive(Clone, Debug)]
pub struct LookupDrafter {
    vocab: usize,
    max_n: usize,
    candidates: usize,
}

impl LookupDrafter {
    /// A drafter over `vocab` tokens matching n-grams of up to `max_n` tokens (at least 1),
    /// with `candidates` tokens per position (at least 1).
    pub fn new(vocab: usize, max_n: usize, candidates: usize) -> Self {
        Self {
            vocab,
            max_n: max_n.max(1),
            candidates: candidates.max(1),
        }
    }

    /// Counts of the tokens that followed the longest matched suffix of `text`.
    fn followers(&self, text: &[TokenId], out: &mut Vec<(TokenId, u32, usize)>) {
        out.clear();
        for n in (1..=self.max_n.min(text.len().saturating_sub(1))).rev() {
            let key = &text[text.len() - n..];
            // Most recent occurrence first (recency breaks count ties).
            for start in (0..text.len() - n).rev() {
                if &text[start..start + n] == key {
                    let next = text[start + n];
                    match out.iter_mut().find(|c| c.0 == next) {
                        Some(c) => c.1 += 1,
                        None => out.push((next, 1, out.len())),
                    }
                }
            }
            if !out.is_empty() {
                return;
            }
        }
    }
}

impl DiffusionDrafter for LookupDrafter {
    fn name(&self) -> &str {
        "lookup"
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        *out = Marginals::new(self.candidates);
        let mut text = context.to_vec();
        let mut found = Vec::new();
        let (mut ids, mut probs) = (Vec::new(), Vec::new());
        for _ in 0..gamma {
            self.followers(&text, &mut found);
            if !found.is_empty() {
                found.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
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
