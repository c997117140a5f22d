//! Draft-free decoding trajectories: what the drafter is trained on.
//!
//! A trajectory is one decoded prompt. For every block it stores the block's initial state and,
//! for every draft-free step, the target's statistics at the state before the step (for each
//! position masked there: confidence, chosen token, runner-up, entropy, tail mass, top-k
//! probabilities) and the commits the step made. The statistics of step `t - 1` are the stale
//! distribution of a round rooted at the state after step `t - 1`, and the commits of steps
//! `t, t + 1, ...` are the true future (Algorithm 1, [`examples`]).
//!
//! # File format (version 3)
//!
//! One file per trajectory, little-endian:
//!
//! ```text
//! magic  b"SPOTTRJ\0"          8 bytes
//! version u32 (= 3), block_size u32, top_k u32, mask_id u32, temperature f32, seed u64
//! hidden_dim u32 (0: no hidden states)
//! id_len u32, id (UTF-8, id_len bytes)
//! n_blocks u32, then per block:
//!   start u64, initial tokens (block_size × u32), n_steps u32, then per step:
//!     n_commits u32, commits (n_commits × (position u32, token u32))
//!     n_masked u32 (positions masked before the step, in increasing order), per position:
//!       position u32, token u32, runner_up u32, confidence f32, entropy f32, tail_mass f32,
//!       hedge u32, hedge_prob f32, margin f32, top_probs (top_k × f32),
//!       top_ids (top_k × u32), hidden (hidden_dim × bf16, the target's final hidden state)
//! checksum u64 (FNV-1a of every byte before it)
//! ```
//!
//! Version 2 added `hedge`, `hedge_prob` and `margin` (the noised runner-up and how far the
//! choice is ahead of it); version 3 the top-k ids and the hidden states (`spot collect
//! --hidden-states`, what the learned set drafter reads). Version 2 files are read (without hidden states); version
//! 1 files are refused with [`TrajectoryError::Version`].
//!
//! Files are written to a temporary name and renamed, so a crash leaves either a whole file or
//! none; reading a truncated, corrupted or other-version file is a [`TrajectoryError`] naming
//! the file.

use std::path::{Path, PathBuf};

use spot_core::{
    BlockDiffusionModel, BlockRun, BlockState, BlockStats, Commit, DecodeConfig, DecodeOutput,
    StatsQuery, StepStrategy, TokenId, run_decode,
};

use spot_tree::stale::{PositionStale, StaleSource, StoredPosition, bf16_bits};

/// The format version written (version 2 is read too).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format version read.
const OLDEST_VERSION: u32 = 2;
/// The widest hidden state a file may declare.
const MAX_HIDDEN_DIM: usize = 1 << 16;
const MAGIC: &[u8; 8] = b"SPOTTRJ\0";

/// Why a trajectory could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TrajectoryError {
    /// The file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not start with the trajectory magic.
    #[error("{path}: not a SPOT trajectory file (bad magic bytes)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The file has another format version.
    #[error(
        "{path}: trajectory format version {found}; this build reads versions {OLDEST_VERSION} to {FORMAT_VERSION}"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: u32,
    },
    /// The file ends early.
    #[error("{path}: truncated at byte {offset} while reading {what}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Where the data ran out.
        offset: usize,
        /// What was being read.
        what: &'static str,
    },
    /// The content is inconsistent (or the checksum does not match).
    #[error("{path}: corrupt trajectory: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Decoding the prompt failed.
    #[error(transparent)]
    Decode(#[from] spot_core::Error),
}

type Result<T, E = TrajectoryError> = std::result::Result<T, E>;

/// One draft-free step: statistics of the state before it, and its commits.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// Commits of the step (one for exact decoding).
    pub commits: Vec<Commit>,
    /// Statistics of every position masked before the step, by increasing position.
    pub positions: Vec<StoredPosition>,
}

impl StepRecord {
    /// The stored statistics of block position `s` (`None` when `s` was not masked).
    pub fn stored(&self, s: usize) -> Option<&StoredPosition> {
        let i = self
            .positions
            .binary_search_by_key(&s, |p| p.position as usize)
            .ok()?;
        self.positions.get(i)
    }
}

impl StaleSource for StepRecord {
    fn position(&self, s: usize) -> Option<PositionStale<'_>> {
        self.stored(s).map(StoredPosition::stale)
    }
}

/// One decoded block.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRecord {
    /// Absolute position of the block's first slot.
    pub start: u64,
    /// The block's state before its first forward (prompt tail, then masks).
    pub initial: Vec<TokenId>,
    /// Its draft-free steps.
    pub steps: Vec<StepRecord>,
}

/// One decoded prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Trajectory {
    /// The prompt's identifier.
    pub id: String,
    /// Block size.
    pub block_size: usize,
    /// Probabilities stored per position.
    pub top_k: usize,
    /// The mask id.
    pub mask_id: TokenId,
    /// Decoding temperature.
    pub temperature: f32,
    /// Noise seed.
    pub seed: u64,
    /// Width of the stored hidden states ([`StoredPosition::hidden`]; 0: none).
    pub hidden_dim: usize,
    /// The blocks, in order.
    pub blocks: Vec<BlockRecord>,
}

/// A [`StepStrategy`] that decodes draft-free and records every step.
#[derive(Debug, Default)]
pub struct Recorder {
    blocks: Vec<BlockRecord>,
    scratch: Vec<Commit>,
    top_k: Option<usize>,
    /// Ask every forward for the hidden states and store them.
    hidden_states: bool,
    hidden_dim: usize,
}

impl Recorder {
    /// A recorder that also stores the target's hidden states (the model must attach them).
    pub fn with_hidden_states() -> Self {
        Self {
            hidden_states: true,
            ..Self::default()
        }
    }
}

impl StepStrategy for Recorder {
    type Error = spot_core::Error;

    fn round_query(&self, base: &StatsQuery) -> StatsQuery {
        StatsQuery {
            hidden_states: self.hidden_states,
            ..*base
        }
    }

    fn propose(&mut self, block: &BlockRun, states: &mut Vec<BlockState>) -> spot_core::Result<()> {
        if block.forwards() == 0 {
            self.blocks.push(BlockRecord {
                start: block.start() as u64,
                initial: block.state().tokens().to_vec(),
                steps: Vec::new(),
            });
        }
        states.push(block.state().clone());
        Ok(())
    }

    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> spot_core::Result<()> {
        let before: Vec<usize> = block.state().masked_positions().collect();
        let stats = block.plain_absorb(spot_core::first_stats(stats)?, &mut self.scratch)?;
        self.top_k.get_or_insert(stats.top_k());
        if self.hidden_states {
            let dim = stats.hidden().map_or(0, |h| h.0);
            if dim == 0 || (self.hidden_dim != 0 && dim != self.hidden_dim) {
                return Err(spot_core::Error::config(
                    "hidden_states",
                    format!(
                        "the model attached hidden states of width {dim} (expected {})",
                        self.hidden_dim.max(1)
                    ),
                ));
            }
            self.hidden_dim = dim;
        }
        let q = block.query();
        let noise = (q.temperature > 0.0).then_some(q.noise);
        let mask = block.state().mask_id();
        let positions = before
            .into_iter()
            .map(|s| StoredPosition::from_stats(&stats, s, block.start(), noise, mask))
            .collect();
        let step = StepRecord {
            commits: self.scratch.clone(),
            positions,
        };
        match self.blocks.last_mut() {
            Some(b) => b.steps.push(step),
            None => {
                return Err(spot_core::Error::RequestState {
                    expected: "a proposed block",
                    got: "statistics",
                });
            }
        }
        Ok(())
    }
}

/// Decodes `prompt` draft-free (exactly as [`spot_core::DraftFreeDecoder`]) and returns the
/// output with its trajectory.
pub fn record(
    model: &mut dyn BlockDiffusionModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    id: &str,
) -> Result<(DecodeOutput, Trajectory)> {
    record_with(model, prompt, cfg, id, Recorder::default())
}

/// [`record`] through `rec` (e.g. [`Recorder::with_hidden_states`]).
pub fn record_with(
    model: &mut dyn BlockDiffusionModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    id: &str,
    mut rec: Recorder,
) -> Result<(DecodeOutput, Trajectory)> {
    let out = run_decode(model, prompt, cfg, &mut rec, false, &mut ())?;
    let traj = Trajectory {
        id: id.to_string(),
        block_size: cfg.block_size,
        top_k: rec.top_k.unwrap_or(cfg.top_k),
        mask_id: model.info().mask_id,
        temperature: cfg.temperature,
        seed: cfg.seed,
        hidden_dim: rec.hidden_dim,
        blocks: rec.blocks,
    };
    Ok((out, traj))
}

/// One supervised example of Algorithm 1.
#[derive(Clone, Copy, Debug)]
pub struct Example<'a> {
    /// The stale statistics (step `t - 1`).
    pub stale: &'a StepRecord,
    /// The hypothesised state `y_{t,d}`: the root after `d` true commits.
    pub state: &'a [TokenId],
    /// The depth `d`.
    pub depth: usize,
    /// The position the target commits next from `state`.
    pub target: usize,
    /// The token it commits there.
    pub token: TokenId,
    /// Whether each of the `d` commits before this one put the stale choice or the hedge of
    /// its position (by the stale statistics): whether a tree of stale tokens and hedges could
    /// have drafted the path to `state`. Always true at depth 0.
    pub drafted: bool,
}

/// Calls `f` for every example of Algorithm 1 in `traj`: for each step `t ≥ 1` of each block
/// and each depth `d ≤ max_depth` with `t + d` a step of the block, the root `x_t` plus the
/// commits of steps `t..t + d`, the stale statistics of step `t - 1` and the position of step
/// `t + d`'s commit as the target. Steps with several commits (threshold decoding) are not
/// targets. Returns the number of examples.
pub fn examples(traj: &Trajectory, max_depth: usize, mut f: impl FnMut(Example<'_>)) -> usize {
    let mut n = 0;
    for b in &traj.blocks {
        let mut root = b.initial.clone();
        for (t, step) in b.steps.iter().enumerate() {
            if t >= 1 {
                let mut y = root.clone();
                let stale = &b.steps[t - 1];
                let mut drafted = true;
                for d in 0..=max_depth {
                    let Some(next) = b.steps.get(t + d) else {
                        break;
                    };
                    if let [c] = next.commits.as_slice() {
                        f(Example {
                            stale,
                            state: &y,
                            depth: d,
                            target: c.position,
                            token: c.token,
                            drafted,
                        });
                        n += 1;
                    }
                    for c in &next.commits {
                        drafted &= stale
                            .stored(c.position)
                            .is_some_and(|p| p.token == c.token || p.hedge == c.token);
                        if let Some(slot) = y.get_mut(c.position) {
                            *slot = c.token;
                        }
                    }
                }
            }
            for c in &step.commits {
                if let Some(slot) = root.get_mut(c.position) {
                    *slot = c.token;
                }
            }
        }
    }
    n
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Trajectory {
    /// The file bytes of this trajectory (format [`FORMAT_VERSION`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Vec::new();
        let u32_ = |w: &mut Vec<u8>, v: u32| w.extend_from_slice(&v.to_le_bytes());
        let f32_ = |w: &mut Vec<u8>, v: f32| w.extend_from_slice(&v.to_le_bytes());
        w.extend_from_slice(MAGIC);
        u32_(&mut w, FORMAT_VERSION);
        u32_(&mut w, self.block_size as u32);
        u32_(&mut w, self.top_k as u32);
        u32_(&mut w, self.mask_id);
        f32_(&mut w, self.temperature);
        w.extend_from_slice(&self.seed.to_le_bytes());
        u32_(&mut w, self.hidden_dim as u32);
        u32_(&mut w, self.id.len() as u32);
        w.extend_from_slice(self.id.as_bytes());
        u32_(&mut w, self.blocks.len() as u32);
        for b in &self.blocks {
            w.extend_from_slice(&b.start.to_le_bytes());
            for &t in &b.initial {
                u32_(&mut w, t);
            }
            u32_(&mut w, b.steps.len() as u32);
            for s in &b.steps {
                u32_(&mut w, s.commits.len() as u32);
                for c in &s.commits {
                    u32_(&mut w, c.position as u32);
                    u32_(&mut w, c.token);
                }
                u32_(&mut w, s.positions.len() as u32);
                for p in &s.positions {
                    u32_(&mut w, p.position);
                    u32_(&mut w, p.token);
                    u32_(&mut w, p.runner_up);
                    f32_(&mut w, p.confidence);
                    f32_(&mut w, p.entropy);
                    f32_(&mut w, p.tail_mass);
                    u32_(&mut w, p.hedge);
                    f32_(&mut w, p.hedge_prob);
                    f32_(&mut w, p.margin);
                    for k in 0..self.top_k {
                        f32_(&mut w, p.top_probs.get(k).copied().unwrap_or(0.0));
                    }
                    for k in 0..self.top_k {
                        u32_(&mut w, p.top_ids.get(k).copied().unwrap_or(self.mask_id));
                    }
                    for k in 0..self.hidden_dim {
                        let v = p.hidden.get(k).copied().unwrap_or(0.0);
                        w.extend_from_slice(&bf16_bits(v).to_le_bytes());
                    }
                }
            }
        }
        let sum = fnv1a(&w);
        w.extend_from_slice(&sum.to_le_bytes());
        w
    }

    /// Parses file bytes; `path` names the file in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let mut r = Reader {
            bytes,
            pos: 0,
            path,
        };
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(TrajectoryError::BadMagic {
                path: path.to_path_buf(),
            });
        }
        r.pos = MAGIC.len();
        let version = r.u32("version")?;
        if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(TrajectoryError::Version {
                path: path.to_path_buf(),
                found: version,
            });
        }
        if bytes.len() < r.pos + 8 {
            return Err(r.truncated("header"));
        }
        let body = &bytes[..bytes.len() - 8];
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&bytes[bytes.len() - 8..]);
        let block_size = r.u32("block_size")? as usize;
        let top_k = r.u32("top_k")? as usize;
        let mask_id = r.u32("mask_id")?;
        let temperature = r.f32("temperature")?;
        let seed = r.u64("seed")?;
        let hidden_dim = if version >= 3 {
            r.u32("hidden_dim")? as usize
        } else {
            0
        };
        if hidden_dim > MAX_HIDDEN_DIM {
            return Err(r.corrupt(format!("hidden_dim {hidden_dim}")));
        }
        let id_len = r.u32("id length")? as usize;
        let id = String::from_utf8(r.take(id_len, "id")?.to_vec())
            .map_err(|_| r.corrupt("id is not UTF-8".into()))?;
        if block_size == 0 || block_size > 4096 || top_k > 4096 {
            return Err(r.corrupt(format!("block_size {block_size} / top_k {top_k}")));
        }
        let n_blocks = r.u32("block count")? as usize;
        let mut blocks = Vec::new();
        for _ in 0..n_blocks {
            let start = r.u64("block start")?;
            let initial = (0..block_size)
                .map(|_| r.u32("initial state"))
                .collect::<Result<Vec<_>>>()?;
            let n_steps = r.u32("step count")? as usize;
            if n_steps > block_size {
                return Err(r.corrupt(format!("{n_steps} steps in a block of {block_size}")));
            }
            let mut steps = Vec::with_capacity(n_steps);
            for _ in 0..n_steps {
                let nc = r.u32("commit count")? as usize;
                if nc > block_size {
                    return Err(r.corrupt(format!("{nc} commits in a block of {block_size}")));
                }
                let mut commits = Vec::with_capacity(nc);
                for _ in 0..nc {
                    let position = r.u32("commit position")? as usize;
                    let token = r.u32("commit token")?;
                    if position >= block_size {
                        return Err(r.corrupt(format!("commit position {position}")));
                    }
                    commits.push(Commit { position, token });
                }
                let np = r.u32("position count")? as usize;
                if np > block_size {
                    return Err(r.corrupt(format!("{np} positions in a block of {block_size}")));
                }
                let mut positions = Vec::with_capacity(np);
                for _ in 0..np {
                    let position = r.u32("position")?;
                    if position as usize >= block_size
                        || positions
                            .last()
                            .is_some_and(|p: &StoredPosition| p.position >= position)
                    {
                        return Err(r.corrupt(format!("position {position} out of order")));
                    }
                    positions.push(StoredPosition {
                        position,
                        token: r.u32("token")?,
                        runner_up: r.u32("runner-up")?,
                        confidence: r.f32("confidence")?,
                        entropy: r.f32("entropy")?,
                        tail_mass: r.f32("tail mass")?,
                        hedge: r.u32("hedge")?,
                        hedge_prob: r.f32("hedge probability")?,
                        margin: r.f32("margin")?,
                        top_probs: (0..top_k)
                            .map(|_| r.f32("top probabilities"))
                            .collect::<Result<Vec<_>>>()?,
                        top_ids: if version >= 3 {
                            (0..top_k)
                                .map(|_| r.u32("top ids"))
                                .collect::<Result<Vec<_>>>()?
                        } else {
                            Vec::new()
                        },
                        hidden: (0..hidden_dim)
                            .map(|_| r.bf16("hidden state"))
                            .collect::<Result<Vec<_>>>()?,
                    });
                }
                steps.push(StepRecord { commits, positions });
            }
            blocks.push(BlockRecord {
                start,
                initial,
                steps,
            });
        }
        if r.pos + 8 > bytes.len() {
            return Err(r.truncated("checksum"));
        }
        if r.pos + 8 != bytes.len() {
            return Err(r.corrupt(format!("{} trailing bytes", bytes.len() - r.pos - 8)));
        }
        if fnv1a(body) != u64::from_le_bytes(sum) {
            return Err(r.corrupt("checksum mismatch".into()));
        }
        Ok(Self {
            id,
            block_size,
            top_k,
            mask_id,
            temperature,
            seed,
            hidden_dim,
            blocks,
        })
    }

    /// Writes the trajectory to `path` atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let io = |source| TrajectoryError::Io {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a trajectory file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| TrajectoryError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn truncated(&self, what: &'static str) -> TrajectoryError {
        TrajectoryError::Truncated {
            path: self.path.to_path_buf(),
            offset: self.pos,
            what,
        }
    }

    fn corrupt(&self, what: String) -> TrajectoryError {
        TrajectoryError::Corrupt {
            path: self.path.to_path_buf(),
            what,
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        // The last 8 bytes are the checksum, never content.
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| self.truncated(what))?;
        if end + 8 > self.bytes.len() {
            return Err(self.truncated(what));
        }
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn f32(&mut self, what: &'static str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    fn bf16(&mut self, what: &'static str) -> Result<f32> {
        let bits = u16::from_le_bytes(self.array(what)?);
        Ok(f32::from_bits(u32::from(bits) << 16))
    }
}
