//! The adaptive mass floor: a node joins the verification batch only when its chance of being
//! accepted pays for the time it adds to the forward.
//!
//! A forward over `n` block states takes about `t(n) = a + b·n` seconds. A draft node of mass
//! `m` (the drafter's probability that the walk reaches it) saves, when accepted, about one
//! forward, `t(n)`, and costs `b` whether accepted or not. So it is worth scoring when
//! `m · t(n) > b`: the floor is `γ = b / t(n)`, with `n` the full batch (`1 + D`). On hardware
//! where extra states are nearly free (`b ≈ 0`, a GPU below saturation) the floor vanishes and
//! the whole budget is drafted; where every state costs its share (`a ≈ 0`, a CPU), it is about
//! `1 / (1 + D)`. `a` and `b` are fitted online by least squares over the rounds' measured
//! forward times, forgetting old rounds geometrically; until two batch sizes have been seen
//! the configured floor stands alone.

/// Online fit of forward time against batch size, and the floor it implies.
#[derive(Clone, Debug, Default)]
pub struct ForwardCost {
    /// Exponentially weighted sums: weight, n, t, n², n·t.
    w: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
}

/// Weight kept per round (about the last 30 rounds count).
const KEEP: f64 = 0.97;
/// The adaptive floor never exceeds this (a drafter whose best node is less likely than this
/// would not be drafted at all).
const MAX_FLOOR: f64 = 0.5;

impl ForwardCost {
    /// Records one forward over `states` block states that took `seconds`.
    pub fn record(&mut self, states: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let n = states as f64;
        self.w = self.w * KEEP + 1.0;
        self.n = self.n * KEEP + n;
        self.t = self.t * KEEP + seconds;
        self.nn = self.nn * KEEP + n * n;
        self.nt = self.nt * KEEP + n * seconds;
    }

    /// The fitted `(a, b)` of `t(n) = a + b·n` (`b >= 0`), once the batch sizes recorded vary.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 {
            return None;
        }
        let (mn, mt) = (self.n / self.w, self.t / self.w);
        let var = self.nn / self.w - mn * mn;
        if var < 1e-6 {
            return None;
        }
        let b = ((self.nt / self.w - mn * mt) / var).max(0.0);
        Some((mt - b * mn, b))
    }

    /// The floor `b / t(states)` for a batch of `states` states, capped; `None` before a fit.
    ///
    /// ```
    /// use spot_dlm::floor::ForwardCost;
    /// let mut cost = ForwardCost::default();
    /// assert_eq!(cost.floor(9), None);
    /// // A CPU-like forward: 1 ms per state, nothing fixed.
    /// for n in [1, 9, 5, 9, 3, 9] {
    ///     cost.record(n, 1e-3 * n as f64);
    /// }
    /// let g = cost.floor(9).unwrap();
    /// assert!((g - 1.0 / 9.0).abs() < 1e-6, "{g}");
    /// // A GPU-like forward: 10 ms fixed, extra states free.
    /// let mut gpu = ForwardCost::default();
    /// for n in [1, 9, 5, 9] {
    ///     gpu.record(n, 1e-2);
    /// }
    /// assert!(gpu.floor(9).unwrap() < 1e-9);
    /// ```
    pub fn floor(&self, states: usize) -> Option<f32> {
        let (a, b) = self.fit()?;
        let t = a + b * states as f64;
        if !(t.is_finite() && t > 0.0) {
            return None;
        }
        Some((b / t).clamp(0.0, MAX_FLOOR) as f32)
    }
}
