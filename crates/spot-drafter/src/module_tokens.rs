//! Where SPOT's drafted tokens come from, per decoding temperature: the stale choices (with
//! the checkpoint's calibrated weights) or the target's token module.
//!
//! A token module reads the target's hidden states and corrects its stale logits before the
//! decoder's own rule picks each drafted position's token (the MRP module,
//! `spot_drafter::mrp::MrpTokens`; it belongs to one target and sits in its model folder). SPOT's
//! learned order still ranks the positions and its calibrated weights still give the tree's
//! masses; only the token at each drafted position changes. Whether that pays depends on the
//! temperature: at `T = 0` on the shipped target the module's tokens take SPOT from 75.80 to
//! 46.87 forwards per prompt on 30 GSM8K-test prompts (D = 8), at `T > 0` the noise decides
//! most tokens and they do not help. The checkpoint therefore stores the choice per
//! temperature ([`OrderModelConfig::module_tokens_by_temperature`](crate::OrderModelConfig::module_tokens_by_temperature)),
//! and decoding uses the entry nearest its own temperature. A folder without a module drafts
//! stale tokens whatever the checkpoint says. Tree shape only: the output is the draft-free
//! output either way.

use serde::{Deserialize, Serialize};

use crate::analysis::nearest_temperature;
use spot_tree::TableError;

/// Whether SPOT drafts the token module's tokens at one decoding temperature (see the
/// [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleTokens {
    /// The decoding temperature it is for (decoding uses the entry stored nearest its own).
    pub temperature: f32,
    /// `true`: the module's tokens where the model folder has a module; `false`: stale tokens.
    pub enabled: bool,
}

impl ModuleTokens {
    /// Whether the temperature is usable (finite, non-negative; checked when loading a
    /// checkpoint).
    pub fn check(&self) -> Result<(), TableError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(TableError::field(
                "module_tokens_by_temperature",
                "temperature must be finite and non-negative",
            ));
        }
        Ok(())
    }
}

/// Whether decoding at `temperature` drafts the module's tokens: the entry stored for the
/// nearest temperature, `false` when there is none.
///
/// ```
/// use spot_drafter::module_tokens::{ModuleTokens, nearest_enabled};
/// let at = |temperature, enabled| ModuleTokens { temperature, enabled };
/// let stored = [at(0.0, true), at(1.0, false), at(2.0, false)];
/// assert!(nearest_enabled(&stored, 0.0));
/// assert!(nearest_enabled(&stored, 0.4));
/// assert!(!nearest_enabled(&stored, 0.6));
/// assert!(!nearest_enabled(&[], 0.0));
/// ```
pub fn nearest_enabled(stored: &[ModuleTokens], temperature: f32) -> bool {
    nearest_temperature(stored, temperature, |m| Some(m.temperature)).is_some_and(|m| m.enabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_temperature_is_refused_naming_the_field() {
        for t in [f32::NAN, -1.0, f32::INFINITY] {
            let e = ModuleTokens {
                temperature: t,
                enabled: true,
            }
            .check()
            .unwrap_err();
            assert!(
                e.to_string().contains("module_tokens_by_temperature"),
                "{e}"
            );
        }
        assert!(
            ModuleTokens {
                temperature: 0.0,
                enabled: false
            }
            .check()
            .is_ok()
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let ok: ModuleTokens =
            serde_json::from_str(r#"{"temperature": 0.0, "enabled": true}"#).unwrap();
        assert!(ok.enabled);
        assert!(
            serde_json::from_str::<ModuleTokens>(
                r#"{"temperature": 0.0, "enabled": true, "weight": 1}"#
            )
            .is_err()
        );
    }
}
