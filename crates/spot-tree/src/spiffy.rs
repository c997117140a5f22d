//! The Spiffy-style baseline: a static draft graph over stale-confidence ranks, calibrated
//! offline from draft-free trajectories.
//!
//! A *rank path* `(r_0, r_1, …)` says "commit the `r_0`-th most confident masked position, then
//! the `r_1`-th most confident of those still masked, …" (ranks by the round's stale confidence,
//! 0 = most confident, ties by position). Calibration counts, over every step `t ≥ 1` of every
//! trajectory, the rank paths the draft-free decoder actually followed from `x_t` (up to
//! `max_depth` commits, 6 by default) and keeps the most frequent prefixes. At decode time
//! [`SpiffyScorer`] proposes exactly those paths with their stale tokens; the mass of a node is
//! the calibrated frequency of its rank path, so the best-first builder with budget `D` drafts
//! the `D` most frequent paths: a static graph, the same shape every round.
//!
//! The graph is a JSON file (`spot calibrate-spiffy`):
//!
//! ```json
//! { "format": "spot-spiffy-graph", "version": 1, "block_size": 32, "max_depth": 6,
//!   "sequences": 18198, "paths": [ { "ranks": [0], "count": 9120 }, … ] }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use spot_core::{BlockStats, Commit, TokenId};

use crate::{NodeBatch, OrderScorer, ScoreContext, TreeError, check_block_size};

/// Why a Spiffy graph file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid graph: its JSON, format, version or a field.
    #[error("{path}: invalid Spiffy graph: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The `format` field of a graph file.
pub const SPIFFY_FORMAT: &str = "spot-spiffy-graph";
/// The version of the graph file format.
pub const SPIFFY_VERSION: u32 = 1;

/// One calibrated rank path and how often the draft-free decoder followed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankPath {
    /// Stale-confidence ranks of the successive commits (0 = most confident).
    pub ranks: Vec<u16>,
    /// Number of calibration sequences that start with this path.
    pub count: u64,
}

/// A calibrated static draft graph (see the [module documentation](self)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpiffyGraph {
    /// Always [`SPIFFY_FORMAT`].
    pub format: String,
    /// Always [`SPIFFY_VERSION`].
    pub version: u32,
    /// Block size of the trajectories it was calibrated on.
    pub block_size: usize,
    /// Longest path.
    pub max_depth: usize,
    /// Calibration sequences (steps `t ≥ 1` with a single commit).
    pub sequences: u64,
    /// The kept paths, most frequent first; every prefix of a kept path is kept.
    pub paths: Vec<RankPath>,
}

/// Ranks of the positions masked in `state` by stale confidence (0 = most confident, ties by
/// position); `rank[s]` is `u16::MAX` at committed positions.
pub fn ranks(state: &[TokenId], mask: TokenId, conf: impl Fn(usize) -> f32, rank: &mut Vec<u16>) {
    let mut masked: Vec<usize> = (0..state.len()).filter(|&s| state[s] == mask).collect();
    masked.sort_by(|&a, &b| conf(b).total_cmp(&conf(a)).then(a.cmp(&b)));
    rank.clear();
    rank.resize(state.len(), u16::MAX);
    for (r, &s) in masked.iter().enumerate() {
        rank[s] = r as u16;
    }
}

impl SpiffyGraph {
    /// Writes the graph as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), GraphError> {
        let io = |source| GraphError::Io {
            path: path.to_path_buf(),
            source,
        };
        let text = serde_json::to_string_pretty(self).map_err(|e| config(path, e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(io)
    }

    /// Checks the fields a file cannot be trusted with: positive sizes, paths within
    /// `max_depth` and the block, counts within `sequences`.
    pub fn check(&self) -> Result<(), String> {
        if self.block_size == 0 || self.max_depth == 0 || self.sequences == 0 {
            return Err("block_size, max_depth and sequences must be positive".into());
        }
        for p in &self.paths {
            if p.ranks.is_empty() || p.ranks.len() > self.max_depth {
                return Err(format!(
                    "path {:?} has a length outside 1..={}",
                    p.ranks, self.max_depth
                ));
            }
            if p.ranks
                .iter()
                .enumerate()
                .any(|(d, &r)| usize::from(r) + d >= self.block_size)
            {
                return Err(format!("path {:?} ranks beyond the block", p.ranks));
            }
            if p.count > self.sequences {
                return Err(format!(
                    "path {:?} counts {} > {} sequences",
                    p.ranks, p.count, self.sequences
                ));
            }
        }
        Ok(())
    }

    /// Reads and validates a graph file.
    pub fn load(path: &Path) -> Result<Self, GraphError> {
        let text = std::fs::read_to_string(path).map_err(|source| GraphError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let g: Self = serde_json::from_str(&text).map_err(|e| config(path, e.to_string()))?;
        if g.format != SPIFFY_FORMAT {
            return Err(config(
                path,
                format!("format is {:?}, expected {SPIFFY_FORMAT:?}", g.format),
            ));
        }
        if g.version != SPIFFY_VERSION {
            return Err(config(
                path,
                format!(
                    "version {} is not supported (expected {SPIFFY_VERSION})",
                    g.version
                ),
            ));
        }
        g.check().map_err(|reason| config(path, reason))?;
        Ok(g)
    }
}

fn config(path: &Path, reason: String) -> GraphError {
    GraphError::Invalid {
        path: PathBuf::from(path),
        reason,
    }
}

/// The Spiffy-style scorer: proposes the calibrated rank paths with stale tokens.
///
/// `q(s | y)` is the conditional frequency of extending `y`'s rank path by `s`'s rank, and the
/// token hypothesis is the stale choice with weight 1, so a node's mass is its path's
/// calibrated frequency. Use it with `max_depth` = the graph's `max_depth`.
#[derive(Clone, Debug)]
pub struct SpiffyScorer {
    counts: HashMap<Vec<u16>, u64>,
    sequences: u64,
    block_size: usize,
    path: Vec<Commit>,
    seq: Vec<u16>,
    rank: Vec<u16>,
    state: Vec<TokenId>,
}

impl SpiffyScorer {
    /// A scorer over `graph`.
    pub fn new(graph: &SpiffyGraph) -> Self {
        Self {
            counts: graph
                .paths
                .iter()
                .map(|p| (p.ranks.clone(), p.count))
                .collect(),
            sequences: graph.sequences,
            block_size: graph.block_size,
            path: Vec::new(),
            seq: Vec::new(),
            rank: Vec::new(),
            state: Vec::new(),
        }
    }

    fn count(&self, seq: &[u16]) -> u64 {
        if seq.is_empty() {
            self.sequences
        } else {
            self.counts.get(seq).copied().unwrap_or(0)
        }
    }
}

impl OrderScorer for SpiffyScorer {
    fn name(&self) -> &str {
        "spiffy"
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        check_block_size("spiffy", self.block_size, l)?;
        let mask = nodes.mask_id();
        let stale: &BlockStats = ctx.stale;
        let conf = |s: usize| stale.confidence(s);
        for i in 0..nodes.len() {
            // The node's own rank path: replay its commits from the root.
            nodes.path(i, &mut self.path);
            self.state.clear();
            self.state.extend_from_slice(ctx.root.tokens());
            self.seq.clear();
            for c in &self.path {
                ranks(&self.state, mask, conf, &mut self.rank);
                self.seq.push(self.rank[c.position]);
                self.state[c.position] = c.token;
            }
            let base = self.count(&self.seq) as f32;
            ranks(nodes.tokens(i), mask, conf, &mut self.rank);
            let row = &mut out[i * l..(i + 1) * l];
            for (s, o) in row.iter_mut().enumerate() {
                *o = 0.0;
                if self.rank[s] == u16::MAX || base <= 0.0 {
                    continue;
                }
                self.seq.push(self.rank[s]);
                *o = self.count(&self.seq) as f32 / base;
                self.seq.pop();
            }
        }
        Ok(())
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        _nodes: &NodeBatch<'_>,
        _i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        unit_stale_token(ctx, position, out);
        true
    }
}
/// Spiffy's token rule at `position`: the stale choice alone, at weight 1 (no hedge).
pub fn unit_stale_token(ctx: &ScoreContext<'_>, position: usize, out: &mut Vec<(TokenId, f32)>) {
    out.push((ctx.stale.token(position), 1.0));
}
