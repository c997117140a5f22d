//! Every loader under hostile input (issue 19): at least 10,000 damaged inputs per loader per
//! run (`SPOT_HOSTILE_CASES` overrides), made from small seed files by truncations, bit flips,
//! lying lengths, type swaps, huge and negative numbers, deep nesting and invalid UTF-8. Each
//! input must load or give a typed error: no panic, no hang (a time cap per case), and no
//! allocation past the caps of the counting allocator ([`alloc`]), so a size read from a file
//! and trusted before it is checked fails the test. `CARGO_TARGET_TMPDIR/hostile-*.md` holds
//! each loader's tally (also printed with `--nocapture`).
//!
//! The server's HTTP requests are the same kind of input: [`requests`] sends at least 10,000
//! damaged requests (bodies, headers, framing, stalls) to a running `spot_serve::Server` and
//! tallies its answers in `hostile-requests.md`.
//!
//! Not covered here: `spot bench` has no resume files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod alloc;
mod harness;
mod mutate;
mod requests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use harness::{Outcome, Seed, kind, run};
use mutate::Format;
use spot_dlm::sets::SetsDrafter;
use spot_dlm::sets::net::{SetsNet, SetsNetConfig};
use spot_drafter::{SpiffyGraph, checkpoint};
use spot_models::chat::ChatTemplate;
use spot_models::hf::Tokenizer;
use spot_models::{CausalLm, CpuBackend, DiffusionModel};
use spot_specdiff::MaskedDrafter;
use spot_train::Trajectory;
use spot_train::TrajectoryDir;

#[global_allocator]
static ALLOC: alloc::Capped = alloc::Capped;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    root().join("crates/spot-models/tests/fixtures").join(name)
}

/// A fresh, empty working folder: `CARGO_TARGET_TMPDIR/hostile-work/N`, numbered per process
/// (a later run reuses the names, so runs do not pile up folders).
fn scratch() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hostile-work")
        .join(NEXT.fetch_add(1, Ordering::Relaxed).to_string());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fresh working folder holding copies of `files` from `from`.
fn workdir(from: &Path, files: &[&str]) -> PathBuf {
    let dir = scratch();
    for f in files {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    dir
}

/// The suite itself: a loader that trusts a length from its file, and one that panics, are
/// caught (so a passing run means something).
#[test]
fn the_suite_catches_trusted_lengths_and_panics() {
    let dir = scratch();
    std::fs::write(dir.join("n.json"), r#"{"n": 1000, "list": [1, 2, 3]}"#).unwrap();
    let seed = |load| Seed {
        dir: dir.clone(),
        file: "n.json".into(),
        format: Format::Json,
        load,
    };
    let trusting: harness::LoadFn = |d| {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("n.json")).map_err(kind)?)
                .map_err(kind)?;
        let n = v["n"].as_u64().ok_or("no n")? as usize;
        // What an unchecked length does (bounded here so that the process survives it).
        let buf = vec![1u8; n.min(alloc::SINGLE_CAP * 2)];
        std::hint::black_box(&buf);
        Ok(())
    };
    let (_, failures) = harness::check("self-test trusted length", vec![seed(trusting)], 400);
    assert!(
        failures.iter().any(|f| f.contains("allocated")),
        "{failures:?}"
    );
    let panicking: harness::LoadFn = |d| {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("n.json")).map_err(kind)?)
                .map_err(kind)?;
        let list = v["list"].as_array().ok_or("no list")?;
        std::hint::black_box(list[2].as_u64());
        Ok(())
    };
    let (_, failures) = harness::check("self-test panic", vec![seed(panicking)], 400);
    assert!(
        failures.iter().any(|f| f.contains("panicked")),
        "{failures:?}"
    );
}

const FOLDER: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
];

const DIFFUSION: &[&str] = &["sdar-tiny", "llada-tiny", "dream-tiny", "llada2-moe-tiny"];
const CAUSAL: &[&str] = &["llama-tiny", "qwen2-tiny"];

fn diffusion(dir: &Path) -> Outcome {
    DiffusionModel::<CpuBackend>::load(dir, &Default::default())
        .map(drop)
        .map_err(kind)
}

fn causal(dir: &Path) -> Outcome {
    CausalLm::<CpuBackend>::load(dir, &Default::default())
        .map(drop)
        .map_err(kind)
}

/// Seeds damaging `file` of every model fixture in `families`.
fn folder_seeds(families: &[&str], file: &str, format: Format) -> Vec<Seed> {
    families
        .iter()
        .map(|f| Seed {
            dir: workdir(&fixture(f), FOLDER),
            file: file.into(),
            format,
            load: if CAUSAL.contains(f) {
                causal
            } else {
                diffusion
            },
        })
        .collect()
}

fn all_families() -> Vec<&'static str> {
    DIFFUSION.iter().chain(CAUSAL).copied().collect()
}

#[test]
fn config_json() {
    run(
        "config.json",
        folder_seeds(&all_families(), "config.json", Format::Json),
    );
}

#[test]
fn generation_config_json() {
    run(
        "generation_config.json",
        folder_seeds(&all_families(), "generation_config.json", Format::Json),
    );
}

#[test]
fn safetensors() {
    let mut seeds = folder_seeds(
        &["sdar-tiny", "llama-tiny"],
        "model.safetensors",
        Format::Safetensors,
    );
    // bf16 weights too: other element sizes, other conversions.
    seeds.push(Seed {
        dir: workdir(&fixture("sdar-tiny-bf16"), FOLDER),
        file: "model.safetensors".into(),
        format: Format::Safetensors,
        load: diffusion,
    });
    run("model.safetensors", seeds);
}

/// `model.safetensors.index.json` over two shards.
#[test]
fn sharded_index() {
    let from = fixture("sdar-tiny");
    let dir = workdir(
        &from,
        &["config.json", "generation_config.json", "tokenizer.json"],
    );
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let h = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + h]).unwrap();
    let names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    // Two shards: each a full copy (a shard may hold more than the index maps to it).
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    for s in shards {
        std::fs::write(dir.join(s), &bytes).unwrap();
    }
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ((*n).clone(), shards[i % 2].into()))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": bytes.len()}, "weight_map": map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    run(
        "model.safetensors.index.json",
        vec![Seed {
            dir,
            file: "model.safetensors.index.json".into(),
            format: Format::Json,
            load: diffusion,
        }],
    );
}

fn tokenizer(dir: &Path) -> Outcome {
    let t = Tokenizer::open(dir).map_err(kind)?;
    let ids = t
        .encode("def add(a, b):\n    return a + b  # ünïcode")
        .map_err(kind)?;
    t.decode(&ids).map_err(kind)?;
    Ok(())
}

#[test]
fn tokenizer_json() {
    let seeds = ["sdar-tiny", "llama-tiny"]
        .iter()
        .map(|f| Seed {
            dir: workdir(&fixture(f), &["tokenizer.json"]),
            file: "tokenizer.json".into(),
            format: Format::Json,
            load: tokenizer,
        })
        .collect();
    run("tokenizer.json", seeds);
}

fn chat(dir: &Path) -> Outcome {
    let t = ChatTemplate::from_dir(dir).map_err(kind)?;
    t.prompt(Some("You are terse."), "Add 2 and 3.")
        .map_err(kind)?;
    Ok(())
}

/// Every family's chat template (the committed oracle's), as `tokenizer_config.json` and as
/// `chat_template.jinja`.
#[test]
fn chat_templates() {
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("chat_templates.json")).unwrap()).unwrap();
    let mut seeds = Vec::new();
    for t in oracle["templates"].as_array().unwrap() {
        let cfg = serde_json::json!({
            "chat_template": t["template"],
            "bos_token": t["bos_token"],
            "eos_token": t["eos_token"],
        });
        let dir = scratch();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::to_vec(&cfg).unwrap(),
        )
        .unwrap();
        seeds.push(Seed {
            dir,
            file: "tokenizer_config.json".into(),
            format: Format::Json,
            load: chat,
        });
        let dir = scratch();
        let tokens = serde_json::json!({"bos_token": t["bos_token"], "eos_token": t["eos_token"]});
        std::fs::write(dir.join("tokenizer_config.json"), tokens.to_string()).unwrap();
        std::fs::write(
            dir.join("chat_template.jinja"),
            t["template"].as_str().unwrap(),
        )
        .unwrap();
        seeds.push(Seed {
            dir,
            file: "chat_template.jinja".into(),
            format: Format::Bytes,
            load: chat,
        });
    }
    run("chat template", seeds);
}

fn order_drafter(dir: &Path) -> Outcome {
    checkpoint::load::<CpuBackend>(&dir.join("drafter.safetensors"), &Default::default())
        .map(drop)
        .map_err(kind)
}

/// Order-drafter checkpoints of both layouts: layout 1 (the committed fixture) and layout 2
/// (the same network saved by this version).
fn drafter_seeds(file: &str, format: Format) -> Vec<Seed> {
    let data = root().join("crates/spot-train/tests/data");
    let v1 = scratch();
    std::fs::copy(
        data.join("drafter-v1.safetensors"),
        v1.join("drafter.safetensors"),
    )
    .unwrap();
    std::fs::copy(data.join("drafter-v1.json"), v1.join("drafter.json")).unwrap();
    let net = checkpoint::load::<CpuBackend>(&v1.join("drafter.safetensors"), &Default::default())
        .unwrap();
    let v2 = scratch();
    checkpoint::save(&net, &v2.join("drafter.safetensors")).unwrap();
    [v1, v2]
        .into_iter()
        .map(|dir| Seed {
            dir,
            file: file.into(),
            format,
            load: order_drafter,
        })
        .collect()
}

#[test]
fn drafter_weights() {
    run(
        "drafter checkpoint weights",
        drafter_seeds("drafter.safetensors", Format::Safetensors),
    );
}

#[test]
fn drafter_config() {
    run(
        "drafter checkpoint config",
        drafter_seeds("drafter.json", Format::Json),
    );
}

fn shipped_seed(file: &str, load: harness::LoadFn) -> Vec<Seed> {
    vec![Seed {
        dir: workdir(&root().join("models/sdar-tiny-code"), &[file]),
        file: file.into(),
        format: Format::Json,
        load,
    }]
}

#[test]
fn spiffy_graph() {
    run(
        "Spiffy graph",
        shipped_seed("spiffy-graph.json", |d| {
            SpiffyGraph::load(&d.join("spiffy-graph.json"))
                .map(drop)
                .map_err(kind)
        }),
    );
}

#[test]
fn sets_tables() {
    run(
        "SPOT-Sets tables",
        shipped_seed("spot-sets.json", |d| {
            SetsDrafter::load(&d.join("spot-sets.json"))
                .map(drop)
                .map_err(kind)
        }),
    );
}

/// The learned set drafter (a small one: the shipped one is 1.4 MB of JSON).
#[test]
fn sets_network() {
    let dir = scratch();
    SetsNet::init(SetsNetConfig::new(16), 3)
        .save(&dir.join("spot-sets-net.json"))
        .unwrap();
    run(
        "SPOT-Sets network",
        vec![Seed {
            dir,
            file: "spot-sets-net.json".into(),
            format: Format::Json,
            load: |d| {
                SetsNet::load(&d.join("spot-sets-net.json"))
                    .map(drop)
                    .map_err(kind)
            },
        }],
    );
}

/// The SpecDiff-2 drafter folder's drafter file (over the llama-tiny fixture).
#[test]
fn specdiff_drafter() {
    let dir = workdir(&fixture("llama-tiny"), FOLDER);
    std::fs::write(
        dir.join(spot_specdiff::DRAFTER_FILE),
        r#"{"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": 3, "description": "tiny"}"#,
    )
    .unwrap();
    run(
        "SpecDiff-2 drafter file",
        vec![Seed {
            dir,
            file: spot_specdiff::DRAFTER_FILE.into(),
            format: Format::Json,
            load: |d| {
                MaskedDrafter::<CpuBackend>::load(d, &Default::default())
                    .map(drop)
                    .map_err(kind)
            },
        }],
    );
}

/// A SpecDiff-2 lookup store (one continuation, as `spot generate --json` writes it).
#[test]
fn lookup_store() {
    let dir = scratch();
    let ids = |from: u32, n: u32| (from..from + n).map(|i| i % 50).collect::<Vec<_>>();
    std::fs::write(
        dir.join("specdiff-lookup.jsonl"),
        format!(
            "{{\"id\": \"line 1\", \"prompt_ids\": {:?}, \"tokens\": {:?}, \"nfe\": 60}}\n",
            ids(3, 20),
            ids(7, 60)
        ),
    )
    .unwrap();
    run(
        "SpecDiff-2 lookup store",
        vec![Seed {
            dir,
            file: "specdiff-lookup.jsonl".into(),
            format: Format::Json,
            load: |d| {
                spot_specdiff::LookupStore::open(&d.join("specdiff-lookup.jsonl"), 64)
                    .map(drop)
                    .map_err(kind)
            },
        }],
    );
}

/// The MRP baseline's module for the sdar-tiny fixture (its layer 0 and norms renamed, a small
/// fusion matrix), next to the fixture's own files.
fn mrp_seed(file: &str, format: Format) -> Vec<Seed> {
    let dir = workdir(&fixture("sdar-tiny"), FOLDER);
    let w = spot_models::hf::Weights::open(&dir).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, values: Vec<f32>| {
        tensors.push((
            name,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    };
    for (part, shape) in [
        ("input_layernorm", vec![64]),
        ("self_attn.q_proj", vec![64, 64]),
        ("self_attn.k_proj", vec![32, 64]),
        ("self_attn.v_proj", vec![32, 64]),
        ("self_attn.o_proj", vec![64, 64]),
        ("self_attn.q_norm", vec![16]),
        ("self_attn.k_norm", vec![16]),
        ("post_attention_layernorm", vec![64]),
        ("mlp.gate_proj", vec![128, 64]),
        ("mlp.up_proj", vec![128, 64]),
        ("mlp.down_proj", vec![64, 128]),
    ] {
        let v = w
            .load_f32(&format!("model.layers.0.{part}.weight"), &shape)
            .unwrap();
        put(format!("mrp.layers.0.{part}.weight"), shape, v);
    }
    let norm = w.load_f32("model.norm.weight", &[64]).unwrap();
    for n in ["enorm", "hnorm", "norm"] {
        put(format!("mrp.{n}.weight"), vec![64], norm.clone());
    }
    let eh: Vec<f32> = (0..64 * 128)
        .map(|i| 0.01 * (i % 7) as f32 - 0.03)
        .collect();
    put("mrp.eh_proj.weight".into(), vec![64, 128], eh);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap();
            (n.clone(), view)
        })
        .collect();
    std::fs::write(
        dir.join("mrp.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join(spot_drafter::mrp::DEFAULT_MRP),
        r#"{"format": "spot-mrp", "version": 1, "layers": 1, "parameters": 57536, "description": "tiny"}"#,
    )
    .unwrap();
    let load: harness::LoadFn = |d| {
        spot_drafter::mrp::Mrp::<CpuBackend>::load(
            d,
            &d.join(spot_drafter::mrp::DEFAULT_MRP),
            &Default::default(),
        )
        .map(drop)
        .map_err(kind)
    };
    assert!(load(&dir).is_ok(), "the seed loads");
    vec![Seed {
        dir,
        file: file.into(),
        format,
        load,
    }]
}

#[test]
fn mrp_module_file() {
    run(
        "MRP module file",
        mrp_seed(spot_drafter::mrp::DEFAULT_MRP, Format::Json),
    );
}

#[test]
fn mrp_module_weights() {
    run(
        "MRP module weights",
        mrp_seed("mrp.safetensors", Format::Safetensors),
    );
}

/// A trajectory directory: one recorded sample and its manifest.
fn trajectory_dir() -> PathBuf {
    use spot_core::toy::{ToyConfig, ToyModel};
    let cfg = spot_core::DecodeConfig {
        block_size: 8,
        max_new_tokens: 16,
        temperature: 1.0,
        early_stop: false,
        ..Default::default()
    };
    let mut m = ToyModel::new(ToyConfig {
        vocab_size: 64,
        mask_id: 63,
        ..ToyConfig::default()
    });
    let (_, t) = spot_train::record(&mut m, &[3, 4, 5], &cfg, "p").unwrap();
    let dir = scratch();
    let manifest = spot_train::Manifest::for_decode("toy", "p.jsonl", "prompt", &cfg);
    let d = TrajectoryDir::create_or_resume(&dir, manifest).unwrap();
    d.write(0, &t).unwrap();
    dir
}

#[test]
fn trajectories() {
    run(
        "trajectory file",
        vec![Seed {
            dir: trajectory_dir(),
            file: "samples/000000.trj".into(),
            format: Format::Bytes,
            load: |d| {
                Trajectory::read(&d.join("samples/000000.trj"))
                    .map(drop)
                    .map_err(kind)
            },
        }],
    );
}

#[test]
fn trajectory_manifest() {
    run(
        "trajectory manifest",
        vec![Seed {
            dir: trajectory_dir(),
            file: "manifest.json".into(),
            format: Format::Json,
            load: |d| {
                TrajectoryDir::open(d)
                    .and_then(|t| t.read_all())
                    .map(drop)
                    .map_err(kind)
            },
        }],
    );
}
