//! Block states and commits.

use crate::error::{Error, Result};

pub use crate::TokenId;

/// SplitMix64 finaliser: a fast, well-mixed 64-bit hash step (the state hash's mixer; also
/// the toy models' and the seeded test drafters').
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Zobrist key of token `t` at block position `s`. A state's hash is the XOR of the keys of
/// all its positions, so a commit updates it in O(1): the hash the draft tree, its builders
/// and the verifier's successor lookup share.
pub fn zobrist(s: usize, t: TokenId) -> u64 {
    mix64(((s as u64) << 32) ^ u64::from(t) ^ 0x5107_7ee5_0000_0000)
}

/// The hash of a whole block state's tokens (see [`zobrist`]).
///
/// ```
/// use spot_core::state::{state_hash, zobrist};
/// let (a, b) = (state_hash(&[9, 9, 9]), state_hash(&[9, 4, 9]));
/// assert_eq!(a ^ zobrist(1, 9) ^ zobrist(1, 4), b);
/// ```
pub fn state_hash(tokens: &[TokenId]) -> u64 {
    tokens
        .iter()
        .enumerate()
        .fold(0, |h, (s, &t)| h ^ zobrist(s, t))
}

/// One committed position: block position `position` receives `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Commit {
    /// Position inside the block (0-based).
    pub position: usize,
    /// The token written there.
    pub token: TokenId,
}

impl Commit {
    /// Creates a commit.
    pub const fn new(position: usize, token: TokenId) -> Self {
        Self { position, token }
    }
}

/// The token ids of the block being decoded; masked positions hold the mask id.
///
/// The committed prefix (prompt and finished blocks) lives in the model's cache, so two
/// states of the same decode are equal exactly when their token ids are equal, which is what
/// the verifier tests.
///
/// ```
/// use spot_core::{BlockState, Commit};
/// let mut s = BlockState::masked(4, 99);
/// assert_eq!(s.masked_count(), 4);
/// s.commit(Commit::new(2, 7)).unwrap();
/// assert_eq!(s.tokens(), &[99, 99, 7, 99]);
/// assert_eq!(s.masked_positions().collect::<Vec<_>>(), vec![0, 1, 3]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockState {
    tokens: Vec<TokenId>,
    mask_id: TokenId,
}

impl BlockState {
    /// A fully masked block of `len` positions.
    pub fn masked(len: usize, mask_id: TokenId) -> Self {
        Self {
            tokens: vec![mask_id; len],
            mask_id,
        }
    }

    /// A block from explicit token ids; positions equal to `mask_id` are masked.
    pub fn from_tokens(tokens: Vec<TokenId>, mask_id: TokenId) -> Self {
        Self { tokens, mask_id }
    }

    /// The token ids, masks included.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// The mask id of this block.
    pub fn mask_id(&self) -> TokenId {
        self.mask_id
    }

    /// Number of positions (the block size).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the block has no positions at all.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether position `s` is still masked (false when out of range).
    pub fn is_masked(&self, s: usize) -> bool {
        self.tokens.get(s) == Some(&self.mask_id)
    }

    /// Number of masked positions.
    pub fn masked_count(&self) -> usize {
        self.tokens.iter().filter(|&&t| t == self.mask_id).count()
    }

    /// Whether every position is committed.
    pub fn is_complete(&self) -> bool {
        !self.tokens.contains(&self.mask_id)
    }

    /// The masked positions in increasing order.
    pub fn masked_positions(&self) -> impl Iterator<Item = usize> + '_ {
        let mask = self.mask_id;
        self.tokens
            .iter()
            .enumerate()
            .filter(move |(_, t)| **t == mask)
            .map(|(i, _)| i)
    }

    /// Writes a commit. The position must be masked and the token must not be the mask id.
    pub fn commit(&mut self, c: Commit) -> Result<()> {
        check_commit(&self.tokens, self.mask_id, c)?;
        self.tokens[c.position] = c.token;
        Ok(())
    }

    /// A copy of this state with `c` applied.
    pub fn with_commit(&self, c: Commit) -> Result<Self> {
        let mut next = self.clone();
        next.commit(c)?;
        Ok(next)
    }

    /// Consumes the state and returns its tokens.
    pub fn into_tokens(self) -> Vec<TokenId> {
        self.tokens
    }
}

/// Checks that `c` may be applied to `tokens` (masked position in range, non-mask token).
///
/// # Errors
/// [`Error::InvalidCommit`] naming the reason.
pub fn check_commit(tokens: &[TokenId], mask_id: TokenId, c: Commit) -> Result<()> {
    let reason = match tokens.get(c.position) {
        None => "position is outside the block",
        Some(&t) if t != mask_id => "position is already committed",
        Some(_) if c.token == mask_id => "the token is the mask id",
        Some(_) => return Ok(()),
    };
    Err(Error::InvalidCommit {
        position: c.position,
        token: c.token,
        reason,
    })
}
