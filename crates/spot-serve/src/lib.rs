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
mod engine;
mod error;
mod frontend;
pub mod load;
mod openai;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

pub use engine::{
    ArEngine, ArFactory, BoxError, Completion, DiffusionEngine, Engine, EngineStats, Factory,
    JobSpec, Left,
};
pub use error::{ApiError, ServeError};
pub use frontend::{Defaults, Frontend};
pub use openai::{MAX_STOPS, MAX_TEMPERATURE};

/// Where and how much a server serves, and who may use it.
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
        }
    }
}

/// A running server: the HTTP listener on a tokio runtime and the engine thread.
pub struct Server {
    addr: SocketAddr,
    runtime: tokio::runtime::Runtime,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    engine: Option<std::thread::JoinHandle<Result<(), String>>>,
    stats: Arc<Mutex<EngineStats>>,
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
        ] {
            if v == 0 {
                return Err(ServeError::Setting {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        let (submit, submissions) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let engine_stats = Arc::clone(&stats);
        let max_batch = config.max_batch;
        let engine = std::thread::Builder::new()
            .name("spot-engine".into())
            .spawn(move || match load() {
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    Ok(())
                }
                Ok((frontend, engine)) => {
                    let _ = ready_tx.send(Ok(frontend));
                    engine::run(engine, max_batch, submissions, engine_stats)
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
        let shared = Arc::new(routes::Shared {
            frontend,
            submit: Mutex::new(submit),
            stats: Arc::clone(&stats),
            max_pending: config.max_pending,
            next_id: AtomicU64::new(0),
        });
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let app = routes::router(shared, config.api_keys.clone(), config.max_body_bytes);
        let http = runtime.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop.await;
                })
                .await
        });
        Ok(Self {
            addr,
            runtime,
            shutdown: Some(shutdown),
            http: Some(http),
            engine: Some(engine),
            stats,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The engine's counters now (what `GET /stats` answers).
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|g| *g).unwrap_or_default()
    }

    /// Serves until Ctrl-C (then stops as [`Server::stop`] does) or until the server fails.
    pub fn wait(mut self) -> Result<(), ServeError> {
        let http = self.http.take();
        let ended = self.runtime.block_on(async {
            match http {
                Some(h) => tokio::select! {
                    r = h => Some(r),
                    _ = tokio::signal::ctrl_c() => None,
                },
                None => None,
            }
        });
        match ended {
            None => self.stop(),
            Some(Ok(Ok(()))) => self.join_engine(),
            Some(Ok(Err(e))) => Err(ServeError::Io(e)),
            Some(Err(e)) => Err(ServeError::Engine(e.to_string())),
        }
    }

    /// Stops accepting connections, waits for open ones to finish, and ends the engine.
    pub fn stop(mut self) -> Result<(), ServeError> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.http.take() {
            match self.runtime.block_on(h) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(ServeError::Io(e)),
                Err(e) => return Err(ServeError::Engine(e.to_string())),
            }
        }
        self.join_engine()
    }

    fn join_engine(&mut self) -> Result<(), ServeError> {
        match self.engine.take().map(std::thread::JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(ServeError::Engine(e)),
            Some(Err(_)) => Err(ServeError::Engine("the engine thread panicked".into())),
        }
    }
}
