//! SpecDiff-2 with a masked-diffusion drafter on burn ([`spot_models::MaskedDrafter`], a
//! drafter folder next to an autoregressive target): the `models` feature.

use burn_tensor::backend::Backend;
use spot_core::{AutoregressiveModel, TokenId};
use spot_models::MaskedDrafter;

use crate::drafter::{DiffusionDrafter, Marginals};

impl<B: Backend> DiffusionDrafter for MaskedDrafter<B> {
    fn name(&self) -> &str {
        "masked-drafter"
    }

    fn vocab_size(&self) -> usize {
        self.model().ar_info().vocab_size
    }

    fn propose(
        &mut self,
        context: &[TokenId],
        gamma: usize,
        out: &mut Marginals,
    ) -> spot_core::Result<()> {
        *out = Marginals::new(self.candidates());
        if context.is_empty() || gamma == 0 {
            return Ok(());
        }
        let stats = self.draft(context, gamma)?;
        let Some(s) = stats.first() else {
            return Err(spot_core::Error::ShapeMismatch {
                what: "drafter statistics",
                expected: 1,
                actual: 0,
            });
        };
        for i in 0..s.len() {
            let (ids, probs) = s.top(i);
            out.push(ids, probs)?;
        }
        Ok(())
    }
}
