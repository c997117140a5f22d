//! `GET /metrics`: the server's counters in Prometheus' text format (OpenMetrics), through
//! the `prometheus-client` crate. Every metric is named `spot_*`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::engine::EngineStats;

/// Labels of a finished HTTP request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The route (`/v1/completions`, ...; `other` for paths the server does not have).
    endpoint: &'static str,
    /// The HTTP status.
    status: u16,
}

/// Labels of a finished completion.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    /// The route.
    endpoint: &'static str,
    /// The decoding method.
    method: String,
}

/// The server's metrics. Counters of the engine (forwards, live and queued requests) are read
/// from its [`EngineStats`] at each scrape; the rest are counted as requests finish.
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    completion_tokens: Counter,
    accepted_nodes: Counter,
    forwards: Counter,
    choices: Family<RequestLabels, Counter>,
    live: Gauge,
    queued: Gauge,
    connections: Gauge,
    cache_bytes: Gauge,
    draining: Gauge,
    latency: Family<MethodLabels, Histogram>,
    first_block: Family<MethodLabels, Histogram>,
    forwards_per_token: Family<MethodLabels, Histogram>,
}

fn seconds() -> Histogram {
    // 5 ms to about 11 minutes.
    Histogram::new(exponential_buckets(0.005, 2.0, 18))
}

fn per_token() -> Histogram {
    Histogram::new([
        0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    ])
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let m = Self {
            registry: Registry::with_prefix("spot"),
            requests: Family::default(),
            choices: Family::default(),
            prompt_tokens: Counter::default(),
            completion_tokens: Counter::default(),
            accepted_nodes: Counter::default(),
            forwards: Counter::default(),
            live: Gauge::default(),
            queued: Gauge::default(),
            connections: Gauge::default(),
            cache_bytes: Gauge::default(),
            draining: Gauge::default(),
            latency: Family::new_with_constructor(seconds),
            first_block: Family::new_with_constructor(seconds),
            forwards_per_token: Family::new_with_constructor(per_token),
        };
        let mut registry = Registry::with_prefix("spot");
        let r = &mut registry;
        r.register(
            "http_requests",
            "HTTP requests answered, by route and status",
            m.requests.clone(),
        );
        r.register(
            "choices",
            "Decodes (choices) of completion requests that ended, by route and the request's status",
            m.choices.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of accepted requests",
            m.prompt_tokens.clone(),
        );
        r.register(
            "completion_tokens",
            "Tokens generated",
            m.completion_tokens.clone(),
        );
        r.register(
            "accepted_draft_nodes",
            "Draft nodes the verifier accepted (block-diffusion methods that draft)",
            m.accepted_nodes.clone(),
        );
        r.register(
            "forwards",
            "Merged model forwards the engine ran",
            m.forwards.clone(),
        );
        r.register(
            "live_requests",
            "Decodes in the running batch",
            m.live.clone(),
        );
        r.register(
            "queue_depth",
            "Decodes waiting to join the batch",
            m.queued.clone(),
        );
        r.register(
            "open_connections",
            "HTTP connections open",
            m.connections.clone(),
        );
        r.register(
            "cache_bytes",
            "Bytes the model's open cache slots hold",
            m.cache_bytes.clone(),
        );
        r.register(
            "draining",
            "1 while the server drains before it exits",
            m.draining.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from a completion request's arrival to its end, by route and method",
            m.latency.clone(),
        );
        r.register(
            "time_to_first_block_seconds",
            "Time from a completion request's arrival to its first generated tokens",
            m.first_block.clone(),
        );
        r.register(
            "forwards_per_token",
            "Each decode's own model forwards per generated token (1: one token per forward)",
            m.forwards_per_token.clone(),
        );
        Self { registry, ..m }
    }

    /// A finished HTTP request.
    pub(crate) fn request(&self, endpoint: &'static str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
    }

    /// A completion request's tokens and timings, once it ends.
    pub(crate) fn completion(&self, done: &Finished<'_>) {
        let labels = MethodLabels {
            endpoint: done.endpoint,
            method: done.method.to_string(),
        };
        self.prompt_tokens.inc_by(done.prompt_tokens as u64);
        self.completion_tokens.inc_by(done.completion_tokens as u64);
        self.latency
            .get_or_create(&labels)
            .observe(done.duration.as_secs_f64());
        if let Some(t) = done.first_block {
            self.first_block
                .get_or_create(&labels)
                .observe(t.as_secs_f64());
        }
        self.choices
            .get_or_create(&RequestLabels {
                endpoint: done.endpoint,
                status: done.status,
            })
            .inc_by(done.choices as u64);
    }

    /// One decode's work, once it ends.
    pub(crate) fn decode(
        &self,
        endpoint: &'static str,
        method: &str,
        tokens: usize,
        work: &serde_json::Value,
    ) {
        if let Some(n) = work["accepted_nodes"].as_u64() {
            self.accepted_nodes.inc_by(n);
        }
        if let Some(nfe) = work["nfe"].as_u64()
            && tokens > 0
        {
            self.forwards_per_token
                .get_or_create(&MethodLabels {
                    endpoint,
                    method: method.to_string(),
                })
                .observe(nfe as f64 / tokens as f64);
        }
    }

    /// The exposition, with the engine's counters as of `stats`.
    pub(crate) fn render(&self, stats: &EngineStats, connections: usize, draining: bool) -> String {
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&self.live, stats.live as u64);
        gauge(&self.queued, stats.queued as u64);
        gauge(&self.connections, connections as u64);
        gauge(&self.cache_bytes, stats.cache_bytes);
        gauge(&self.draining, u64::from(draining));
        // The engine's forward count only grows: add what it ran since the last scrape.
        let seen = self.forwards.get();
        if stats.forwards > seen {
            self.forwards.inc_by(stats.forwards - seen);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A completion request that ended, as the metrics and the request log see it.
pub(crate) struct Finished<'a> {
    pub endpoint: &'static str,
    pub method: &'a str,
    pub status: u16,
    pub choices: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub duration: std::time::Duration,
    pub first_block: Option<std::time::Duration>,
}

/// The label of a request path: one of the server's routes, or `other`.
pub(crate) fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "/v1/completions",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/models" => "/v1/models",
        "/stats" => "/stats",
        "/metrics" => "/metrics",
        "/health" => "/health",
        _ => "other",
    }
}
