//! Embed the OpenAI-compatible server in your own program: one model, continuous batching, and
//! every decoding method of the registry (`spot-methods`) selectable per request with the
//! extra field `spot: {"method": ..., "budget": ...}`.
//!
//! ```text
//! cargo run --release --example embed_server                    # self-check, then exit
//! cargo run --release --example embed_server -- MODEL_DIR --serve   # serve until Ctrl-C
//! ```
//!
//! Without `--serve` it starts on a free port, sends the same prompt with `df` and with `spot`
//! through the load generator (`spot_serve::load`), checks that both texts are equal and that
//! SPOT took fewer forwards, and stops. The model folder defaults to the shipped
//! `models/sdar-tiny-code`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};

use serde_json::json;
use spot_dlm::{BlockDiffusionModel, DecodeConfig, Request, Strategy};
use spot_methods::{DraftFiles, Drafters, Method, Settings, request};
use spot_models::chat::ChatTemplate;
use spot_models::{CpuBackend, DiffusionModel};
use spot_serve::load::{LoadConfig, run_blocking};
use spot_serve::{BoxError, Defaults, DiffusionEngine, Frontend, JobSpec, ServeConfig, Server};

type Model = DiffusionModel<CpuBackend>;

/// A job's request: its method (the request's, else `df`), that method's drafters loaded once.
fn job_request(
    dir: &Path,
    drafters: &mut HashMap<Method, Drafters<CpuBackend>>,
    model: &mut Model,
    job: &JobSpec,
) -> Result<Request<Strategy>, BoxError> {
    let method = Method::parse(job.method.as_deref().unwrap_or("df"))?;
    if method.is_autoregressive() {
        return Err(format!(
            "`spot.method` {} needs an autoregressive model",
            method.name()
        )
        .into());
    }
    let drafters = match drafters.entry(method) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => {
            let files = DraftFiles::in_folder(dir);
            e.insert(Drafters::load(&[method], &files, &Default::default())?)
        }
    };
    let settings = Settings {
        budget: job.budget.unwrap_or(8),
        ..Settings::default()
    };
    let cfg = DecodeConfig {
        max_new_tokens: job.max_tokens,
        temperature: job.temperature,
        seed: job.seed,
        ..DecodeConfig::for_model(model.info())
    };
    Ok(request(
        method,
        settings,
        drafters,
        model,
        (&job.prompt, &cfg),
    )?)
}

fn start(dir: PathBuf, addr: &str) -> Result<Server, BoxError> {
    let config = ServeConfig {
        addr: addr.into(),
        ..ServeConfig::default()
    };
    Ok(Server::start(config, move || {
        let model = Model::load(&dir, &Default::default())?;
        let tokenizer = model
            .tokenizer()
            .cloned()
            .ok_or("the folder has no tokenizer.json")?;
        let info = model.info().clone();
        let frontend = Frontend {
            model_id: "model".into(),
            tokenizer,
            template: ChatTemplate::from_dir(&dir).ok(),
            stop_ids: info.stop_ids.clone(),
            early_stop: true,
            max_positions: info.max_positions,
            vocab_size: info.vocab_size,
            max_n: 8,
            defaults: Defaults {
                max_tokens: 64,
                temperature: 0.0,
                seed: 0,
                method: "df".into(),
                budget: 8,
            },
        };
        let mut drafters = HashMap::new();
        let factory =
            Box::new(move |m: &mut Model, job: &JobSpec| job_request(&dir, &mut drafters, m, job));
        Ok((frontend, DiffusionEngine::new(model, factory)))
    })?)
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = args.iter().any(|a| a == "--serve");
    let dir = match args.iter().find(|a| !a.starts_with("--")) {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sdar-tiny-code"),
    };
    if serve {
        let server = start(dir, "127.0.0.1:8000")?;
        println!("listening on http://{} (Ctrl-C stops)", server.addr());
        server.wait()?;
        return Ok(());
    }
    let server = start(dir, "127.0.0.1:0")?;
    let url = format!("http://{}", server.addr());
    let mut texts = Vec::new();
    for method in ["df", "spot"] {
        let cfg = LoadConfig {
            prompts: vec!["def fibonacci(n):".into()],
            max_tokens: 48,
            spot: Some(json!({ "method": method, "budget": 8 })),
            ..LoadConfig::new(&url, "model")
        };
        let r = run_blocking(&cfg)?.responses.remove(0);
        println!("{method}: {} forwards, {:?}", r.nfe.unwrap_or(0), r.text);
        texts.push((r.text, r.nfe.unwrap_or(0)));
    }
    server.stop()?;
    if texts[0].0 != texts[1].0 {
        return Err("spot's text differs from draft-free's".into());
    }
    if texts[1].1 >= texts[0].1 {
        return Err("spot took no fewer forwards than draft-free".into());
    }
    println!("identical texts; {} -> {} forwards", texts[0].1, texts[1].1);
    Ok(())
}
