//! `spot`: generate text with draft-free or speculative decoding, and inspect model folders.
//!
//! Without `--model` the commands use the workspace's shipped benchmark target,
//! `models/sdar-tiny-code` (see [`model_dir`]).

mod backend;
mod bench;
mod bench_drafter;
mod bench_forward;
mod bench_report;
mod bench_serve;
mod calibrate;
mod collect;
mod decode_args;
mod eval_drafter;
mod generate;
mod inspect;
mod methods;
mod model_dir;
mod prompts;
mod replay;
mod serve;
mod train_drafter;
mod train_sets;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use spot_models::{DiffusionModel, Precision};

use backend::Backend;

#[derive(Parser)]
#[command(
    name = "spot",
    version,
    about = "Lossless speculative decoding for diffusion language models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode a prompt (or every prompt of a JSONL file) and print the continuation.
    Generate(generate::GenerateArgs),
    /// Print a model folder's configuration summary and parameter count.
    Inspect(inspect::InspectArgs),
    /// Time target forwards (prefix in the KV cache, batches of block states) and report
    /// medians and peak memory as one JSON line.
    BenchForward(bench_forward::BenchArgs),
    /// Time one call of the order drafter at several batch sizes, packed host path against
    /// burn, and report medians and p95 as one JSON line.
    BenchDrafter(bench_drafter::BenchDrafterArgs),
    /// Record draft-free trajectories of a prompt set (training data for the drafter).
    Collect(collect::CollectArgs),
    /// Train the commit-order drafter on collected trajectories (Algorithm 1).
    TrainDrafter(train_drafter::TrainArgs),
    /// Next-commit accuracy of a drafter on held-out trajectories, by depth.
    EvalDrafter(eval_drafter::EvalArgs),
    /// Re-enact the tree drafters' rounds on recorded trajectories without the target:
    /// forwards per trajectory by method, budget and rank tilt, in seconds.
    Replay(replay::ReplayArgs),
    /// Calibrate the Spiffy baseline's static draft graph from trajectories.
    CalibrateSpiffy(calibrate::CalibrateArgs),
    /// Refit a drafter checkpoint's token calibration (per temperature, by stale confidence or
    /// noised margin) from trajectories, without retraining the network.
    CalibrateTokens(calibrate::CalibrateTokensArgs),
    /// Set a drafter checkpoint's rank tilt and rank-path prior per temperature (its order
    /// leaned towards the stale-confidence ranking and mixed with a Spiffy graph's rank-path
    /// frequencies; `tools/tune_tilt.sh` and `spot replay` pick the values).
    CalibrateOrder(calibrate::CalibrateOrderArgs),
    /// Fit the SPOT-Sets drafter (join and token tables per temperature and threshold) on
    /// threshold-decoding trajectories (`spot collect --threshold`).
    CalibrateSets(calibrate::CalibrateSetsArgs),
    /// Train the learned SPOT-Sets drafter (a small network over the target's hidden states)
    /// on threshold-decoding trajectories with hidden states (`spot collect --threshold TAU
    /// --hidden-states`).
    TrainSets(train_sets::TrainSetsArgs),
    /// Compare decoding methods and budgets on prompt sets: NFE, positions, commits per
    /// forward, wall time and agreement with draft-free; Markdown, JSON and SVG.
    Bench(bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (completions, chat, streaming)
    /// with continuous batching; the decoding options are `spot generate`'s.
    Serve(serve::ServeArgs),
    /// Measure `spot serve` against the batch driver it wraps, on the same prompts in one
    /// run: tokens per second at each client concurrency, latency percentiles, every response
    /// checked equal to the driver's decode.
    BenchServe(bench_serve::BenchServeArgs),
}

/// `--dtype`: the float type of the target's weights and activations on the device.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DtypeArg {
    /// Weights and activations of the target on the device: `f32` (the reference), `bf16`,
    /// `f16`, or `auto` (f32 on CPU, the checkpoint's own type on a GPU).
    #[arg(long = "dtype", default_value_t = Precision::Auto)]
    pub precision: Precision,
}

/// Loads a block-diffusion model folder (any family, by `config.json`'s `model_type`) on the
/// default device of the backend (see [`backend::device`]) in `dtype`.
fn load(dir: &Path, dtype: DtypeArg) -> Result<DiffusionModel<Backend>> {
    let device = backend::device()?;
    DiffusionModel::<Backend>::load_as(dir, &device, dtype.precision)
        .with_context(|| format!("loading model folder {}", dir.display()))
}

/// Runs `f` on a worker of a thread pool (as many threads as the global one), so that the
/// drafters' small parallel calls (the token module's step beside the order network's, a
/// call's states split over the threads) start from inside the pool instead of being handed in
/// from outside and waited for: about 0.07 ms a call, a fifth of a round at T = 0
/// (`docs/drafter.md`). Where no pool can be made, `f` runs here.
fn in_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    match rayon::ThreadPoolBuilder::new().build() {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}

fn main() -> ExitCode {
    // `--version` names the backend used and those compiled in.
    let version: &'static str = Box::leak(backend::version().into_boxed_str());
    let cli = match Cli::from_arg_matches(&Cli::command().version(version).get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match &cli.command {
        Command::Generate(a) => in_pool(|| generate::run(a)),
        Command::Inspect(a) => inspect::run(a),
        Command::BenchForward(a) => bench_forward::run(a),
        Command::BenchDrafter(a) => bench_drafter::run(a),
        Command::Collect(a) => collect::run(a),
        Command::TrainDrafter(a) => train_drafter::run(a),
        Command::EvalDrafter(a) => eval_drafter::run(a),
        Command::Replay(a) => replay::run(a),
        Command::CalibrateSpiffy(a) => calibrate::run(a),
        Command::CalibrateTokens(a) => calibrate::run_tokens(a),
        Command::CalibrateOrder(a) => calibrate::run_order(a),
        Command::CalibrateSets(a) => calibrate::run_sets(a),
        Command::TrainSets(a) => train_sets::run(a),
        Command::Bench(a) => in_pool(|| bench::run(a)),
        Command::Serve(a) => serve::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
