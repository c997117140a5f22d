//! What the device reduction costs next to the product that makes the logits it reduces, on
//! wgpu's default device (lavapipe in CI, where speeds mean nothing but ratios do): for rows
//! of an LLM-shaped output layer (`--hidden`, `--vocab`), the median time of the logits matmul
//! `[rows, hidden] x [hidden, vocab]` (one value read back), and of the reduction of those logits, already
//! on the device, through the fused kernel and through burn's passes, at T 0 and 1.
//!
//! ```sh
//! VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json cargo run --release \
//!     -p spot-models --features wgpu --example device_reduction_cost -- 64 1024 32000 5
//! ```
//! Arguments: rows, hidden, vocab, repetitions (defaults 64 1024 32000 5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use burn_tensor::{Distribution, Tensor};
use spot_core::StatsQuery;
use spot_models::WgpuBackend as B;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("rows hidden vocab reps: whole numbers"))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (rows, hidden, vocab, reps) = (arg(0, 64), arg(1, 1024), arg(2, 32_000), arg(3, 5));
    let device = Default::default();
    let h = Tensor::<B, 2>::random([rows, hidden], Distribution::Normal(0.0, 1.0), &device);
    let w = Tensor::<B, 2>::random([hidden, vocab], Distribution::Normal(0.0, 0.05), &device);
    let logits = h.clone().matmul(w.clone());
    let positions: Vec<usize> = (0..rows).collect();
    let time = |f: &mut dyn FnMut()| {
        f(); // compile the kernels first
        median(
            (0..reps)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect(),
        )
    };
    let matmul = time(&mut || {
        // One value read back: the product runs in full, the transfer is not timed.
        let _ = h.clone().matmul(w.clone()).slice([0..1, 0..1]).into_data();
    });
    println!("rows {rows}, hidden {hidden}, vocab {vocab}, {reps} repetitions (medians)");
    println!("logits matmul: {matmul:.1} ms");
    for t in [0.0f32, 1.0] {
        let q = StatsQuery::new(t, 3);
        let noise = spot_models::testing::noise_rows::<B>(&q, &positions, vocab, &device);
        let run = |fused: bool| {
            time(&mut || {
                spot_models::testing::reduce_tensors(
                    logits.clone(),
                    noise.clone(),
                    &q,
                    None,
                    &positions,
                    fused,
                )
                .unwrap();
            })
        };
        let (fused, passes) = (run(true), run(false));
        println!(
            "T {t}: fused reduction {fused:.1} ms ({:.2}x the matmul), burn's passes {passes:.1} \
             ms ({:.2}x); fused / passes {:.2}",
            fused / matmul,
            passes / matmul,
            fused / passes
        );
    }
}
