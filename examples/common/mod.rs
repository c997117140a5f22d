//! What the family examples share: their command line (`[MODEL_DIR] ["prompt"]
//! [--max-new-tokens N] [--budget D] [--chat]`, the family's committed fixture by default), the
//! prompt's ids, and the block-diffusion check (draft-free and SPOT at T 0 and 1, outputs
//! equal).

#![allow(dead_code)] // each example uses part of it

use std::path::PathBuf;
use std::time::Instant;

use spot_dlm::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer,
};
use spot_models::chat::ChatTemplate;
use spot_models::hf::Tokenizer;

/// The examples' error: anything, printed by `main`.
pub type Error = Box<dyn std::error::Error>;

/// One example run's settings.
pub struct Args {
    /// The model folder.
    pub dir: PathBuf,
    /// The prompt text.
    pub prompt: String,
    /// Tokens to generate.
    pub max_new: usize,
    /// SPOT's draft budget `D` (block-diffusion examples).
    pub budget: usize,
    /// Wrap the prompt in the folder's chat template.
    pub chat: bool,
}

impl Args {
    /// The command line, defaulting to the committed fixture `fixture` and `prompt`.
    pub fn parse(fixture: &str, prompt: &str) -> Result<Self, Error> {
        let mut a = Args {
            dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("crates/spot-models/tests/fixtures")
                .join(fixture),
            prompt: prompt.to_string(),
            max_new: 32,
            budget: 8,
            chat: false,
        };
        let mut dir_given = false;
        let mut it = std::env::args().skip(1);
        while let Some(x) = it.next() {
            let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
            match x.as_str() {
                "--max-new-tokens" => a.max_new = value("--max-new-tokens")?.parse()?,
                "--budget" => a.budget = value("--budget")?.parse()?,
                "--chat" => a.chat = true,
                _ if !dir_given && std::path::Path::new(&x).is_dir() => {
                    a.dir = PathBuf::from(x);
                    dir_given = true;
                }
                _ => a.prompt = x,
            }
        }
        Ok(a)
    }

    /// The prompt's ids, wrapped in the folder's chat template with `--chat`.
    pub fn prompt_ids(&self, tok: &Tokenizer) -> Result<Vec<u32>, Error> {
        let text = match self.chat {
            true => ChatTemplate::from_dir(&self.dir)?.prompt(None, &self.prompt)?,
            false => self.prompt.clone(),
        };
        Ok(tok.encode(&text)?)
    }
}

/// Runs an example's body and turns its error into a failing exit code.
pub fn main(run: impl FnOnce() -> Result<(), Error>) -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Decodes `ids` draft-free and with SPOT (budget `budget`, stale-confidence order) at T 0 and
/// 1 with `cfg`'s other settings; prints both texts' forwards and times, and fails if SPOT's
/// output differs.
pub fn draft_free_and_spot(
    model: &mut dyn BlockDiffusionModel,
    (tok, ids): (&Tokenizer, &[u32]),
    cfg: &DecodeConfig,
    budget: usize,
) -> Result<(), Error> {
    let mut spot = SpotDecoder::builder()
        .budget(budget)
        .scorer(StaleConfidenceScorer)
        .build()?;
    for temperature in [0.0, 1.0] {
        let cfg = DecodeConfig {
            temperature,
            seed: 7,
            ..cfg.clone()
        };
        let t = Instant::now();
        let df = DraftFreeDecoder::new().decode(model, ids, &cfg)?;
        let df_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let sp = spot.decode(model, ids, &cfg)?;
        let sp_s = t.elapsed().as_secs_f64();
        println!("T {temperature}: {:?}", tok.decode(&sp.tokens)?);
        println!(
            "  forwards {} -> {} with SPOT ({:.2} commits per forward), {df_s:.3} s -> {sp_s:.3} s",
            df.stats.work.nfe,
            sp.stats.work.nfe,
            sp.stats.tokens_per_forward()
        );
        if sp.tokens != df.tokens {
            return Err(format!("T {temperature}: SPOT's output differs from draft-free").into());
        }
    }
    println!("outputs identical: yes");
    Ok(())
}
