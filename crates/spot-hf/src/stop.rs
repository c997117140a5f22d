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

    /// The part of a growing `text` that a stream may send now: [`StopStrings::cut`], less a
    /// tail that could still become the start of a stop string (more text may complete it).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spot-models/tests/fixtures/sdar-tiny");
    /// # let tokenizer = spot_hf::hf::Tokenizer::open(&dir)?;
    /// let stops = spot_hf::StopStrings::new(&tokenizer, vec!["\n\n".into(), "END".into()])?;
    /// assert_eq!(stops.streamable("x = 1\n"), "x = 1");
    /// assert_eq!(stops.streamable("x = 1 EN"), "x = 1 ");
    /// assert_eq!(stops.streamable("x = 1 END y"), "x = 1 ");
    /// assert_eq!(stops.streamable("x = 1 ENDy"), "x = 1 ");
    /// # Ok(()) }
    /// ```
    pub fn streamable<'t>(&self, text: &'t str) -> &'t str {
        let text = self.cut(text);
        let held = self
            .stops
            .iter()
            .flat_map(|s| {
                s.char_indices()
                    .skip(1)
                    .map(|(i, _)| &s[..i])
                    .filter(|p| text.ends_with(p))
                    .map(str::len)
            })
            .max()
            .unwrap_or(0);
        &text[..text.len() - held]
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
