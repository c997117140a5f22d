//! Tensor values on the host, and the host-side layout helpers the layers share.

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;

/// Whether `B` is a CPU backend (flex or ndarray).
pub(crate) fn runs_on_host<B: Backend>(device: &B::Device) -> bool {
    matches!(B::name(device).as_str(), "flex" | "ndarray")
}

/// A tensor's values on the host.
pub(crate) fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    let data = t.into_data();
    // f32 data as one copy; other types converted value by value.
    match data.as_slice::<f32>() {
        Ok(values) => values.to_vec(),
        Err(_) => data.iter::<f32>().collect(),
    }
}

/// `[rows, cols]` row-major -> `[cols, rows]` row-major.
pub(crate) fn transposed(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}
