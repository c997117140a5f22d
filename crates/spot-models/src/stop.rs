//! Stop strings: decoding ends at the first block end whose decoded text contains one.

use spot_core::{StopCheck, TokenId};

use crate::error::{ModelError, Result};
use crate::hf::Tokenizer;

/// Stop strings checked on the decoded text at every block end (a [`StopCheck`] for
/// [`spot_core::Request::with_stop_check`]).
///
/// When the text of the output contains a stop string, the output keeps the fewest tokens
/// whose text contains it (so the tokens are a prefix of the draft-free decode's, and the
/// same for every method); [`StopStrings::cut`] then gives the text before the stop string,
/// as OpenAI-style APIs return it.
#[derive(Clone, Debug)]
pub struct StopStrings {
    tokenizer: Tokenizer,
    stops: Vec<String>,
}

impl StopStrings {
    /// Stop strings decoded with `tokenizer`; an empty string is refused.
    pub fn new(tokenizer: &Tokenizer, stops: Vec<String>) -> Result<Self> {
        if stops.iter().any(String::is_empty) {
            return Err(ModelError::Request("a stop string is empty".to_string()));
        }
        Ok(Self {
            tokenizer: tokenizer.clone(),
            stops,
        })
    }

    /// The byte offset of the first stop string in `text`, if any.
    pub fn find(&self, text: &str) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min()
    }

    /// `text` up to its first stop string (all of it when there is none).
    pub fn cut<'t>(&self, text: &'t str) -> &'t str {
        &text[..self.find(text).unwrap_or(text.len())]
    }

    fn hit(&self, ids: &[TokenId]) -> bool {
        self.tokenizer
            .decode(ids)
            .is_ok_and(|text| self.find(&text).is_some())
    }
}

impl StopCheck for StopStrings {
    fn check(&mut self, output: &[TokenId]) -> Option<usize> {
        if !self.hit(output) {
            return None;
        }
        // The shortest prefix whose text holds a stop string (prefix texts grow with the
        // prefix, so the first hit is the shortest).
        (1..=output.len()).find(|&k| self.hit(&output[..k]))
    }
}
