//! What the HTTP side knows of the model: its name, tokenizer, chat template, limits and the
//! server's decoding defaults. It is shared by every connection; the model itself stays on the
//! engine thread.

use spot_core::TokenId;
use spot_hf::chat::ChatTemplate;
use spot_hf::hf::Tokenizer;

use crate::error::ApiError;

/// The server's defaults for what a request leaves out (`spot serve` takes them from the same
/// options as `spot generate`, with the same defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    /// `max_tokens` when the request gives none.
    pub max_tokens: usize,
    /// `temperature` when the request gives none.
    pub temperature: f32,
    /// `seed` when the request gives none.
    pub seed: u64,
    /// The decoding method (shown in responses; a request may name another in `spot.method`).
    pub method: String,
    /// The draft budget (a request may give another in `spot.budget`).
    pub budget: usize,
}

/// The model as the HTTP side sees it.
#[derive(Debug)]
pub struct Frontend {
    /// The model id requests must name (`/v1/models` lists it).
    pub model_id: String,
    /// The folder's tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the folder (or `--chat-template`) has one.
    pub template: Option<ChatTemplate>,
    /// Ids that end a generation (the streamed text stops after the first).
    pub stop_ids: Vec<TokenId>,
    /// Whether decoding stops at a stop id (`spot generate`'s default).
    pub early_stop: bool,
    /// The longest prompt + generation the model takes.
    pub max_positions: usize,
    /// Token ids the model knows.
    pub vocab_size: usize,
    /// Choices per request at most (`n`).
    pub max_n: usize,
    /// Defaults of the decoding settings.
    pub defaults: Defaults,
}

impl Frontend {
    /// `text` tokenised; a tokenizer failure is a 400 naming `field`.
    pub(crate) fn encode(&self, text: &str, field: &str) -> Result<Vec<TokenId>, ApiError> {
        let ids = self
            .tokenizer
            .encode(text)
            .map_err(|e| ApiError::invalid(field, format!("cannot tokenise: {e}")))?;
        if ids.is_empty() {
            return Err(ApiError::invalid(field, "the prompt has no tokens"));
        }
        Ok(ids)
    }

    /// A 400 (`context_length_exceeded`) when a prompt and its generation do not fit.
    pub(crate) fn check_context(&self, prompt: usize, max_tokens: usize) -> Result<(), ApiError> {
        if prompt.saturating_add(max_tokens) > self.max_positions {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "this model's context is {} tokens; the prompt has {prompt} and max_tokens \
                     is {max_tokens}",
                    self.max_positions
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    }

    /// The text of generated `tokens` as a response returns it: decoded, cut before the
    /// first stop string.
    pub(crate) fn text(
        &self,
        tokens: &[TokenId],
        stops: Option<&spot_hf::StopStrings>,
    ) -> Result<String, String> {
        let mut text = self.tokenizer.decode(tokens).map_err(|e| e.to_string())?;
        if let Some(s) = stops {
            text.truncate(s.cut(&text).len());
        }
        Ok(text)
    }

    /// The tokens of a stream so far that the output can hold: up to `max_tokens`, and up to
    /// the first stop id (inclusive) when decoding stops there.
    pub(crate) fn visible<'t>(&self, tokens: &'t [TokenId], max_tokens: usize) -> &'t [TokenId] {
        let mut end = tokens.len().min(max_tokens);
        if self.early_stop
            && let Some(i) = tokens[..end].iter().position(|t| self.stop_ids.contains(t))
        {
            end = i + 1;
        }
        &tokens[..end]
    }
}
