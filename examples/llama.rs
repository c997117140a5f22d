//! An autoregressive target (Llama, Qwen2, Qwen3 folders) with SpecDiff-2: one prompt decoded
//! token by token and with SpecDiff-2's training-free prompt-lookup drafter, at T 0 and 1,
//! checked equal; then three prompts through one `SpecDiffBatch`, sharing target forwards.
//!
//! ```text
//! cargo run --release --example llama                       # the committed llama-tiny fixture
//! cargo run --release --example llama -- crates/spot-models/tests/fixtures/qwen2-tiny
//! cargo run --release --example llama -- /tmp/smollm2-hf "What is the capital of France?" --chat
//! ```

mod common;

use spot_dlm::{ArConfig, AutoregressiveModel, decode_autoregressive};
use spot_models::{CausalLm, CpuBackend};
use spot_specdiff::{
    LookupDrafter, SpecDiffBatch, SpecDiffConfig, SpecDiffDecoder, SpecDiffRequest,
};

fn main() -> std::process::ExitCode {
    common::main(|| {
        let a = common::Args::parse("llama-tiny", "a b a b a b")?;
        let mut model = CausalLm::<CpuBackend>::load(&a.dir, &Default::default())?;
        let tok = model.tokenizer().cloned().ok_or("no tokenizer.json")?;
        let ids = a.prompt_ids(&tok)?;
        let info = model.ar_info().clone();
        println!(
            "{}: {} parameters",
            model.config().model_type,
            model.parameter_count()
        );
        // Drafts from the context's own n-grams; every drafted token is accepted only where
        // it is the target's own choice under the decode's noise, so the output is exact.
        let mut drafter = LookupDrafter::new(info.vocab_size, 3, 2);
        let sd = SpecDiffConfig::default();
        for temperature in [0.0, 1.0] {
            let cfg = ArConfig {
                max_new_tokens: a.max_new,
                temperature,
                seed: 7,
                stop_ids: info.stop_ids.clone(),
                ..ArConfig::default()
            };
            let plain = decode_autoregressive(&mut model, &ids, &cfg)?;
            let fast = SpecDiffDecoder::new(sd)?.decode(&mut model, &mut drafter, &ids, &cfg)?;
            println!("T {temperature}: {:?}", tok.decode(&fast.tokens)?);
            println!(
                "  forwards {} -> {} with SpecDiff-2",
                plain.forwards, fast.forwards
            );
            if fast.tokens != plain.tokens {
                return Err(
                    format!("T {temperature}: SpecDiff-2 differs from plain decoding").into(),
                );
            }
        }
        // Several requests at once: each step runs one target forward over all of them, each
        // in its own cache slot; each decodes what it would alone.
        let cfg = ArConfig {
            max_new_tokens: a.max_new,
            stop_ids: info.stop_ids.clone(),
            ..ArConfig::default()
        };
        let prompts = [
            ids.clone(),
            tok.encode("the cat the cat")?,
            tok.encode("1 2 3 1 2 3")?,
        ];
        let mut batch = SpecDiffBatch::new(prompts.len())?;
        for p in &prompts {
            batch.submit(SpecDiffRequest::new(p, &cfg, sd, &info, info.vocab_size)?);
        }
        let mut own = 0;
        for f in batch.run(&mut model, &mut drafter)? {
            let out = f.output?;
            let alone = decode_autoregressive(&mut model, &prompts[f.id as usize], &cfg)?;
            if out.tokens != alone.tokens {
                return Err(format!("request {}: batched output differs", f.id).into());
            }
            own += out.forwards;
        }
        println!(
            "batch of 3: {} shared forwards for the requests' {own}",
            batch.forwards()
        );
        println!("outputs identical: yes");
        Ok(())
    })
}
