//! Draft-free vs speculative decoding on a deterministic toy block-diffusion model.
//!
//! ```text
//! cargo run --release -p spot-dlm --example toy_speculative -- [--budget 8] [--temperature 1.0] [--prompts 20]
//! ```
//!
//! For every method it decodes the same prompts, checks that the tokens equal the draft-free
//! tokens, and prints NFE, block states scored and commits per forward. The toy model has no
//! learned commit order, so the figures only illustrate the machinery; real speed-ups are
//! measured on trained targets.

use std::process::ExitCode;

use spot_dlm::toy::{ToyConfig, ToyModel};
use spot_dlm::{
    DecodeConfig, DecodeOutput, DraftFreeDecoder, OracleScorer, SpotDecoder, StaleConfidenceScorer,
};

struct Args {
    budget: usize,
    temperature: f32,
    prompts: u64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        budget: 8,
        temperature: 0.0,
        prompts: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--budget" => a.budget = value.parse().map_err(|e| bad(&e))?,
            "--temperature" => a.temperature = value.parse().map_err(|e| bad(&e))?,
            "--prompts" => a.prompts = value.parse().map_err(|e| bad(&e))?,
            _ => {
                return Err(format!(
                    "unknown flag {flag}; use --budget, --temperature, --prompts"
                ));
            }
        }
    }
    Ok(a)
}

#[derive(Default)]
struct Totals {
    nfe: u64,
    states: u64,
    committed: u64,
    forwards: u64,
    exact: u64,
}

impl Totals {
    fn add(&mut self, out: &DecodeOutput, reference: &DecodeOutput) {
        self.nfe += out.stats.work.nfe;
        self.states += out.stats.work.states_scored;
        self.committed += out.stats.committed;
        self.forwards += out.stats.work.block_forwards;
        self.exact += u64::from(out.tokens == reference.tokens);
    }
}

fn run(args: &Args) -> Result<(), spot_dlm::Error> {
    let cfg = DecodeConfig {
        block_size: 32,
        max_new_tokens: 256,
        temperature: args.temperature,
        seed: 2024,
        early_stop: false,
        ..DecodeConfig::default()
    };
    let names = ["draft-free", "ssd-chain", "blockspec-tree", "oracle"];
    let mut totals: Vec<Totals> = names.iter().map(|_| Totals::default()).collect();
    for i in 0..args.prompts {
        let mut model = ToyModel::new(ToyConfig {
            seed: i,
            stability: 0.9,
            peak: 6.0,
            vocab_size: 256,
            mask_id: 255,
            ..ToyConfig::default()
        });
        let prompt: Vec<u32> = (0..20).map(|j| ((i * 31 + j * 7) % 250) as u32).collect();
        let reference = DraftFreeDecoder::new()
            .with_trace(true)
            .decode(&mut model, &prompt, &cfg)?;
        let trace = reference
            .trace
            .as_ref()
            .ok_or(spot_dlm::core::Error::config("trace", "missing"))?;
        let mut decoders = [
            SpotDecoder::builder().budget(args.budget).chain().build()?,
            SpotDecoder::builder()
                .budget(args.budget)
                .scorer(StaleConfidenceScorer)
                .build()?,
            SpotDecoder::builder()
                .budget(args.budget)
                .scorer(OracleScorer::from_trace(trace, false)?)
                .build()?,
        ];
        totals[0].add(&reference, &reference);
        for (k, d) in decoders.iter_mut().enumerate() {
            let out = d.decode(&mut model, &prompt, &cfg)?;
            totals[k + 1].add(&out, &reference);
        }
    }
    let n = args.prompts as f64;
    println!(
        "{} prompts x 256 tokens, block 32, T = {}, budget D = {}",
        args.prompts, args.temperature, args.budget
    );
    println!(
        "{:<16} {:>9} {:>9} {:>14} {:>15} {:>10}",
        "method", "NFE", "speed-up", "states/prompt", "commits/forward", "exact"
    );
    let base = totals[0].nfe as f64;
    for (name, t) in names.iter().zip(&totals) {
        println!(
            "{:<16} {:>9.1} {:>8.2}x {:>14.1} {:>15.2} {:>6}/{}",
            name,
            t.nfe as f64 / n,
            base / t.nfe as f64,
            t.states as f64 / n,
            t.committed as f64 / t.forwards as f64,
            t.exact,
            args.prompts
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
