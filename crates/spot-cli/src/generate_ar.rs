//! `spot generate` on an autoregressive folder (Llama, Qwen2): token-by-token decoding with a
//! KV cache, greedy or sampled with the coupled noise.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_dlm::{ArConfig, ArOutput, AutoregressiveModel, decode_autoregressive};
use spot_models::CausalLm;

use crate::Backend;
use crate::generate::GenerateArgs;
use crate::methods::Method;

/// Decodes the prompt(s) of `a` with the autoregressive model in `dir`.
pub fn run(a: &GenerateArgs, dir: &Path) -> Result<()> {
    if a.method != Method::Df {
        bail!(
            "{} is an autoregressive model: it decodes token by token (--method df); --method {} \
             needs a block-diffusion model",
            dir.display(),
            a.method.name()
        );
    }
    let mut model =
        CausalLm::<Backend>::load_as(dir, &crate::backend::device()?, a.dtype.precision)
            .with_context(|| format!("loading model folder {}", dir.display()))?;
    let cfg = ArConfig {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        seed: a.seed,
        stop_ids: model.ar_info().stop_ids.clone(),
        early_stop: !a.no_early_stop,
    };
    let prompts = match &a.prompts {
        Some(path) => a.file_prompts(dir, model.tokenizer(), path)?,
        None => vec![(String::new(), a.single_prompt(dir, model.tokenizer())?)],
    };
    for (id, ids) in &prompts {
        let start = Instant::now();
        let out =
            decode_autoregressive(&mut model, ids, &cfg).with_context(|| format!("prompt {id}"))?;
        let wall = start.elapsed().as_secs_f64();
        let text = match model.tokenizer() {
            Some(t) => t.decode(&out.tokens)?,
            None => format!("{:?}", out.tokens),
        };
        if a.json || a.prompts.is_some() {
            println!("{}", result_json(id, ids.len(), &out, &text, wall));
        } else {
            println!("{text}");
            eprintln!(
                "[{} tokens, {} NFE (autoregressive), {:.2} s]",
                out.tokens.len(),
                out.forwards,
                wall
            );
        }
    }
    Ok(())
}

fn result_json(
    id: &str,
    prompt_tokens: usize,
    out: &ArOutput,
    text: &str,
    wall: f64,
) -> serde_json::Value {
    let mut j = serde_json::json!({
        "method": "ar",
        "prompt_tokens": prompt_tokens,
        "tokens": out.tokens,
        "text": text,
        "stopped": out.stopped,
        "nfe": out.forwards,
        "wall_s": wall,
    });
    if let (false, Some(obj)) = (id.is_empty(), j.as_object_mut()) {
        obj.insert("id".into(), id.into());
    }
    j
}
