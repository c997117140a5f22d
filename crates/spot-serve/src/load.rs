//! A load generator for an OpenAI-compatible server: `concurrency` clients send every prompt
//! once (plain or streamed, completions or chat), and the report gives each response (text,
//! finish reason, tokens, latency, time to the first chunk) and the run's throughput and
//! latency percentiles. Streams are checked as they arrive: one response id throughout,
//! choice index 0, a finish reason, `[DONE]` last; a response that breaks this is an error.
//!
//! ```no_run
//! use spot_serve::load::{LoadConfig, run_blocking};
//! let cfg = LoadConfig {
//!     prompts: vec!["def add(a, b):".into(); 32],
//!     concurrency: 16,
//!     stream: true,
//!     ..LoadConfig::new("http://127.0.0.1:8000", "sdar-tiny-code")
//! };
//! let report = run_blocking(&cfg)?;
//! println!("{:.1} tokens/s, p50 {:.3} s", report.tokens_per_s(), report.latency_percentile(0.5));
//! # Ok::<(), spot_serve::load::LoadError>(())
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

/// What a load run sends.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadConfig {
    /// The server's base URL (`http://127.0.0.1:8000`).
    pub url: String,
    /// The model id to name.
    pub model: String,
    /// Prompt texts; each is sent once (request `i` sends prompt `i`).
    pub prompts: Vec<String>,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// `max_tokens` of every request.
    pub max_tokens: usize,
    /// `temperature` of every request.
    pub temperature: f32,
    /// Seed of request `i` is `seed + i` when `distinct_seeds`, else `seed`.
    pub seed: u64,
    /// Whether each request gets its own seed (`seed + i`).
    pub distinct_seeds: bool,
    /// Streamed (server-sent events) or plain responses.
    pub stream: bool,
    /// `/v1/chat/completions` (one user message) instead of `/v1/completions`.
    pub chat: bool,
    /// Stop strings of every request.
    pub stop: Vec<String>,
    /// The `spot` field of every request (method and budget override), if any.
    pub spot: Option<Value>,
    /// A client gives up on a request after this long.
    pub timeout: Duration,
    /// The API key to send (`Authorization: Bearer KEY`), if the server wants one.
    pub api_key: Option<String>,
}

impl LoadConfig {
    /// One plain completion request per prompt, one at a time, 64 tokens at temperature 0.
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            model: model.into(),
            prompts: Vec::new(),
            concurrency: 1,
            max_tokens: 64,
            temperature: 0.0,
            seed: 0,
            distinct_seeds: false,
            stream: false,
            chat: false,
            stop: Vec::new(),
            spot: None,
            timeout: Duration::from_secs(600),
            api_key: None,
        }
    }

    /// The JSON body of request `i`.
    pub fn body(&self, i: usize) -> Value {
        let prompt = self.prompts.get(i).cloned().unwrap_or_default();
        let seed = match self.distinct_seeds {
            true => self.seed.wrapping_add(i as u64),
            false => self.seed,
        };
        let mut b = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": seed,
            "stream": self.stream,
        });
        match self.chat {
            true => b["messages"] = json!([{"role": "user", "content": prompt}]),
            false => b["prompt"] = json!(prompt),
        }
        if !self.stop.is_empty() {
            b["stop"] = json!(self.stop);
        }
        if let Some(s) = &self.spot {
            b["spot"] = s.clone();
        }
        b
    }

    fn endpoint(&self) -> String {
        let base = self.url.trim_end_matches('/');
        match self.chat {
            true => format!("{base}/v1/chat/completions"),
            false => format!("{base}/v1/completions"),
        }
    }
}

/// One answered request.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadResponse {
    /// The request's number (its prompt's index).
    pub index: usize,
    /// The response id.
    pub id: String,
    /// The text (streamed: the chunks joined).
    pub text: String,
    /// `finish_reason`.
    pub finish_reason: String,
    /// `usage.completion_tokens` (plain responses; streamed ones count 0).
    pub completion_tokens: usize,
    /// Target forwards (`spot` field of the response), when reported.
    pub nfe: Option<u64>,
    /// From sending to the last byte.
    pub latency: Duration,
    /// From sending to the first chunk with text (streamed responses).
    pub first_text: Option<Duration>,
    /// Chunks with text (streamed responses).
    pub text_chunks: usize,
}

/// A load run's responses (in request order) and its wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    /// Every response, by index.
    pub responses: Vec<LoadResponse>,
    /// From the first request sent to the last response.
    pub wall: Duration,
}

impl LoadReport {
    /// Requests per second.
    pub fn requests_per_s(&self) -> f64 {
        self.responses.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second (plain responses' `usage`).
    pub fn tokens_per_s(&self) -> f64 {
        let tokens: usize = self.responses.iter().map(|r| r.completion_tokens).sum();
        tokens as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1, nearest rank) of the latencies, in seconds.
    pub fn latency_percentile(&self, q: f64) -> f64 {
        percentile(self.responses.iter().map(|r| r.latency), q)
    }

    /// The `q` quantile of the times to the first text chunk (streamed runs), in seconds.
    pub fn first_text_percentile(&self, q: f64) -> f64 {
        percentile(self.responses.iter().filter_map(|r| r.first_text), q)
    }
}

fn percentile(values: impl Iterator<Item = Duration>, q: f64) -> f64 {
    let mut v: Vec<f64> = values.map(|d| d.as_secs_f64()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Why a load run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The HTTP client failed (connection refused, timeout, a broken stream).
    #[error("request {index}: {source}")]
    Http {
        /// The request.
        index: usize,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("request {index}: HTTP {status}: {body}")]
    Status {
        /// The request.
        index: usize,
        /// The status.
        status: u16,
        /// The body.
        body: String,
    },
    /// A response broke the protocol (bad JSON, a changed id, no `[DONE]`, ...).
    #[error("request {index}: {reason}")]
    Protocol {
        /// The request.
        index: usize,
        /// What was wrong.
        reason: String,
    },
    /// The settings are unusable.
    #[error("invalid load setting: {0}")]
    Setting(String),
    /// The runtime could not start.
    #[error("runtime: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs `cfg` on a new tokio runtime (for callers without one).
pub fn run_blocking(cfg: &LoadConfig) -> Result<LoadReport, LoadError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(cfg))
}

/// Sends every prompt of `cfg` with `cfg.concurrency` clients; the first failure ends the
/// run with its error.
pub async fn run(cfg: &LoadConfig) -> Result<LoadReport, LoadError> {
    if cfg.concurrency == 0 {
        return Err(LoadError::Setting("concurrency must be at least 1".into()));
    }
    let client = reqwest::Client::builder()
        .timeout(cfg.timeout)
        .pool_max_idle_per_host(cfg.concurrency)
        .build()
        .map_err(|source| LoadError::Http { index: 0, source })?;
    let next = Arc::new(AtomicUsize::new(0));
    let cfg = Arc::new(cfg.clone());
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..cfg.concurrency.min(cfg.prompts.len().max(1)) {
        let (client, next, cfg) = (client.clone(), Arc::clone(&next), Arc::clone(&cfg));
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cfg.prompts.len() {
                    return Ok::<_, LoadError>(done);
                }
                done.push(one(&client, &cfg, i).await?);
            }
        }));
    }
    let mut responses = Vec::with_capacity(cfg.prompts.len());
    for w in workers {
        let part = w.await.map_err(|e| LoadError::Protocol {
            index: 0,
            reason: format!("a client task failed: {e}"),
        })??;
        responses.extend(part);
    }
    responses.sort_by_key(|r| r.index);
    Ok(LoadReport {
        responses,
        wall: start.elapsed(),
    })
}

/// Sends request `index` and reads its answer.
pub async fn one(
    client: &reqwest::Client,
    cfg: &LoadConfig,
    index: usize,
) -> Result<LoadResponse, LoadError> {
    let http = |source| LoadError::Http { index, source };
    let t0 = Instant::now();
    let mut req = client.post(cfg.endpoint()).json(&cfg.body(index));
    if let Some(key) = &cfg.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.map_err(http)?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(LoadError::Status {
            index,
            status: status.as_u16(),
            body,
        });
    }
    let mut r = LoadResponse {
        index,
        id: String::new(),
        text: String::new(),
        finish_reason: String::new(),
        completion_tokens: 0,
        nfe: None,
        latency: Duration::ZERO,
        first_text: None,
        text_chunks: 0,
    };
    let bad = |reason: String| LoadError::Protocol { index, reason };
    if !cfg.stream {
        let v: Value = resp.json().await.map_err(http)?;
        let c = &v["choices"][0];
        r.id = v["id"].as_str().unwrap_or_default().to_string();
        r.text = choice_text(c, cfg.chat, false).to_string();
        r.finish_reason = c["finish_reason"].as_str().unwrap_or_default().to_string();
        r.completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
        r.nfe = v["spot"]["choices"][0]["nfe"].as_u64();
        if r.finish_reason.is_empty() {
            return Err(bad(format!("no finish_reason in {v}")));
        }
        r.latency = t0.elapsed();
        return Ok(r);
    }
    let mut bytes = resp.bytes_stream();
    let mut buf = String::new();
    let mut finished = false;
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk.map_err(http)?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ").or(line.strip_prefix("data:")) else {
                    continue;
                };
                if data.trim() == "[DONE]" {
                    finished = true;
                    continue;
                }
                if finished {
                    return Err(bad("data after [DONE]".into()));
                }
                let v: Value = serde_json::from_str(data)
                    .map_err(|e| bad(format!("a chunk is not JSON ({e}): {data}")))?;
                if v.get("error").is_some() {
                    return Err(bad(format!("the stream failed: {v}")));
                }
                let id = v["id"].as_str().unwrap_or_default();
                if r.id.is_empty() {
                    r.id = id.to_string();
                } else if r.id != id {
                    return Err(bad(format!("the id changed from {} to {id}", r.id)));
                }
                let Some(c) = v["choices"].as_array().and_then(|c| c.first()) else {
                    continue; // the usage chunk
                };
                if c["index"].as_u64() != Some(0) {
                    return Err(bad(format!("a chunk of another choice: {v}")));
                }
                let delta = choice_text(c, cfg.chat, true);
                if !delta.is_empty() {
                    r.text.push_str(delta);
                    r.text_chunks += 1;
                    r.first_text.get_or_insert_with(|| t0.elapsed());
                }
                if let Some(f) = c["finish_reason"].as_str() {
                    r.finish_reason = f.to_string();
                    r.nfe = v["spot"]["choice"]["nfe"].as_u64();
                }
            }
        }
    }
    r.latency = t0.elapsed();
    if !finished || r.finish_reason.is_empty() {
        return Err(bad(format!(
            "the stream ended without {}",
            if finished {
                "a finish_reason"
            } else {
                "[DONE]"
            }
        )));
    }
    Ok(r)
}

/// The text of a choice object: `text` (completions), `message.content` or `delta.content`.
fn choice_text(c: &Value, chat: bool, chunk: bool) -> &str {
    let v = match (chat, chunk) {
        (false, _) => &c["text"],
        (true, false) => &c["message"]["content"],
        (true, true) => &c["delta"]["content"],
    };
    v.as_str().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let d = |s: u64| Duration::from_secs(s);
        let v = [d(4), d(1), d(3), d(2)];
        assert_eq!(percentile(v.into_iter(), 0.5), 2.0);
        assert_eq!(percentile(v.into_iter(), 0.95), 4.0);
        assert_eq!(percentile(v.into_iter(), 0.0), 1.0);
        assert!(percentile(std::iter::empty(), 0.5).is_nan());
    }
}
