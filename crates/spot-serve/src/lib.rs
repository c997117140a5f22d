//! An OpenAI-compatible HTTP server over SPOT's exact decoders, with continuous batching.
//!
//! `spot serve` (in `spot-cli`) is this crate with the CLI's model loading and decoding
//! methods; a Rust program can embed it the same way: give [`Server::start`] a closure that
//! loads the model on the engine thread and returns the [`Frontend`] (what the HTTP side
//! knows: tokenizer, chat template, limits, defaults) and the [`Engine`]: a
//! [`DiffusionEngine`] (a block-diffusion model and a factory that turns a [`JobSpec`] into a
//! [`spot_core::Request`]) or an [`ArEngine`] (an autoregressive model, a SpecDiff-2 drafter
//! and a factory of [`spot_specdiff::SpecDiffRequest`]s).
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI's bodies; `stream: true`
//!   answers with server-sent events, one chunk per finished block; `n` choices (choice `i`
//!   uses `seed + i`), `stop`, `max_tokens`, `temperature`, `seed`, `usage`, `finish_reason`.
//!   The extra field `spot: {"method", "budget"}` overrides the server's decoding method and
//!   draft budget for one request; responses carry a `spot` object with the work counters.
//! - `GET /v1/models`, `GET /stats` (live and queued requests, open cache slots, cache bytes,
//!   counters), `GET /health`.
//! - Faults of a request (malformed JSON, unknown fields or model, a prompt over the context,
//!   a bad temperature, `n` or budget, a method the server cannot load) are HTTP 400 with
//!   OpenAI's error body naming the field.
//!
//! All requests run through one batch on one engine thread ([`spot_core::BatchDriver`], or
//! [`spot_specdiff::SpecDiffBatch`] for autoregressive models): requests join and leave the
//! running batch between forwards, and since a merged forward's
//! statistics are bit-identical to each request's alone, every response equals what `spot
//! generate` prints for the same prompt, seed, method and budget. A client that disconnects
//! cancels its decodes; their cache slots close at the engine's next step.
//!
//! [`load`] is a load generator for this API (concurrent streamed or plain requests,
//! throughput and latency percentiles), used by the tests and `spot bench-serve`.
//!
//! ```no_run
//! use spot_serve::{Defaults, DiffusionEngine, Frontend, ServeConfig, Server};
//! use spot_core::{BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, Request};
//! use spot_models::{DiffusionModel, hf::Tokenizer};
//! use burn_flex::Flex;
//!
//! let dir = std::path::PathBuf::from("models/sdar-tiny-code");
//! let server = Server::start(ServeConfig::default(), move || {
//!     let model = DiffusionModel::<Flex>::load(&dir, &Default::default())?;
//!     let frontend = Frontend {
//!         model_id: "sdar-tiny-code".into(),
//!         tokenizer: Tokenizer::open(&dir)?,
//!         template: None,
//!         stop_ids: model.info().stop_ids.clone(),
//!         early_stop: true,
//!         max_positions: model.info().max_positions,
//!         vocab_size: model.info().vocab_size,
//!         max_n: 16,
//!         defaults: Defaults { max_tokens: 256, temperature: 0.0, seed: 0,
//!             method: "df".into(), budget: 8 },
//!     };
//!     let factory = Box::new(|m: &mut DiffusionModel<Flex>, job: &spot_serve::JobSpec| {
//!         let cfg = DecodeConfig { max_new_tokens: job.max_tokens,
//!             temperature: job.temperature, seed: job.seed,
//!             ..DecodeConfig::for_model(m.info()) };
//!         Ok(Request::new(&job.prompt, &cfg, m.info(), DraftFreeDecoder::new())?)
//!     });
//!     Ok((frontend, DiffusionEngine::new(model, factory)))
//! })?;
//! println!("listening on http://{}", server.addr());
//! server.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod conn;
mod engine;
mod error;
mod frontend;
pub mod load;
mod metrics;
mod openai;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use engine::{
    ArEngine, ArFactory, BoxError, Completion, DiffusionEngine, Engine, EngineStats, Factory,
    JobSpec, Left,
};
pub use error::{ApiError, ServeError};
pub use frontend::{Defaults, Frontend};
pub use openai::{MAX_STOPS, MAX_TEMPERATURE};

/// Where and how much a server serves, and who may use it. Every size and time a client can
/// make the server spend is bounded here.
#[derive(Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Address to listen on (`host:port`; port 0 picks a free one, see [`Server::addr`]).
    pub addr: String,
    /// Requests decoded together at most (the batch driver's in-flight limit).
    pub max_batch: usize,
    /// Requests held at most (running and queued); more are answered 503 with `Retry-After`.
    pub max_pending: usize,
    /// API keys: when any is set, every route but `/health` needs `Authorization: Bearer
    /// KEY` with one of them (else 401). Compared in constant time, never printed.
    pub api_keys: Vec<String>,
    /// Serve on an address other than loopback without keys (refused at start otherwise).
    pub allow_unauthenticated: bool,
    /// The largest request body in bytes (larger: 413 naming the limit).
    pub max_body_bytes: usize,
    /// The longest prompt in tokens (longer: 400 `prompt_too_long`); `None`: the model's
    /// context is the only bound.
    pub max_prompt_tokens: Option<usize>,
    /// `max_tokens` × choices (`n` × prompts) of one request at most (more: 400
    /// `request_too_large`).
    pub max_request_tokens: usize,
    /// Connections open at once at most; one more is answered 503 (`too_many_connections`,
    /// with `Retry-After`) and closed.
    pub max_connections: usize,
    /// A request's headers, and then its body, must each arrive within this; a keep-alive
    /// connection idle for this long is closed (a body that is too slow: 408).
    pub read_timeout: Duration,
    /// A response write that makes no progress for this long (a client that stopped reading)
    /// closes the connection, which cancels its decodes.
    pub write_timeout: Duration,
    /// How long [`Server::stop`] lets requests in flight finish before it cancels them.
    pub drain_timeout: Duration,
    /// Put each request's first prompt text in its log line (off: prompts are never logged).
    pub log_prompts: bool,
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("addr", &self.addr)
            .field("max_batch", &self.max_batch)
            .field("max_pending", &self.max_pending)
            .field(
                "api_keys",
                &format_args!("[{} hidden]", self.api_keys.len()),
            )
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_prompt_tokens", &self.max_prompt_tokens)
            .field("max_request_tokens", &self.max_request_tokens)
            .field("max_connections", &self.max_connections)
            .field("read_timeout", &self.read_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("drain_timeout", &self.drain_timeout)
            .field("log_prompts", &self.log_prompts)
            .finish()
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:8000".into(),
            max_batch: 16,
            max_pending: 1024,
            api_keys: Vec::new(),
            allow_unauthenticated: false,
            max_body_bytes: 2 << 20,
            max_prompt_tokens: None,
            max_request_tokens: 1 << 16,
            max_connections: 512,
            read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(30),
            log_prompts: false,
        }
    }
}

/// How a stop went: requests that finished while draining, and those cancelled when the
/// drain timeout passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Completion requests in flight when the stop began.
    pub in_flight: usize,
    /// Of them, those cancelled after the drain timeout (each answered 503).
    pub cancelled: usize,
    /// How long the drain took.
    pub took: Duration,
}

/// A running server: the HTTP listener on a tokio runtime and the engine thread.
pub struct Server {
    addr: SocketAddr,
    runtime: tokio::runtime::Runtime,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<tokio::task::JoinHandle<()>>,
    engine: Option<std::thread::JoinHandle<Result<(), String>>>,
    shared: Arc<routes::Shared>,
    abort: Arc<AtomicBool>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Loads the model with `load` on a new engine thread, binds `config.addr` and starts
    /// serving. Returns once the model is loaded and the socket listens.
    pub fn start<E, F>(config: ServeConfig, load: F) -> Result<Self, ServeError>
    where
        E: Engine + 'static,
        F: FnOnce() -> Result<(Frontend, E), BoxError> + Send + 'static,
    {
        for (field, v) in [
            ("max_batch", config.max_batch),
            ("max_pending", config.max_pending),
            ("max_body_bytes", config.max_body_bytes),
            ("max_request_tokens", config.max_request_tokens),
            ("max_connections", config.max_connections),
            ("max_prompt_tokens", config.max_prompt_tokens.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(ServeError::Setting {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        for (field, d) in [
            ("read_timeout", config.read_timeout),
            ("write_timeout", config.write_timeout),
        ] {
            if d.is_zero() {
                return Err(ServeError::Setting {
                    field,
                    reason: "must be longer than 0".into(),
                });
            }
        }
        let (submit, submissions) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let engine_stats = Arc::clone(&stats);
        let abort = Arc::new(AtomicBool::new(false));
        let engine_abort = Arc::clone(&abort);
        let max_batch = config.max_batch;
        let engine = std::thread::Builder::new()
            .name("spot-engine".into())
            .spawn(move || {
                let serve = move || match load() {
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        Ok(())
                    }
                    Ok((frontend, engine)) => {
                        let _ = ready_tx.send(Ok(frontend));
                        engine::run(engine, max_batch, submissions, engine_stats, engine_abort)
                    }
                };
                // The model loads and decodes on a worker of a rayon pool, so the drafters'
                // and the model's small parallel calls start inside it instead of being
                // handed in from this thread and waited for (`docs/drafter.md`); where no
                // pool can be made, here.
                match rayon::ThreadPoolBuilder::new()
                    .thread_name(|i| format!("spot-engine-{i}"))
                    .build()
                {
                    Ok(pool) => pool.install(serve),
                    Err(_) => serve(),
                }
            })?;
        let frontend = match ready_rx.recv() {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(ServeError::Load(e)),
            Err(_) => {
                let why = match engine.join() {
                    Err(_) => "the loading thread panicked".to_string(),
                    Ok(r) => format!("the loading thread ended: {r:?}"),
                };
                return Err(ServeError::Load(why));
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spot-http")
            .enable_all()
            .build()?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&config.addr))
            .map_err(|source| ServeError::Bind {
                addr: config.addr.clone(),
                source,
            })?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && config.api_keys.is_empty() && !config.allow_unauthenticated {
            return Err(ServeError::Setting {
                field: "api_keys",
                reason: format!(
                    "{addr} is reachable from other machines: give an API key, or allow \
                     unauthenticated use explicitly"
                ),
            });
        }
        if config.api_keys.iter().any(String::is_empty) {
            return Err(ServeError::Setting {
                field: "api_keys",
                reason: "an API key is empty".into(),
            });
        }
        let connections = Arc::new(conn::Connections::new(config.max_connections));
        let shared = Arc::new(routes::Shared {
            frontend,
            submit: Mutex::new(Some(submit)),
            stats,
            limits: routes::Limits {
                max_pending: config.max_pending,
                max_body_bytes: config.max_body_bytes,
                read_timeout: config.read_timeout,
                max_prompt_tokens: config.max_prompt_tokens,
                max_request_tokens: config.max_request_tokens,
                log_prompts: config.log_prompts,
            },
            next_id: AtomicU64::new(0),
            metrics: metrics::Metrics::new(),
            drain: routes::Drain::default(),
            connections: Arc::clone(&connections),
            held: Arc::default(),
        });
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let app = routes::router(Arc::clone(&shared), config.api_keys.clone());
        let limits = conn::ConnLimits {
            max_connections: config.max_connections,
            read_timeout: config.read_timeout,
            write_timeout: config.write_timeout,
            close_timeout: Duration::from_secs(5),
        };
        let http = runtime.spawn(conn::serve(listener, app, limits, connections, async {
            let _ = stop.await;
        }));
        Ok(Self {
            addr,
            runtime,
            shutdown: Some(shutdown),
            http: Some(http),
            engine: Some(engine),
            shared,
            abort,
            drain_timeout: config.drain_timeout,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// HTTP connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.open()
    }

    /// The engine's counters now (what `GET /stats` answers).
    pub fn stats(&self) -> EngineStats {
        self.shared.stats.lock().map(|g| *g).unwrap_or_default()
    }

    /// Serves until Ctrl-C or SIGTERM (then drains and stops as [`Server::stop`] does), or
    /// until the server fails.
    pub fn wait(mut self) -> Result<Drained, ServeError> {
        let http = self.http.take();
        let ended = self.runtime.block_on(async {
            match http {
                Some(h) => tokio::select! {
                    r = h => Some(r),
                    () = interrupted() => None,
                },
                None => None,
            }
        });
        match ended {
            None => self.stop(),
            Some(Ok(())) => {
                self.join_engine()?;
                Ok(Drained::default())
            }
            Some(Err(e)) => Err(ServeError::Engine(e.to_string())),
        }
    }

    /// Drains and stops: new requests are answered 503 (`/health` too) while the requests in
    /// flight finish, up to the drain timeout; those still running then are cancelled (each
    /// answered 503); then the listener and every connection close and the engine ends.
    pub fn stop(mut self) -> Result<Drained, ServeError> {
        let start = Instant::now();
        let drain = &self.shared.drain;
        drain.start();
        let in_flight = drain.in_flight();
        if in_flight > 0 {
            tracing::info!(in_flight, "draining");
        }
        let deadline = start + self.drain_timeout;
        while drain.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let cancelled = drain.in_flight();
        if cancelled > 0 {
            tracing::warn!(
                cancelled,
                "drain timeout passed: cancelling the requests left"
            );
            self.abort.store(true, Ordering::SeqCst);
            // Each cancelled decode ends at the engine's next step.
            let deadline = Instant::now() + Duration::from_secs(60);
            while drain.in_flight() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.http.take()
            && let Err(e) = self.runtime.block_on(h)
        {
            return Err(ServeError::Engine(e.to_string()));
        }
        self.join_engine()?;
        Ok(Drained {
            in_flight,
            cancelled,
            took: start.elapsed(),
        })
    }

    fn join_engine(&mut self) -> Result<(), ServeError> {
        // Closing the queue ends the engine once it is idle.
        if let Ok(mut submit) = self.shared.submit.lock() {
            submit.take();
        }
        match self.engine.take().map(std::thread::JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(ServeError::Engine(e)),
            Some(Err(_)) => Err(ServeError::Engine("the engine thread panicked".into())),
        }
    }
}

/// Ctrl-C, or SIGTERM (what systemd, Docker and Kubernetes send) on Unix.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
