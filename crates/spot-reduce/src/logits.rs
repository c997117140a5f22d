//! Host logits `[rows, vocab]`, in a buffer that suits their size.
//!
//! The logits of a batch of block states over a real vocabulary are large (21 states of 32
//! positions over 151,936 ids: 408 MB). Written into fresh heap pages, most of the time goes to
//! the kernel faulting in and zeroing 4 KiB pages one at a time. Large outputs are therefore
//! written into an anonymous mapping that asks the kernel for transparent huge pages (2 MiB
//! faults; where the kernel declines, the mapping behaves like any other zeroed memory).

use std::fmt;
use std::ops::Deref;

use memmap2::{Advice, MmapMut};

/// Outputs of at least this many bytes go into a huge-page mapping (glibc's allocator serves
/// smaller blocks from memory it recycles; from 32 MiB up every block is a fresh mapping anyway).
const MAPPED_FROM: usize = 32 << 20;

/// Logits `[rows, vocab]` on the host, row-major; dereferences to the `rows * vocab` values.
///
/// Returned by `forward_logits` and `extend_logits` of every model.
///
/// # Examples
///
/// ```
/// use spot_reduce::HostHead;
///
/// let (vocab, dim) = (10, 4);
/// let weights: Vec<f32> = (0..vocab * dim).map(|i| i as f32 / 40.0).collect();
/// let head = HostHead::new(&weights, vocab, dim)?;
/// let logits = head.logits(&[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]); // two rows
/// assert_eq!((logits.rows(), logits.vocab()), (2, vocab));
/// assert_eq!(logits.row(0)[3], weights[3 * dim]); // row 0 reads hidden unit 0
/// # Ok::<(), spot_core::Error>(())
/// ```
pub struct Logits {
    data: Buffer,
    rows: usize,
    vocab: usize,
}

enum Buffer {
    Heap(Vec<f32>),
    Mapped(MmapMut),
}

impl Logits {
    /// `rows * vocab` zeros: a huge-page mapping when large, otherwise a vector.
    pub fn zeroed(rows: usize, vocab: usize) -> Self {
        let len = rows * vocab;
        let bytes = len * size_of::<f32>();
        let mapped = (bytes >= MAPPED_FROM)
            .then(|| MmapMut::map_anon(bytes).ok())
            .flatten()
            .filter(|map| bytemuck::try_cast_slice::<u8, f32>(map).is_ok());
        let data = match mapped {
            Some(map) => {
                // Advice only: without huge pages the mapping is ordinary zeroed memory.
                let _ = map.advise(Advice::HugePage);
                Buffer::Mapped(map)
            }
            None => Buffer::Heap(vec![0.0; len]),
        };
        Self { data, rows, vocab }
    }

    /// Wraps `values`, `[values.len() / vocab, vocab]` row-major; a length that is not a whole
    /// number of rows is an error.
    pub fn from_vec(values: Vec<f32>, vocab: usize) -> spot_core::Result<Self> {
        if vocab == 0 || !values.len().is_multiple_of(vocab) {
            return Err(spot_core::Error::ShapeMismatch {
                what: "logits (a whole number of rows of vocab values)",
                expected: values.len().next_multiple_of(vocab.max(1)),
                actual: values.len(),
            });
        }
        Ok(Self {
            rows: values.len() / vocab,
            vocab,
            data: Buffer::Heap(values),
        })
    }

    /// The values, writable.
    pub(crate) fn values_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            Buffer::Heap(v) => v,
            // `zeroed` checked that the mapping casts.
            Buffer::Mapped(m) => bytemuck::try_cast_slice_mut(m).unwrap_or_default(),
        }
    }

    /// Rows (positions).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Vocabulary size (values per row).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `r`'s `vocab` logits.
    ///
    /// # Panics
    ///
    /// If `r >= rows()`, like slice indexing.
    pub fn row(&self, r: usize) -> &[f32] {
        &self[r * self.vocab..(r + 1) * self.vocab]
    }

    /// The values as a vector (a copy when they live in a mapping).
    pub fn into_vec(self) -> Vec<f32> {
        match self.data {
            Buffer::Heap(v) => v,
            Buffer::Mapped(_) => self.to_vec(),
        }
    }
}

impl Deref for Logits {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.data {
            Buffer::Heap(v) => v,
            Buffer::Mapped(m) => bytemuck::try_cast_slice(m).unwrap_or_default(),
        }
    }
}

impl IntoIterator for Logits {
    type Item = f32;
    type IntoIter = std::vec::IntoIter<f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a Logits {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for Logits {
    /// Same vocabulary and `==` on every value (`NaN != NaN`, as for `Vec<f32>`).
    fn eq(&self, other: &Self) -> bool {
        self.vocab == other.vocab && **self == **other
    }
}

impl fmt::Debug for Logits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head: Vec<f32> = self.iter().take(8).copied().collect();
        f.debug_struct("Logits")
            .field("rows", &self.rows)
            .field("vocab", &self.vocab)
            .field("first", &head)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn mapped_and_heap_buffers_hold_the_same_values() {
        // 40 MiB: mapped; the same values on the heap compare equal.
        let (rows, vocab) = (80, 131_072);
        let mut big = Logits::zeroed(rows, vocab);
        assert!(
            matches!(big.data, Buffer::Mapped(_)),
            "large outputs are mapped"
        );
        assert!(
            big.iter().all(|&x| x == 0.0),
            "a fresh mapping reads as zeros"
        );
        for (i, x) in big.values_mut().iter_mut().enumerate() {
            *x = (i % 977) as f32 * 0.5;
        }
        let heap = Logits::from_vec(big.to_vec(), vocab).unwrap();
        assert_eq!(big, heap);
        assert_eq!((big.rows(), big.vocab()), (rows, vocab));
        assert_eq!(big.row(3)[5], ((3 * vocab + 5) % 977) as f32 * 0.5);
        assert_eq!(big.into_vec(), heap.into_vec());

        let small = Logits::zeroed(2, 3);
        assert!(
            matches!(small.data, Buffer::Heap(_)),
            "small outputs stay on the heap"
        );
        assert_eq!(small.len(), 6);
        assert_ne!(
            small,
            Logits::from_vec(vec![0.0; 6], 2).unwrap(),
            "shapes differ"
        );
        assert!(Logits::from_vec(vec![0.0; 7], 2).is_err());
    }
}
