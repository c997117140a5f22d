//! LLaDA (a Llama body with full attention over the whole canvas): one prompt decoded
//! draft-free and with SPOT at T 0 and 1, then with threshold decoding (Fast-dLLM's `Φ^τ`)
//! and SPOT-Sets over it, each pair checked equal.
//!
//! ```text
//! cargo run --release --example llada                       # the committed tiny fixture
//! cargo run --release --example llada -- path/to/LLaDA-8B-Instruct "Write a haiku" --chat
//! ```

mod common;

use spot_dlm::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SetTreeConfig, SpotDecoder,
    StaleConfidenceScorer, StaleThresholdJoin, Transition,
};
use spot_models::{CpuBackend, Llada};

fn main() -> std::process::ExitCode {
    common::main(|| {
        let a = common::Args::parse("llada-tiny", "def f(x):")?;
        let mut model = Llada::<CpuBackend>::load(&a.dir, &Default::default())?;
        let tok = model.tokenizer().cloned().ok_or("no tokenizer.json")?;
        let ids = a.prompt_ids(&tok)?;
        // LLaDA attends over the whole canvas up to the generation end, which `for_model`
        // places after the prompt and `max_new_tokens` (the prefix call carries it).
        let cfg = DecodeConfig {
            max_new_tokens: a.max_new,
            ..DecodeConfig::for_model(model.info())
        };
        println!(
            "LLaDA: {} parameters, block size {}",
            model.parameter_count(),
            cfg.block_size
        );
        common::draft_free_and_spot(&mut model, (&tok, &ids), &cfg, a.budget)?;
        // Threshold decoding commits every position above τ per forward; SPOT-Sets drafts the
        // sets it would commit (here with the training-free stale-threshold join).
        let cfg = DecodeConfig {
            transition: Transition::Threshold { tau: 0.9 },
            ..cfg
        };
        let reference = DraftFreeDecoder::new().decode(&mut model, &ids, &cfg)?;
        let mut sets = SpotDecoder::builder()
            .sets(
                StaleThresholdJoin,
                StaleConfidenceScorer,
                SetTreeConfig {
                    budget: a.budget,
                    ..SetTreeConfig::default()
                },
            )
            .build()?;
        let fast = sets.decode(&mut model, &ids, &cfg)?;
        println!(
            "threshold 0.9: forwards {} -> {} with SPOT-Sets",
            reference.stats.work.nfe, fast.stats.work.nfe
        );
        if fast.tokens != reference.tokens {
            return Err("SPOT-Sets' output differs from threshold decoding".into());
        }
        println!("threshold outputs identical: yes");
        Ok(())
    })
}
