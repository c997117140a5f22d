//! Hugging Face model folders without a tensor library: `config.json` and
//! `generation_config.json` reading, safetensors weights (memory-mapped, any shard layout), the
//! tokenizer, the Jinja chat template and stop strings, with [`ModelError`], the error that
//! names the file, field or tensor at fault.
//!
//! `spot-models` builds the burn families on top of it; `spot-serve` needs only this crate, so
//! a server compiles no tensor library.
//!
//! ```no_run
//! use spot_hf::{StopStrings, chat::ChatTemplate, hf::Tokenizer};
//! let dir = std::path::Path::new("models/sdar-tiny-code");
//! let tokenizer = Tokenizer::open(dir)?;
//! let template = ChatTemplate::from_dir(dir)?;
//! let stops = StopStrings::new(&tokenizer, vec!["\n\n".to_string()])?;
//! println!("{} tokens", tokenizer.vocab_size());
//! # Ok::<(), spot_hf::ModelError>(())
//! ```

pub mod chat;
mod error;
pub mod hf;
mod stop;

pub use error::{ModelError, Result};
pub use stop::StopStrings;
