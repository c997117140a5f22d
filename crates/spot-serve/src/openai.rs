//! The OpenAI request bodies this server reads (`/v1/completions`, `/v1/chat/completions`),
//! checked field by field into the jobs they ask for.

use serde::Deserialize;
use serde_json::Value;
use spot_core::TokenId;
use spot_hf::StopStrings;

use crate::body::{Fields, kind};
use crate::engine::{Job, JobSpec};
use crate::error::ApiError;
use crate::frontend::Frontend;

/// Stop strings at most per request (OpenAI allows 4).
pub const MAX_STOPS: usize = 16;

/// A checked request: its jobs (prompt × choice) and how to answer.
pub(crate) struct Parsed {
    pub jobs: Vec<Job>,
    /// Prompt lengths, one per prompt (for `usage`).
    pub prompt_tokens: Vec<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub stops: Option<StopStrings>,
}

/// `/v1/completions`.
pub(crate) fn completion(fe: &Frontend, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let mut f = Fields::parse(bytes)?;
    let common = Common::read(fe, &mut f)?;
    let prompt: Value = f.require("prompt")?;
    f.neutral("echo", |v| v == &Value::Bool(false))?;
    f.neutral("best_of", |v| v.as_u64() == Some(1))?;
    f.neutral("suffix", |_| false)?;
    f.neutral("logprobs", |_| false)?;
    f.finish()?;
    let prompts = completion_prompts(fe, &prompt)?;
    common.into_jobs(fe, prompts)
}

/// `/v1/chat/completions`.
pub(crate) fn chat(fe: &Frontend, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let mut f = Fields::parse(bytes)?;
    let mut common = Common::read(fe, &mut f)?;
    if let Some(m) = f.take::<u64>("max_completion_tokens")? {
        common.max_tokens = checked_max_tokens(fe, m, "max_completion_tokens")?;
    }
    let messages: Vec<Value> = f.require("messages")?;
    f.neutral("logprobs", |v| v == &Value::Bool(false))?;
    f.neutral("top_logprobs", |_| false)?;
    f.neutral("tools", |v| v.as_array().is_some_and(Vec::is_empty))?;
    f.neutral("tool_choice", |v| v == "none")?;
    f.neutral("response_format", |v| v["type"] == "text")?;
    f.finish()?;
    let messages = chat_messages(&messages)?;
    let template = fe.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "model `{}` has no chat template (tokenizer_config.json or chat_template.jinja); \
             use /v1/completions, or start the server with --chat-template FILE",
            fe.model_id
        ))
    })?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed: {e}")))?;
    let ids = fe.encode(&text, "messages")?;
    common.into_jobs(fe, vec![ids])
}

/// The fields both endpoints share.
struct Common {
    max_tokens: usize,
    temperature: f32,
    seed: u64,
    n: usize,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    method: Option<String>,
    budget: Option<usize>,
}

/// `spot`: the per-request override of the server's decoding method and budget.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpotOptions {
    method: Option<String>,
    budget: Option<usize>,
}

/// `stream_options`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Common {
    fn read(fe: &Frontend, f: &mut Fields) -> Result<Self, ApiError> {
        let model: String = f.require("model")?;
        if model != fe.model_id {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "model `{model}` is not served here; this server serves `{}`",
                    fe.model_id
                ),
            )
            .with_code("model_not_found"));
        }
        let d = &fe.defaults;
        let max_tokens = match f.take::<u64>("max_tokens")? {
            Some(m) => checked_max_tokens(fe, m, "max_tokens")?,
            None => d.max_tokens,
        };
        let temperature = f
            .take::<f64>("temperature")?
            .unwrap_or(d.temperature.into());
        if !(temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&temperature)) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be in [0, {MAX_TEMPERATURE}], got {temperature}"),
            ));
        }
        let seed = f.take::<u64>("seed")?.unwrap_or(d.seed);
        let n = f.take::<u64>("n")?.unwrap_or(1);
        if n == 0 || n > fe.max_n as u64 {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be in 1..={}, got {n}", fe.max_n),
            ));
        }
        let stop = match f.take::<Stop>("stop")? {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        if stop.len() > MAX_STOPS || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` takes at most {MAX_STOPS} non-empty strings"),
            ));
        }
        let stream = f.take::<bool>("stream")?.unwrap_or(false);
        let options = f.take::<StreamOptions>("stream_options")?;
        if options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` applies to streamed requests only",
            ));
        }
        let spot = f.take::<SpotOptions>("spot")?;
        f.neutral("top_p", |v| v.as_f64() == Some(1.0))?;
        f.neutral("frequency_penalty", |v| v.as_f64() == Some(0.0))?;
        f.neutral("presence_penalty", |v| v.as_f64() == Some(0.0))?;
        f.neutral("logit_bias", |v| {
            v.as_object().is_some_and(|o| o.is_empty())
        })?;
        let _user: Option<String> = f.take("user")?;
        Ok(Self {
            max_tokens,
            temperature: temperature as f32,
            seed,
            n: n as usize,
            stop,
            stream,
            include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
            method: spot.as_ref().and_then(|s| s.method.clone()),
            budget: spot.and_then(|s| s.budget),
        })
    }

    /// One job per prompt and choice (choice `i` of prompt `p` is index `p * n + i`, with
    /// seed `seed + i`), after checking each prompt fits the context with `max_tokens`.
    fn into_jobs(self, fe: &Frontend, prompts: Vec<Vec<TokenId>>) -> Result<Parsed, ApiError> {
        let stops = match self.stop.is_empty() {
            true => None,
            false => Some(
                StopStrings::new(&fe.tokenizer, self.stop.clone())
                    .map_err(|e| ApiError::invalid("stop", e.to_string()))?,
            ),
        };
        let mut jobs = Vec::with_capacity(prompts.len() * self.n);
        let mut prompt_tokens = Vec::with_capacity(prompts.len());
        for (p, ids) in prompts.into_iter().enumerate() {
            fe.check_context(ids.len(), self.max_tokens)?;
            prompt_tokens.push(ids.len());
            for i in 0..self.n {
                jobs.push(Job {
                    spec: JobSpec {
                        prompt: ids.clone(),
                        max_tokens: self.max_tokens,
                        temperature: self.temperature,
                        seed: self.seed.wrapping_add(i as u64),
                        method: self.method.clone(),
                        budget: self.budget,
                    },
                    stops: stops.clone(),
                    choice: p * self.n + i,
                });
            }
        }
        Ok(Parsed {
            jobs,
            prompt_tokens,
            stream: self.stream,
            include_usage: self.include_usage,
            stops,
        })
    }
}

/// The highest temperature accepted (the decoders take any; 100 keeps it a number).
pub const MAX_TEMPERATURE: f64 = 100.0;

fn checked_max_tokens(fe: &Frontend, m: u64, field: &str) -> Result<usize, ApiError> {
    if m == 0 || m > fe.max_positions as u64 {
        return Err(ApiError::invalid(
            field,
            format!(
                "`{field}` must be in 1..={} (the model's context), got {m}",
                fe.max_positions
            ),
        ));
    }
    Ok(m as usize)
}

/// `prompt`: a string, a list of strings, a list of ids, or a list of lists of ids.
fn completion_prompts(fe: &Frontend, prompt: &Value) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            format!(
                "`prompt` must be a string, a list of strings, a list of token ids or a list \
                 of lists of token ids; got {}",
                kind(prompt)
            ),
        )
    };
    let ids = |v: &Value, at: String| -> Result<Vec<TokenId>, ApiError> {
        let list = v.as_array().ok_or_else(bad)?;
        list.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < fe.vocab_size)
                    .map(|t| t as TokenId)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            at.clone(),
                            format!(
                                "token ids must be integers below {}, got {t}",
                                fe.vocab_size
                            ),
                        )
                    })
            })
            .collect()
    };
    let prompts = match prompt {
        Value::String(s) => vec![fe.encode(s, "prompt")?],
        Value::Array(items) if items.is_empty() => return Err(bad()),
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .enumerate()
            .map(|(i, s)| fe.encode(s.as_str().unwrap_or_default(), &format!("prompt[{i}]")))
            .collect::<Result<_, _>>()?,
        Value::Array(items) if items.iter().all(Value::is_number) => {
            vec![ids(prompt, "prompt".into())?]
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, v)| ids(v, format!("prompt[{i}]")))
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(ApiError::invalid(
                format!("prompt[{i}]"),
                "a prompt is empty (no tokens)",
            ));
        }
    }
    Ok(prompts)
}

/// `messages`: `{role, content}` objects; `content` a string or a list of `{"type": "text",
/// "text"}` parts (joined). Other fields of a message (`name`) are kept for the template.
fn chat_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}].{f}");
            let obj = m.as_object().ok_or_else(|| {
                ApiError::invalid(format!("messages[{i}]"), "a message must be an object")
            })?;
            let role = obj
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(at("role"), "a message needs a string `role`"))?;
            if !["system", "user", "assistant", "developer"].contains(&role) {
                return Err(ApiError::invalid(
                    at("role"),
                    format!("unknown role `{role}` (system, developer, user or assistant)"),
                ));
            }
            let content = match obj.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                        _ => Err(ApiError::invalid(
                            at("content"),
                            "only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        )),
                    })
                    .collect::<Result<String, _>>()?,
                _ => {
                    return Err(ApiError::invalid(
                        at("content"),
                        "a message needs `content`: a string or a list of text parts",
                    ));
                }
            };
            let mut out = obj.clone();
            out.insert("content".into(), Value::String(content));
            Ok(Value::Object(out))
        })
        .collect()
}
