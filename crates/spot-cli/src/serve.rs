//! `spot serve`: the OpenAI-compatible server of `spot-serve` over a model folder, with
//! `spot generate`'s decoding options as its defaults.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use spot_dlm::{ArConfig, AutoregressiveModel, BlockDiffusionModel, Request, Strategy};
use spot_models::chat::ChatTemplate;
use spot_models::hf::Tokenizer;
use spot_models::{CausalLm, DiffusionModel, Family};
use spot_serve::{
    ArEngine, BoxError, Defaults, DiffusionEngine, Frontend, JobSpec, ServeConfig, Server,
};

use crate::decode_args::DecodeArgs;
use crate::generate::ar::SpecDiffArgs;
use crate::methods::{Drafters, Method};
use crate::{Backend, DtypeArg, load, model_dir};

/// Arguments of `spot serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Hugging Face model folder: a block-diffusion family, or an autoregressive one (Llama,
    /// Qwen2, Qwen3) served with `--method df` or `--method specdiff`. Default: `SPOT_MODEL`,
    /// else the shipped `models/sdar-tiny-code`.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dtype: DtypeArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub(crate) port: u16,
    /// The model id requests name (default: the folder's name).
    #[arg(long)]
    pub(crate) served_model_name: Option<String>,
    /// A Jinja chat template for `/v1/chat/completions` (default: the folder's
    /// `tokenizer_config.json` or `chat_template.jinja`; without one, chat requests are
    /// refused).
    #[arg(long)]
    pub(crate) chat_template: Option<PathBuf>,
    /// An API key clients must send (`Authorization: Bearer KEY`); repeat for several. Also
    /// read from `SPOT_API_KEY`. With none, anyone who reaches the port may use the server,
    /// so a `--host` other than loopback then needs `--allow-unauthenticated`.
    #[arg(long = "api-key", value_name = "KEY")]
    pub(crate) api_keys: Vec<String>,
    /// Serve on an address other than loopback without an API key.
    #[arg(long)]
    pub(crate) allow_unauthenticated: bool,
    /// The largest request body in bytes (larger ones are answered 413).
    #[arg(long, default_value_t = 2 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_body_bytes: u64,
    /// Requests decoded together at most (continuous batching).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) max_batch: u64,
    /// Requests held at most, running and queued (more are answered 503).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_pending: u64,
    /// The largest draft budget a request may name (`spot.budget`; each drafted node is a
    /// block state in the verification forward, so this bounds a request's memory).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) max_budget: u64,
    /// Choices per request at most (`n`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) max_n: u64,
    /// Decoding defaults (`--max-new-tokens` is the default `max_tokens`, `--temperature` and
    /// `--seed` the defaults of a request that gives none).
    #[command(flatten)]
    pub(crate) decode: DecodeArgs,
    /// SpecDiff-2's settings (autoregressive folders).
    #[command(flatten)]
    pub(crate) specdiff: SpecDiffArgs,
    /// Connection and request bounds, draining, logs.
    #[command(flatten)]
    pub(crate) limits: ServeLimits,
}

/// The bounds of `spot serve` on what clients can make it spend, its drain, and its logs.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct ServeLimits {
    /// The longest prompt in tokens (longer ones are answered 400 `prompt_too_long`; default:
    /// the model's context).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_prompt_tokens: Option<u64>,
    /// `max_tokens` × choices of one request at most (400 `request_too_large` beyond).
    #[arg(long, default_value_t = 1 << 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_request_tokens: u64,
    /// Connections open at once at most (one more is answered 503 and closed).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) max_connections: u64,
    /// Seconds a request's headers, and then its body, may take to arrive; also how long an
    /// idle keep-alive connection stays open.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub(crate) read_timeout: f64,
    /// Seconds a response write may make no progress (a client that stopped reading) before
    /// the connection closes and its decodes are cancelled.
    #[arg(long, default_value_t = 60.0, value_parser = positive_seconds)]
    pub(crate) write_timeout: f64,
    /// On SIGTERM or Ctrl-C: seconds requests in flight get to finish (new ones are answered
    /// 503) before the rest are cancelled and the server exits.
    #[arg(long, default_value_t = 30.0, value_parser = non_negative_seconds)]
    pub(crate) drain_timeout: f64,
    /// Request logs (stderr): `text` or `json` lines; `off` for none. Levels follow
    /// `SPOT_LOG` (`info` by default; `debug` adds `/health` and `/metrics`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Put each request's prompt text in its log line (off by default: prompts are never
    /// logged).
    #[arg(long)]
    pub(crate) log_prompts: bool,
}

/// The format of `spot serve`'s logs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines with `key=value` fields.
    Text,
    /// One JSON object per line.
    Json,
    /// No request logs.
    Off,
}

impl ServeLimits {
    /// `spot serve`'s defaults, logs off (for `spot bench-serve`).
    pub(crate) fn quiet() -> Self {
        Self {
            max_prompt_tokens: None,
            max_request_tokens: 1 << 16,
            max_connections: 512,
            read_timeout: 30.0,
            write_timeout: 60.0,
            drain_timeout: 30.0,
            log_format: LogFormat::Off,
            log_prompts: false,
        }
    }
}

fn seconds(s: &str, min_exclusive: bool) -> std::result::Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("not a number of seconds: {e}"))?;
    let ok = v.is_finite() && v <= 86_400.0 && if min_exclusive { v > 0.0 } else { v >= 0.0 };
    if ok {
        Ok(v)
    } else if min_exclusive {
        Err("must be more than 0 and at most 86400 seconds".into())
    } else {
        Err("must be from 0 to 86400 seconds".into())
    }
}

fn positive_seconds(s: &str) -> std::result::Result<f64, String> {
    seconds(s, true)
}

fn non_negative_seconds(s: &str) -> std::result::Result<f64, String> {
    seconds(s, false)
}

/// Request logs on stderr in `format`, at the level `SPOT_LOG` names (default `info`).
pub(crate) fn init_logs(format: LogFormat) -> Result<()> {
    use tracing_subscriber::filter::LevelFilter;
    let level = match std::env::var("SPOT_LOG") {
        Ok(v) => v
            .parse::<LevelFilter>()
            .map_err(|e| anyhow::anyhow!("SPOT_LOG={v}: {e}"))?,
        Err(_) => LevelFilter::INFO,
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(true);
    let done = match format {
        LogFormat::Off => return Ok(()),
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    done.map_err(|e| anyhow::anyhow!("cannot start the logs: {e}"))
}

/// Runs `spot serve` until SIGTERM or Ctrl-C, then drains.
pub fn run(a: &ServeArgs) -> Result<()> {
    init_logs(a.limits.log_format)?;
    let server = start(a)?;
    eprintln!(
        "spot serve: listening on http://{} (SIGTERM or Ctrl-C drains and stops)",
        server.addr()
    );
    let drained = server.wait()?;
    eprintln!(
        "spot serve: stopped after draining {} requests in {:.1} s ({} cancelled at the drain \
         timeout)",
        drained.in_flight,
        drained.took.as_secs_f64(),
        drained.cancelled
    );
    Ok(())
}

/// Loads the model of `a` and starts its server.
pub(crate) fn start(a: &ServeArgs) -> Result<Server> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    let model_id = match &a.served_model_name {
        Some(n) => n.clone(),
        None => dir
            .canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
    };
    let template = match &a.chat_template {
        Some(path) => Some(read_template(path)?),
        None => ChatTemplate::from_dir(&dir).ok(),
    };
    let mut api_keys = a.api_keys.clone();
    if let Ok(key) = std::env::var("SPOT_API_KEY") {
        api_keys.push(key);
    }
    let loopback = a.host == "localhost"
        || a.host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback && api_keys.is_empty() && !a.allow_unauthenticated {
        bail!(
            "--host {} is reachable from other machines: give an API key (--api-key KEY or \
             SPOT_API_KEY), or pass --allow-unauthenticated",
            a.host
        );
    }
    let config = ServeConfig {
        addr: format!("{}:{}", a.host, a.port),
        max_batch: a.max_batch as usize,
        max_pending: a.max_pending as usize,
        api_keys,
        allow_unauthenticated: a.allow_unauthenticated,
        max_body_bytes: usize::try_from(a.max_body_bytes).unwrap_or(usize::MAX),
        max_prompt_tokens: a
            .limits
            .max_prompt_tokens
            .map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
        max_request_tokens: usize::try_from(a.limits.max_request_tokens).unwrap_or(usize::MAX),
        max_connections: a.limits.max_connections as usize,
        read_timeout: Duration::from_secs_f64(a.limits.read_timeout),
        write_timeout: Duration::from_secs_f64(a.limits.write_timeout),
        drain_timeout: Duration::from_secs_f64(a.limits.drain_timeout),
        log_prompts: a.limits.log_prompts,
    };
    if !Family::detect(&dir)?.is_diffusion() {
        return start_autoregressive(a, dir, config, (model_id, template));
    }
    let (decode, dtype, max_n) = (a.decode.clone(), a.dtype, a.max_n as usize);
    let max_budget = a.max_budget as usize;
    let server = Server::start(config, move || {
        let mut model = load(&dir, dtype)?;
        model.set_approximate_prefix_cache(decode.approx_prefix_cache)?;
        let tokenizer = model
            .tokenizer()
            .cloned()
            .context("spot serve needs tokenizer.json in the model folder")?;
        // The server's own method must load now: a missing drafter stops the start.
        let mut drafters = HashMap::new();
        drafters.insert(
            decode.method,
            crate::methods::load_drafters(&[decode.method], &decode.files.files(&dir))?,
        );
        let info = model.info();
        let frontend = frontend(
            (model_id, tokenizer, template),
            (&info.stop_ids, info.max_positions, info.vocab_size),
            &decode,
            max_n,
        );
        let factory = Box::new(
            move |model: &mut DiffusionModel<Backend>, job: &JobSpec| -> Result<_, BoxError> {
                Ok(job_request(
                    (&decode, max_budget),
                    &dir,
                    &mut drafters,
                    model,
                    job,
                )?)
            },
        );
        Ok((frontend, DiffusionEngine::new(model, factory)))
    })?;
    Ok(server)
}

/// The server of an autoregressive folder: draft-free (`df`) and SpecDiff-2 (`specdiff`)
/// requests in shared target forwards, drafted by the drafter `spot generate` would use.
fn start_autoregressive(
    a: &ServeArgs,
    dir: PathBuf,
    config: ServeConfig,
    (model_id, template): (String, Option<ChatTemplate>),
) -> Result<Server> {
    let method = a.decode.method;
    if !matches!(method, Method::Df | Method::Specdiff) {
        bail!(
            "{} is an autoregressive model: serve it with --method df or --method specdiff \
             (--method {} needs a block-diffusion model)",
            dir.display(),
            method.name()
        );
    }
    let (decode, specdiff, dtype, max_n) = (
        a.decode.clone(),
        a.specdiff.clone(),
        a.dtype,
        a.max_n as usize,
    );
    let server = Server::start(config, move || {
        let mut model = crate::generate::ar::load_target(&dir, dtype)?;
        let tokenizer = model
            .tokenizer()
            .cloned()
            .context("spot serve needs tokenizer.json in the model folder")?;
        let info = model.ar_info().clone();
        let drafter =
            crate::generate::ar::drafter(decode.files.drafter.as_deref(), &dir, &mut model)?;
        let drafter_vocab = drafter.vocab_size();
        let recommended = drafter.recommended();
        // The server's settings must be valid now, not at the first request.
        specdiff.config(decode.seed, recommended).validate()?;
        let frontend = frontend(
            (model_id, tokenizer, template),
            (&info.stop_ids, info.max_positions, info.vocab_size),
            &decode,
            max_n,
        );
        let factory = move |m: &mut CausalLm<Backend>, job: &JobSpec| -> Result<_, BoxError> {
            let method = match &job.method {
                Some(name) => Method::parse(name).map_err(|e| format!("`spot.method`: {e}"))?,
                None => method,
            };
            if job.budget.is_some() {
                return Err(
                    "`spot.budget` applies to block-diffusion models; SpecDiff-2's \
                            drafts are the server's --k and --draft-tokens"
                        .into(),
                );
            }
            let cfg = ArConfig {
                max_new_tokens: job.max_tokens,
                temperature: job.temperature,
                seed: job.seed,
                stop_ids: m.ar_info().stop_ids.clone(),
                early_stop: !decode.no_early_stop,
            };
            let sd = (specdiff.config(job.seed, recommended), drafter_vocab);
            let Some(r) =
                crate::generate::ar::request(method, &job.prompt, (&cfg, m.ar_info()), sd)
            else {
                return Err(format!(
                    "`spot.method` `{}` decodes block-diffusion models; this server's model \
                     is autoregressive (df or specdiff)",
                    method.name()
                )
                .into());
            };
            Ok(r?)
        };
        Ok((frontend, ArEngine::new(model, drafter, Box::new(factory))))
    })?;
    Ok(server)
}

/// What the HTTP side knows of a model: its id, tokenizer and template, the model's stop ids
/// and limits, and the server's decoding defaults.
fn frontend(
    (model_id, tokenizer, template): (String, Tokenizer, Option<ChatTemplate>),
    (stop_ids, max_positions, vocab_size): (&[u32], usize, usize),
    decode: &DecodeArgs,
    max_n: usize,
) -> Frontend {
    Frontend {
        model_id,
        tokenizer,
        template,
        stop_ids: stop_ids.to_vec(),
        early_stop: !decode.no_early_stop,
        max_positions,
        vocab_size,
        max_n,
        defaults: Defaults {
            max_tokens: decode.max_new_tokens,
            temperature: decode.temperature,
            seed: decode.seed,
            method: decode.method.name().to_string(),
            budget: decode.budget,
        },
    }
}

/// The request of one job: the server's options with the job's settings, its method's
/// drafters loaded once.
fn job_request(
    (base, max_budget): (&DecodeArgs, usize),
    dir: &Path,
    drafters: &mut HashMap<Method, Drafters>,
    model: &mut DiffusionModel<Backend>,
    job: &JobSpec,
) -> Result<Request<Strategy>> {
    let mut d = base.clone();
    d.max_new_tokens = job.max_tokens;
    d.temperature = job.temperature;
    d.seed = job.seed;
    if let Some(m) = &job.method {
        d.method = Method::parse(m).map_err(|e| anyhow::anyhow!("`spot.method`: {e}"))?;
        if d.method.is_autoregressive() {
            bail!("`spot.method` `{m}` decodes autoregressive targets only");
        }
    }
    if let Some(b) = job.budget {
        if b == 0 {
            bail!("`spot.budget` must be at least 1");
        }
        if b > max_budget {
            bail!("`spot.budget` {b} is over this server's limit of {max_budget} (--max-budget)");
        }
        d.budget = b;
    }
    let drafters = match drafters.entry(d.method) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(
            crate::methods::load_drafters(&[d.method], &d.files.files(dir))
                .with_context(|| format!("`spot.method` `{}`", d.method.name()))?,
        ),
    };
    let cfg = d.config(model);
    d.request(drafters, model, (&job.prompt, &cfg), None)
}

/// `--chat-template`: a Jinja file (without BOS or EOS strings: a template that needs them
/// names them itself).
fn read_template(path: &Path) -> Result<ChatTemplate> {
    let source = std::fs::read_to_string(path)
        .with_context(|| format!("reading chat template {}", path.display()))?;
    ChatTemplate::new(&source, None, None)
        .with_context(|| format!("chat template {}", path.display()))
}
