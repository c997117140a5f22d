//! The decoding methods by name: one registry that the `spot` CLI, `spot serve` and any program
//! embedding them share.
//!
//! A [`Method`] names a decoder (`df`, `threshold`, the speculative baselines, SPOT and its
//! variants, SPOT-Sets, the oracles, SpecDiff-2) and says what it needs: [`DraftFiles::needed`]
//! lists the drafter files it reads in a model folder, [`Drafters::load`] loads them once
//! (an absent or damaged file is a [`MethodError`] naming it and how to make it), and
//! [`strategy`] builds the decoder that completes a [`Request`] for one prompt. Every method
//! but `threshold` (a decoder of its own) and the lossy `sets-max` returns exactly the
//! draft-free tokens.
//!
//! ```no_run
//! use spot_dlm::{BlockDiffusionModel, DecodeConfig, Request, run_request};
//! use spot_methods::{DraftFiles, Drafters, Method, Settings, strategy};
//! use spot_models::{CpuBackend, DiffusionModel};
//!
//! let dir = std::path::Path::new("models/sdar-tiny-code");
//! let mut model = DiffusionModel::<CpuBackend>::load(dir, &Default::default())?;
//! let method = Method::parse("spot")?;
//! let drafters =
//!     Drafters::<CpuBackend>::load(&[method], &DraftFiles::in_folder(dir), &Default::default())?;
//! let cfg = DecodeConfig::for_model(model.info());
//! let prompt = [1, 2, 3];
//! let mut s = strategy(method, Settings::default(), &drafters, &mut model, (&prompt, &cfg), None)?;
//! let request = Request::new(&prompt, &cfg, model.info(), &mut s)?;
//! let out = run_request(&mut model, request, &mut ())?;
//! println!("{} tokens in {} forwards", out.tokens.len(), out.stats.work.nfe);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::backend::Backend;
use spot_dlm::sets::{SetsDrafter, SetsNet};
use spot_dlm::{
    BlockDiffusionModel, BlockEnds, BlockObserver, DecodeConfig, DecodeOutput, DecodeTrace,
    DraftFreeDecoder, MatchRule, OracleScorer, Request, SetTreeConfig, SpotDecoder, SpotReport,
    StaleConfidenceScorer, StaleThresholdJoin, Strategy, TokenOracleScorer, run_request,
};
use spot_drafter::mrp::{DEFAULT_MRP, Mrp, MrpScorer, MrpTokens};
use spot_drafter::{
    Calibrated, LearnedScorer, OrderModel, SpiffyGraph, SpiffyScorer, TokenCalibration,
};

mod error;
pub use error::MethodError;
pub use spot_dlm::Expand;
pub use spot_drafter::Precision;
pub use spot_drafter::mrp::ModuleHead;

/// Result of this crate.
pub type Result<T, E = MethodError> = std::result::Result<T, E>;

/// File name of a model folder's default drafter checkpoint.
pub const DEFAULT_DRAFTER: &str = "spot-drafter.safetensors";
/// File name of a model folder's default Spiffy graph (`spot calibrate-spiffy`).
pub const DEFAULT_SPIFFY: &str = "spiffy-graph.json";
pub use spot_dlm::sets::net::DEFAULT_SETS_NET;
pub use spot_dlm::sets::tables::DEFAULT_SETS;

/// The order network's arithmetic when none is asked for: int8 products. On the benchmark
/// prompts (30 HumanEval and 30 GSM8K-test prompts at D = 8, 10 + 10 at D = 20; T = 0 and 1)
/// it drafts 1.2-1.9x faster than f32 for between 0.2% fewer and 0.5% more forwards per
/// prompt (`docs/benchmarks.md`); `Precision::F32` is the network as trained.
pub const DEFAULT_DRAFTER_PRECISION: Precision = Precision::Int8;

/// The depth below which `spot-reuse` stops calling its network.
pub const REUSE_BELOW: usize = 1;

/// Decoding methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Method {
    /// Draft-free exact decoding (one commit per forward): the ground truth.
    Df,
    /// Draft-free threshold decoding (Fast-dLLM); lossy w.r.t. `df`, a decoder of its own.
    Threshold,
    /// Speculative: SSD-style chain by stale confidence.
    Ssd,
    /// Speculative: BlockSpec-style best-first tree ranked by stale confidence.
    Blockspec,
    /// Speculative: Spiffy-style static graph over confidence ranks (`--spiffy`, default
    /// `MODEL/spiffy-graph.json`).
    Spiffy,
    /// Speculative: SPOT's learned commit-order drafter (`--drafter`, default
    /// `MODEL/spot-drafter.safetensors`).
    Spot,
    /// SPOT with the mass floor γ (`--spot-gamma`): smaller batches when the drafter is unsure.
    SpotGamma,
    /// SPOT with the adaptive mass floor: γ = b / t(1 + D) from the forward times measured so
    /// far (`t(n) = a + b·n`), so a node is drafted only when its mass pays for its share of
    /// the forward.
    SpotAdaptive,
    /// SPOT's learned order with Spiffy's token rule (each position's stale choice at weight
    /// 1, no hedge) instead of the checkpoint's calibrated token weights: the ablation that
    /// separates the order from the token weights.
    SpotUnit,
    /// **Approximate drafting** (the output is still exact): SPOT whose order network scores
    /// only the root and its children; deeper nodes take their parent's order over the
    /// positions still masked ([`spot_drafter::LearnedScorer::reuse_below`]). Fewer network
    /// calls per round, possibly more forwards.
    SpotReuse,
    /// Speculative baseline: MRP (multi-token residual prediction, arXiv 2605.18817), a chain
    /// drafted by a small module that corrects the stale logits from the target's hidden
    /// states (`--mrp`, default `MODEL/mrp.json`; `tools/mrp/train_mrp.py`).
    Mrp,
    /// MRP's module as a tree drafter: every masked position scored by its corrected
    /// probability (BlockSpec's rule on the module's corrected statistics), each with the
    /// module's choice, grown best-first to the budget (`--mrp`).
    MrpTree,
    /// SPOT's learned order (`--drafter`) with MRP's tokens (`--mrp`): each drafted position
    /// takes the module's corrected choice instead of the stale one.
    SpotMrp,
    /// Speculative upper bound: the true future commit positions (from a draft-free pass) with
    /// stale tokens. Its NFE excludes that pass.
    Oracle,
    /// Speculative bound: positions by stale confidence, each with its true token (from a
    /// draft-free pass). Its NFE excludes that pass.
    OracleToken,
    /// Speculative bound: true positions and true tokens (from a draft-free pass). Its NFE
    /// excludes that pass.
    OracleJoint,
    /// SPOT-Sets: set-valued trees, one edge per threshold step, drafted by the calibrated
    /// join tables (`--sets`, default `MODEL/spot-sets.json`; `spot calibrate-sets`), with
    /// SPOT's order drafter (`--drafter`) ranking the single commit of a step where no
    /// position clears the threshold.
    Sets,
    /// SPOT-Sets with the mass floor γ (`--spot-gamma`).
    SetsGamma,
    /// SPOT-Sets with the adaptive mass floor (see `spot-adaptive`).
    SetsAdaptive,
    /// Training-free set drafter: the stale threshold step, then single commits ranked by
    /// stale confidence.
    SetsStale,
    /// SPOT-Sets with the learned set drafter (`--sets-net`, default
    /// `MODEL/spot-sets-net.json`; `spot train-sets`), a network over the target's hidden
    /// states, instead of the tables; SPOT's order drafter ranks the leaders.
    SetsNet,
    /// **Lossy**: `sets` verified with the product max-commit rule
    /// (`spot_verify::MatchRule::ProductMaxCommit`): the walk also accepts drafted subsets of
    /// the target's threshold step whose confidences multiply to more than `τ`, taking the
    /// node that commits the most. Its output differs from threshold decoding; `spot bench`
    /// reports how often it agrees (the `equal` column) instead of failing.
    SetsMax,
    /// SpecDiff-2, for autoregressive models only: `K` drafts of a drafter (`--drafter DIR`,
    /// a masked-diffusion drafter folder, a lookup store file, or `lookup`, training-free
    /// prompt lookup) verified
    /// in one forward per round; the output equals `df`'s.
    Specdiff,
}

impl Method {
    /// Every method, in the order `spot --help` lists them.
    pub const ALL: [Method; 23] = [
        Method::Df,
        Method::Threshold,
        Method::Ssd,
        Method::Blockspec,
        Method::Spiffy,
        Method::Spot,
        Method::SpotGamma,
        Method::SpotAdaptive,
        Method::SpotUnit,
        Method::SpotReuse,
        Method::Mrp,
        Method::MrpTree,
        Method::SpotMrp,
        Method::Oracle,
        Method::OracleToken,
        Method::OracleJoint,
        Method::Sets,
        Method::SetsGamma,
        Method::SetsAdaptive,
        Method::SetsStale,
        Method::SetsNet,
        Method::SetsMax,
        Method::Specdiff,
    ];

    /// The method named `name` (its command-line spelling, ASCII case ignored).
    ///
    /// ```
    /// use spot_methods::Method;
    /// assert_eq!(Method::parse("SPOT-gamma").unwrap(), Method::SpotGamma);
    /// assert!(Method::parse("nope").unwrap_err().to_string().contains("one of df, threshold"));
    /// ```
    pub fn parse(name: &str) -> Result<Method> {
        Method::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| MethodError::Unknown {
                name: name.to_string(),
                known: Method::ALL.map(Method::name).join(", "),
            })
    }

    /// Whether the method decodes autoregressive targets (SpecDiff-2) rather than
    /// block-diffusion ones (every other method).
    pub fn is_autoregressive(self) -> bool {
        self == Method::Specdiff
    }

    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Method::Df => "df",
            Method::Threshold => "threshold",
            Method::Ssd => "ssd",
            Method::Blockspec => "blockspec",
            Method::Spiffy => "spiffy",
            Method::Spot => "spot",
            Method::SpotGamma => "spot-gamma",
            Method::SpotAdaptive => "spot-adaptive",
            Method::SpotUnit => "spot-unit",
            Method::SpotReuse => "spot-reuse",
            Method::Mrp => "mrp",
            Method::MrpTree => "mrp-tree",
            Method::SpotMrp => "spot-mrp",
            Method::Oracle => "oracle",
            Method::OracleToken => "oracle-token",
            Method::OracleJoint => "oracle-joint",
            Method::Sets => "sets",
            Method::SetsGamma => "sets-gamma",
            Method::SetsAdaptive => "sets-adaptive",
            Method::SetsStale => "sets-stale",
            Method::SetsNet => "sets-net",
            Method::SetsMax => "sets-max",
            Method::Specdiff => "specdiff",
        }
    }

    /// Whether the method drafts a tree of single commits through the best-first builder, so
    /// that [`Settings::expand`] applies to it (not the chain of `ssd`, not the set trees).
    pub fn builds_commit_tree(self) -> bool {
        self.is_speculative() && !self.is_sets() && !matches!(self, Method::Ssd | Method::Specdiff)
    }

    /// Whether the method drafts with SPOT's order network (`--drafter`), so that
    /// [`Settings::drafter_precision`] applies to it.
    pub fn drafts_with_order_network(self) -> bool {
        matches!(
            self,
            Method::Spot
                | Method::SpotGamma
                | Method::SpotUnit
                | Method::SpotMrp
                | Method::SpotAdaptive
                | Method::SpotReuse
                | Method::Sets
                | Method::SetsGamma
                | Method::SetsAdaptive
                | Method::SetsNet
                | Method::SetsMax
        )
    }

    /// Whether the method drafts and verifies (and so takes a budget).
    pub fn is_speculative(self) -> bool {
        !matches!(self, Method::Df | Method::Threshold)
    }

    /// Whether the method drafts set-valued trees (SPOT-Sets).
    pub fn is_sets(self) -> bool {
        matches!(
            self,
            Method::Sets
                | Method::SetsGamma
                | Method::SetsAdaptive
                | Method::SetsStale
                | Method::SetsNet
                | Method::SetsMax
        )
    }

    /// Whether the method's output may differ from its reference by design (`sets-max`).
    pub fn is_lossy(self) -> bool {
        self == Method::SetsMax
    }

    /// Whether the method reads the draft-free trace (the oracles).
    pub fn is_oracle(self) -> bool {
        matches!(
            self,
            Method::Oracle | Method::OracleToken | Method::OracleJoint
        )
    }
}

/// Draft settings of the speculative methods. The default is the CLI's: `D` 8, no mass floor
/// (0.02 for `spot-gamma`), both block-end designs on.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Budget D.
    pub budget: usize,
    /// Mass floor for every speculative method except `spot-gamma`.
    pub gamma: f32,
    /// Mass floor of `spot-gamma`.
    pub spot_gamma: f32,
    /// Block-end designs of every speculative method.
    pub block_ends: BlockEnds,
    /// The arithmetic of SPOT's learned drafters on the host: the order network (every
    /// method that drafts with it) and the token module that writes SPOT's tokens where the
    /// checkpoint asks for it (the MRP baseline itself steps in `f32`).
    pub drafter_precision: Precision,
    /// How the token module chooses the tokens it writes for SPOT: among the stale top list
    /// (default) or over the whole vocabulary (the module's exact choice).
    pub module_head: ModuleHead,
    /// Which nodes each call of a tree's scorer takes (every tree-drafting method).
    pub expand: Expand,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            budget: 8,
            gamma: 0.0,
            spot_gamma: 0.02,
            block_ends: BlockEnds::default(),
            drafter_precision: DEFAULT_DRAFTER_PRECISION,
            module_head: ModuleHead::default(),
            expand: Expand::default(),
        }
    }
}

/// Where the drafter files of a model folder are: `--drafter` / `--spiffy` when given, else
/// `DIR/spot-drafter.safetensors` and `DIR/spiffy-graph.json`.
#[derive(Clone, Copy, Debug)]
pub struct DraftFiles<'a> {
    /// The model folder.
    pub dir: &'a Path,
    /// `--drafter`.
    pub drafter: Option<&'a Path>,
    /// `--spiffy`.
    pub spiffy: Option<&'a Path>,
    /// `--sets`.
    pub sets: Option<&'a Path>,
    /// `--sets-net`.
    pub sets_net: Option<&'a Path>,
    /// `--mrp`.
    pub mrp: Option<&'a Path>,
    /// Whether `blockspec` and `spiffy` take the drafter checkpoint's token calibration (when
    /// it exists; `--uncalibrated-baselines` turns it off).
    pub calibrate_baselines: bool,
}

impl<'a> DraftFiles<'a> {
    /// Every file at its default name in the model folder `dir`, the baselines calibrated.
    pub fn in_folder(dir: &'a Path) -> Self {
        DraftFiles {
            dir,
            drafter: None,
            spiffy: None,
            sets: None,
            sets_net: None,
            mrp: None,
            calibrate_baselines: true,
        }
    }

    /// The files `method` reads: the drafter checkpoint (weights, then its `.json`) of `spot`
    /// and `spot-gamma`, the graph of `spiffy`; none for the other methods.
    pub fn needed(&self, method: Method) -> Vec<PathBuf> {
        let path = |given: Option<&Path>, name: &str| -> PathBuf {
            given.map_or_else(|| self.dir.join(name), Path::to_path_buf)
        };
        match method {
            Method::Spot
            | Method::SpotGamma
            | Method::SpotAdaptive
            | Method::SpotUnit
            | Method::SpotReuse => {
                let weights = path(self.drafter, DEFAULT_DRAFTER);
                let config = spot_drafter::checkpoint::config_path(&weights);
                vec![weights, config]
            }
            Method::Spiffy => vec![path(self.spiffy, DEFAULT_SPIFFY)],
            Method::Sets | Method::SetsGamma | Method::SetsAdaptive | Method::SetsMax => {
                let weights = path(self.drafter, DEFAULT_DRAFTER);
                let config = spot_drafter::checkpoint::config_path(&weights);
                vec![path(self.sets, DEFAULT_SETS), weights, config]
            }
            Method::SetsNet => {
                let weights = path(self.drafter, DEFAULT_DRAFTER);
                let config = spot_drafter::checkpoint::config_path(&weights);
                vec![path(self.sets_net, DEFAULT_SETS_NET), weights, config]
            }
            Method::Mrp | Method::MrpTree | Method::SpotMrp => {
                let file = path(self.mrp, DEFAULT_MRP);
                let weights = spot_drafter::mrp::mrp_weights_path(&file);
                let mut v = vec![file, weights];
                if method == Method::SpotMrp {
                    let drafter = path(self.drafter, DEFAULT_DRAFTER);
                    let config = spot_drafter::checkpoint::config_path(&drafter);
                    v.extend([drafter, config]);
                }
                v
            }
            _ => Vec::new(),
        }
    }

    /// Whether the file of `method` was given on the command line (`--drafter`, `--spiffy`).
    pub fn given(&self, method: Method) -> bool {
        match method {
            Method::Spot
            | Method::SpotGamma
            | Method::SpotAdaptive
            | Method::SpotUnit
            | Method::SpotReuse => self.drafter.is_some(),
            Method::Spiffy => self.spiffy.is_some(),
            Method::Sets | Method::SetsGamma | Method::SetsAdaptive | Method::SetsMax => {
                self.sets.is_some() || self.drafter.is_some()
            }
            Method::SetsNet => self.sets_net.is_some() || self.drafter.is_some(),
            Method::Mrp | Method::MrpTree => self.mrp.is_some(),
            Method::SpotMrp => self.mrp.is_some() || self.drafter.is_some(),
            _ => false,
        }
    }

    /// Why `method` cannot run, when a file it needs does not exist: e.g.
    /// `no spot-drafter.safetensors, spot-drafter.json in DIR`.
    pub fn missing(&self, method: Method) -> Option<String> {
        let absent: Vec<PathBuf> = self
            .needed(method)
            .into_iter()
            .filter(|p| !p.is_file())
            .collect();
        let parent = absent
            .first()?
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let names: Vec<String> = absent
            .iter()
            .map(|p| {
                p.file_name()
                    .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
            })
            .collect();
        Some(format!("no {} in {}", names.join(", "), parent.display()))
    }
}

/// How to make the file `method` is missing.
pub fn missing_hint(method: Method) -> &'static str {
    match method {
        Method::Spiffy => "calibrate a graph with `spot calibrate-spiffy`, or pass --spiffy PATH",
        Method::Sets | Method::SetsGamma | Method::SetsAdaptive | Method::SetsMax => {
            "fit the tables with `spot calibrate-sets`, or pass --sets PATH"
        }
        Method::SetsNet => "train the set drafter with `spot train-sets`, or pass --sets-net PATH",
        Method::Mrp | Method::MrpTree | Method::SpotMrp => {
            "train the module with tools/mrp/train_mrp.py (and a drafter for spot-mrp), or pass --mrp PATH"
        }
        _ => "train a drafter with `spot train-drafter`, or pass --drafter PATH",
    }
}

/// The drafters the chosen methods need, loaded once.
pub struct Drafters<B: Backend> {
    net: Option<OrderModel<B>>,
    spiffy: Option<SpiffyGraph>,
    sets: Option<SetsDrafter>,
    sets_net: Option<SetsNet>,
    mrp: Option<Arc<Mrp<B>>>,
    /// Token calibrations for the baselines (empty: their papers' token weights).
    calibration: Vec<TokenCalibration>,
}

impl<B: Backend> Drafters<B> {
    /// The drafter network, when loaded.
    pub fn net(&self) -> Option<&OrderModel<B>> {
        self.net.as_ref()
    }

    /// The Spiffy graph, when loaded.
    pub fn spiffy(&self) -> Option<&SpiffyGraph> {
        self.spiffy.as_ref()
    }

    /// The baselines' token calibrations (empty: their papers' token weights).
    pub fn calibration(&self) -> &[TokenCalibration] {
        &self.calibration
    }

    /// Loads what `methods` need (see [`DraftFiles::needed`]) for decodes at any temperature
    /// (a server's requests choose their own); a missing file is an error naming it.
    pub fn load(methods: &[Method], files: &DraftFiles<'_>, device: &B::Device) -> Result<Self> {
        Self::load_for(methods, files, None, device)
    }

    /// [`Drafters::load`] for decodes at `temperatures` only: SPOT's token module
    /// (`spot_drafter::module_tokens`) is loaded only when the checkpoint enables it at one of
    /// them, so an empty list never loads it (`spot replay`, which cannot run the module).
    pub fn load_at(
        methods: &[Method],
        files: &DraftFiles<'_>,
        temperatures: &[f32],
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_for(methods, files, Some(temperatures), device)
    }

    fn load_for(
        methods: &[Method],
        files: &DraftFiles<'_>,
        temperatures: Option<&[f32]>,
        device: &B::Device,
    ) -> Result<Self> {
        let mut d = Drafters {
            net: None,
            spiffy: None,
            sets: None,
            sets_net: None,
            mrp: None,
            calibration: Vec::new(),
        };
        for &m in methods {
            if let Some(why) = files.missing(m) {
                return Err(MethodError::Missing {
                    method: m.name(),
                    why,
                    hint: missing_hint(m),
                });
            }
        }
        let first = |m: Method| files.needed(m).into_iter().next();
        if let Some(p) = methods
            .iter()
            .any(|m| m.drafts_with_order_network())
            .then(|| first(Method::Spot))
            .flatten()
        {
            d.net = Some(
                spot_drafter::checkpoint::load::<B>(&p, device)
                    .map_err(|e| MethodError::load("drafter", &p, e))?,
            );
        }
        let baseline = methods
            .iter()
            .any(|m| matches!(m, Method::Blockspec | Method::Spiffy));
        // The drafter checkpoint's weights path, then its JSON (see `DraftFiles::needed`).
        let drafter = files.needed(Method::Spot);
        if let [weights, json] = drafter.as_slice()
            && baseline
            && files.calibrate_baselines
            && json.is_file()
        {
            let cfg = spot_drafter::checkpoint::load_config(weights)
                .map_err(|e| MethodError::load("the baselines' token calibration", json, e))?;
            d.calibration = cfg.token_calibration_by_temperature;
            d.calibration.extend(cfg.token_calibration);
        }
        if let Some(p) = first(Method::Spiffy).filter(|_| methods.contains(&Method::Spiffy)) {
            d.spiffy =
                Some(SpiffyGraph::load(&p).map_err(|e| MethodError::load("Spiffy graph", &p, e))?);
        }
        if let Some(p) = methods
            .iter()
            .find(|m| {
                matches!(
                    m,
                    Method::Sets | Method::SetsGamma | Method::SetsAdaptive | Method::SetsMax
                )
            })
            .and_then(|&m| first(m))
        {
            d.sets =
                Some(SetsDrafter::load(&p).map_err(|e| MethodError::load("set drafter", &p, e))?);
        }
        if let Some(p) = first(Method::SetsNet).filter(|_| methods.contains(&Method::SetsNet)) {
            d.sets_net =
                Some(SetsNet::load(&p).map_err(|e| MethodError::load("set network", &p, e))?);
        }
        // SPOT takes the token module's tokens where its checkpoint says so and the module is
        // there (`spot_drafter::module_tokens`); without it SPOT drafts stale tokens.
        let spot_module = methods.iter().any(|m| {
            matches!(
                m,
                Method::Spot | Method::SpotGamma | Method::SpotAdaptive | Method::SpotReuse
            )
        }) && d.net.as_ref().is_some_and(|n| {
            let cfg = n.config();
            match temperatures {
                None => cfg.module_tokens_by_temperature.iter().any(|m| m.enabled),
                Some(ts) => ts.iter().any(|&t| cfg.module_tokens_for(t)),
            }
        });
        let module_file = first(Method::Mrp);
        if spot_module && let Some(p) = module_file.as_ref().filter(|p| !p.is_file()) {
            eprintln!(
                "spot: no token module {}: --method spot drafts stale tokens at every temperature",
                p.display()
            );
        }
        if let Some(p) = module_file.filter(|p| {
            let named = methods
                .iter()
                .any(|m| matches!(m, Method::Mrp | Method::MrpTree | Method::SpotMrp));
            named || (spot_module && p.is_file())
        }) {
            d.mrp = Some(Arc::new(
                Mrp::load(files.dir, &p, device)
                    .map_err(|e| MethodError::load("the MRP module", &p, e))?,
            ));
        }
        Ok(d)
    }
}

/// One decode's output, wall time and (speculative methods) diagnostics.
pub struct Run {
    /// Tokens and counters.
    pub out: DecodeOutput,
    /// Seconds for the decode (the oracle's draft-free pass excluded).
    pub wall: f64,
    /// Rounds, drafting time and round ends.
    pub report: Option<SpotReport>,
}

/// The decoder of `method`, ready to complete a [`Request`]. `reference` is a draft-free
/// trace of the same inputs for the oracle (computed here, on `model`, when absent).
pub fn strategy<B: Backend>(
    method: Method,
    settings: Settings,
    drafters: &Drafters<B>,
    model: &mut dyn BlockDiffusionModel,
    (prompt, cfg): (&[u32], &DecodeConfig),
    reference: Option<&DecodeTrace>,
) -> Result<Strategy> {
    let b = SpotDecoder::builder()
        .budget(settings.budget)
        .expand(settings.expand)
        .gamma(settings.gamma)
        .block_ends(settings.block_ends);
    let sets_cfg = |gamma| SetTreeConfig {
        budget: settings.budget,
        gamma,
        ..SetTreeConfig::default()
    };
    let b = match method {
        Method::Df | Method::Threshold => return Ok(Strategy::draft_free()),
        Method::Specdiff => {
            return Err(MethodError::WrongKind {
                method: method.name(),
                kind: "autoregressive",
            });
        }
        Method::SetsStale => b.sets(
            StaleThresholdJoin,
            StaleConfidenceScorer,
            sets_cfg(settings.gamma),
        ),
        Method::Sets | Method::SetsGamma | Method::SetsAdaptive | Method::SetsMax => {
            let Some(d) = &drafters.sets else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "the set drafter tables (--sets)",
                });
            };
            let gamma = if method == Method::SetsGamma {
                settings.spot_gamma
            } else {
                settings.gamma
            };
            let Some(net) = &drafters.net else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "a drafter checkpoint (--drafter)",
                });
            };
            let rule = if method == Method::SetsMax {
                MatchRule::ProductMaxCommit
            } else {
                MatchRule::Coupled
            };
            b.sets(
                d.clone(),
                LearnedScorer::with_precision(net.clone(), settings.drafter_precision),
                sets_cfg(gamma),
            )
            .adaptive_gamma(method == Method::SetsAdaptive)
            .match_rule(rule)
        }
        Method::SetsNet => {
            let (Some(d), Some(net)) = (&drafters.sets_net, &drafters.net) else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "the set network (--sets-net) and a drafter checkpoint (--drafter)",
                });
            };
            b.sets(
                d.clone(),
                LearnedScorer::with_precision(net.clone(), settings.drafter_precision),
                sets_cfg(settings.gamma),
            )
        }
        Method::Ssd => b.chain(),
        Method::Mrp => {
            let Some(m) = &drafters.mrp else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "the MRP module (--mrp)",
                });
            };
            // One child per node: a chain of D drafts, as MRP's speculative mode.
            b.scorer(MrpScorer::new(Arc::clone(m)).with_rule(cfg.confidence, cfg.sample_top_k))
                .max_depth(settings.budget.max(1))
                .hedge(None)
        }
        Method::MrpTree => {
            let Some(m) = &drafters.mrp else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "the MRP module (--mrp)",
                });
            };
            b.scorer(
                MrpScorer::new(Arc::clone(m))
                    .with_rule(cfg.confidence, cfg.sample_top_k)
                    .tree(),
            )
        }
        Method::SpotMrp => {
            let (Some(m), Some(net)) = (&drafters.mrp, &drafters.net) else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "the MRP module (--mrp) and a drafter checkpoint (--drafter)",
                });
            };
            b.scorer(
                MrpTokens::new(
                    LearnedScorer::with_precision(net.clone(), settings.drafter_precision),
                    Arc::clone(m),
                )
                .with_rule(cfg.confidence, cfg.sample_top_k)
                .with_precision(settings.drafter_precision)
                .with_head(settings.module_head),
            )
        }
        Method::Blockspec => b.scorer(Calibrated::new(
            StaleConfidenceScorer,
            drafters.calibration.clone(),
        )),
        Method::SpotUnit => {
            let Some(net) = &drafters.net else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "a drafter checkpoint (--drafter)",
                });
            };
            b.scorer(Calibrated::unit(LearnedScorer::with_precision(
                net.clone(),
                settings.drafter_precision,
            )))
        }
        Method::Spot | Method::SpotGamma | Method::SpotAdaptive | Method::SpotReuse => {
            let Some(net) = &drafters.net else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "a drafter checkpoint (--drafter)",
                });
            };
            let learned = LearnedScorer::with_precision(net.clone(), settings.drafter_precision);
            let learned = match method {
                Method::SpotReuse => learned.reuse_below(REUSE_BELOW),
                _ => learned,
            };
            let b = match &drafters.mrp {
                Some(m) if net.config().module_tokens_for(cfg.temperature) => b.scorer(
                    MrpTokens::new(learned, Arc::clone(m))
                        .with_rule(cfg.confidence, cfg.sample_top_k)
                        .with_precision(settings.drafter_precision)
                        .with_head(settings.module_head),
                ),
                _ => b.scorer(learned),
            }
            .adaptive_gamma(method == Method::SpotAdaptive);
            if method == Method::SpotGamma {
                b.gamma(settings.spot_gamma)
            } else {
                b
            }
        }
        Method::Spiffy => {
            let Some(g) = &drafters.spiffy else {
                return Err(MethodError::NotLoaded {
                    method: method.name(),
                    what: "a calibrated graph (spot calibrate-spiffy, --spiffy)",
                });
            };
            b.scorer(Calibrated::new(
                SpiffyScorer::new(g),
                drafters.calibration.clone(),
            ))
            .max_depth(g.max_depth)
        }
        Method::Oracle | Method::OracleToken | Method::OracleJoint => {
            let owned;
            let trace = match reference {
                Some(t) => t,
                None => {
                    let df = DraftFreeDecoder::new()
                        .with_trace(true)
                        .decode(model, prompt, cfg)?;
                    let Some(trace) = df.trace else {
                        return Err(MethodError::NotLoaded {
                            method: method.name(),
                            what: "a draft-free trace (the decoder returned none)",
                        });
                    };
                    owned = trace;
                    &owned
                }
            };
            match method {
                Method::OracleToken => b.scorer(TokenOracleScorer::from_trace(trace)),
                m => b.scorer(
                    OracleScorer::from_trace(trace, m == Method::OracleJoint)
                        .map_err(spot_dlm::Error::from)?,
                ),
            }
        }
    };
    Ok(b.build()?.into())
}

/// The [`Request`] of one prompt decoded with `method`: its [`strategy`] (no oracle trace
/// given) ready for [`run_request`] or a [`spot_dlm::BatchDriver`].
pub fn request<B: Backend>(
    method: Method,
    settings: Settings,
    drafters: &Drafters<B>,
    model: &mut dyn BlockDiffusionModel,
    (prompt, cfg): (&[u32], &DecodeConfig),
) -> Result<Request<Strategy>> {
    let s = strategy(method, settings, drafters, model, (prompt, cfg), None)?;
    Ok(Request::new(prompt, cfg, model.info(), s)?)
}

/// Decodes `prompt` with `method` (see [`strategy`]).
#[allow(clippy::too_many_arguments)]
pub fn run<B: Backend>(
    method: Method,
    settings: Settings,
    drafters: &Drafters<B>,
    model: &mut dyn BlockDiffusionModel,
    prompt: &[u32],
    cfg: &DecodeConfig,
    reference: Option<&DecodeTrace>,
    observer: &mut dyn BlockObserver,
) -> Result<Run> {
    let mut strategy = strategy(method, settings, drafters, model, (prompt, cfg), reference)?;
    let start = Instant::now();
    let request = Request::new(prompt, cfg, model.info(), &mut strategy)?;
    let out = run_request(model, request, observer)?;
    Ok(Run {
        out,
        wall: start.elapsed().as_secs_f64(),
        report: strategy.report().cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped checkpoint drafts the module's tokens at T = 0 only (`0:on,1:off,2:off`).
    #[test]
    fn the_token_module_loads_only_for_the_temperatures_that_use_it() -> Result<()> {
        type B = spot_models::CpuBackend;
        let device = Default::default();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code");
        let files = DraftFiles {
            dir: &dir,
            drafter: None,
            spiffy: None,
            sets: None,
            sets_net: None,
            mrp: None,
            calibrate_baselines: true,
        };
        let loaded = |methods: &[Method], ts: Option<&[f32]>| -> Result<bool> {
            let d = match ts {
                Some(ts) => Drafters::<B>::load_at(methods, &files, ts, &device)?,
                None => Drafters::<B>::load(methods, &files, &device)?,
            };
            assert!(
                d.net().is_some(),
                "the drafter network loads for {methods:?}"
            );
            Ok(d.mrp.is_some())
        };
        assert!(
            loaded(&[Method::Spot], Some(&[0.0]))?,
            "T = 0 drafts the module's tokens"
        );
        assert!(loaded(&[Method::Spot], Some(&[2.0, 0.0]))?);
        assert!(
            !loaded(&[Method::Spot], Some(&[1.0, 2.0]))?,
            "T = 1, 2 draft stale tokens"
        );
        assert!(
            !loaded(&[Method::Spot], Some(&[]))?,
            "replay never runs the module"
        );
        assert!(
            loaded(&[Method::Spot], None)?,
            "a server's requests may ask for T = 0"
        );
        assert!(
            !loaded(&[Method::Blockspec, Method::Spot], Some(&[1.0]))?,
            "baselines do not need it"
        );
        assert!(
            loaded(&[Method::SpotMrp], Some(&[]))?,
            "a method that names the module loads it at any temperature"
        );
        Ok(())
    }
}
