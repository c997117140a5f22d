//! `spot serve`: the OpenAI-compatible server of `spot-serve` over a model folder, with
//! `spot generate`'s decoding options as its defaults.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};

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
}

/// Runs `spot serve` until Ctrl-C.
pub fn run(a: &ServeArgs) -> Result<()> {
    let server = start(a)?;
    eprintln!(
        "spot serve: listening on http://{} (Ctrl-C stops)",
        server.addr()
    );
    server.wait()?;
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
        let model = crate::generate::ar::load_target(&dir, dtype)?;
        let tokenizer = model
            .tokenizer()
            .cloned()
            .context("spot serve needs tokenizer.json in the model folder")?;
        let info = model.ar_info().clone();
        let drafter =
            crate::generate::ar::drafter(decode.files.drafter.as_deref(), &dir, info.vocab_size)?;
        let drafter_vocab = drafter.vocab_size();
        // The server's settings must be valid now, not at the first request.
        specdiff.config(decode.seed).validate()?;
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
            let sd = (specdiff.config(job.seed), drafter_vocab);
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
