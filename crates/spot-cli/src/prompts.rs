//! Prompt sets: one JSON object per line (JSONL), the prompt text in a chosen field.
//!
//! The workspace ships HumanEval's 164 prompts (`data/humaneval.jsonl`, field `prompt`) as the
//! default evaluation set; any JSONL file works, e.g. GSM8K (`question`), MBPP (`text`) or
//! MATH-500 (`prompt`). Without an explicit field the first of [`AUTO_FIELDS`] present in the
//! first record is used.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Fields tried, in order, when no field is named.
pub const AUTO_FIELDS: [&str; 5] = ["prompt", "question", "text", "input", "problem"];

/// Fields used as a prompt's identifier when present (else `line N`).
const ID_FIELDS: [&str; 3] = ["task_id", "id", "unique_id"];

/// One prompt of a set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// `task_id` / `id` / `unique_id` of the record, or `line N` (1-based).
    pub id: String,
    /// The prompt text.
    pub text: String,
}

/// Why a prompt file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The file could not be opened or read.
    #[error("cannot read prompt file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a JSON object.
    #[error("{path} line {line}: not a JSON object ({reason})")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Parser message.
        reason: String,
    },
    /// A record lacks the prompt field, or it is not a string.
    #[error("{path} line {line}: field `{field}` {problem}; fields present: {present}")]
    BadField {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The field looked for.
        field: String,
        /// `is missing` or `is not a string`.
        problem: &'static str,
        /// Comma-separated keys of the record.
        present: String,
    },
    /// No field was named and none of [`AUTO_FIELDS`] is in the first record.
    #[error("{path}: no prompt field given and none of {AUTO_FIELDS:?} present; fields: {present}")]
    NoAutoField {
        /// The file.
        path: PathBuf,
        /// Keys of the first record.
        present: String,
    },
    /// The file has no records.
    #[error("{path}: no prompts (empty file)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Reads the prompts of a JSONL file.
///
/// `field` names the prompt field (`None`: the first of [`AUTO_FIELDS`] present in the first
/// record); `limit` keeps the first `limit` prompts. Blank lines are skipped. Every other line
/// must be a JSON object holding the field as a string.
pub fn load_prompts(
    path: &Path,
    field: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<Prompt>, PromptError> {
    let text = std::fs::read_to_string(path).map_err(|source| PromptError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let limit = limit.unwrap_or(usize::MAX);
    let mut field: Option<String> = field.map(str::to_string);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if out.len() >= limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let lineno = i + 1;
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| PromptError::BadLine {
                path: path.to_path_buf(),
                line: lineno,
                reason: e.to_string(),
            })?;
        let Some(obj) = value.as_object() else {
            return Err(PromptError::BadLine {
                path: path.to_path_buf(),
                line: lineno,
                reason: "a JSON value that is not an object".into(),
            });
        };
        let present = || obj.keys().cloned().collect::<Vec<_>>().join(", ");
        let name = match &field {
            Some(f) => f.clone(),
            None => {
                let found = AUTO_FIELDS.iter().find(|f| obj.contains_key(**f));
                let Some(found) = found else {
                    return Err(PromptError::NoAutoField {
                        path: path.to_path_buf(),
                        present: present(),
                    });
                };
                field = Some((*found).to_string());
                (*found).to_string()
            }
        };
        let bad = |problem| PromptError::BadField {
            path: path.to_path_buf(),
            line: lineno,
            field: name.clone(),
            problem,
            present: present(),
        };
        let text = match obj.get(&name) {
            None => return Err(bad("is missing")),
            Some(v) => v.as_str().ok_or_else(|| bad("is not a string"))?,
        };
        let id = ID_FIELDS
            .iter()
            .find_map(|k| match obj.get(*k) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| format!("line {lineno}"));
        out.push(Prompt {
            id,
            text: text.to_string(),
        });
    }
    if out.is_empty() && limit > 0 {
        return Err(PromptError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// `--chat` and `--system`: prompts wrapped as a user message in the folder's chat template.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ChatArgs {
    /// Wrap each prompt as a user message in the folder's chat template
    /// (`tokenizer_config.json` or `chat_template.jinja`), ending with the assistant header.
    #[arg(long)]
    pub chat: bool,
    /// System message for `--chat`.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
}

impl ChatArgs {
    /// The folder's chat template with `--chat`, read and compiled once per run.
    pub fn template(&self, dir: &Path) -> anyhow::Result<Option<spot_models::chat::ChatTemplate>> {
        Ok(if self.chat {
            Some(spot_models::chat::ChatTemplate::from_dir(dir)?)
        } else {
            None
        })
    }

    /// The ids of prompt `text`: itself, or with `--chat` the rendered conversation.
    pub fn prompt_ids(
        &self,
        template: Option<&spot_models::chat::ChatTemplate>,
        tokenizer: Option<&spot_models::hf::Tokenizer>,
        text: &str,
    ) -> anyhow::Result<Vec<u32>> {
        let text = match template {
            Some(t) => t.prompt(self.system.as_deref(), text)?,
            None => text.to_string(),
        };
        Ok(tokenizer
            .context("prompt text needs tokenizer.json in the model folder; use --prompt-ids")?
            .encode(&text)?)
    }

    /// `(id, ids)` of every prompt of `set`, encoded with the folder `dir`'s tokenizer (and
    /// template with `--chat`).
    pub fn encode_all(
        &self,
        dir: &Path,
        tokenizer: Option<&spot_models::hf::Tokenizer>,
        set: &[Prompt],
    ) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
        let template = self.template(dir)?;
        set.iter()
            .map(|p| {
                let ids = self
                    .prompt_ids(template.as_ref(), tokenizer, &p.text)
                    .with_context(|| format!("prompt {}", p.id))?;
                Ok((p.id.clone(), ids))
            })
            .collect()
    }

    /// Every prompt set of `paths` (`--prompts`), named by its file stem, as `(id, ids)`
    /// ([`ChatArgs::encode_all`]; `field` and `limit` as [`load_prompts`] takes them).
    pub fn encode_sets(
        &self,
        paths: &[PathBuf],
        (field, limit): (Option<&str>, Option<usize>),
        dir: &Path,
        tokenizer: Option<&spot_models::hf::Tokenizer>,
    ) -> anyhow::Result<Vec<EncodedSet>> {
        paths
            .iter()
            .map(|p| {
                let name = p.file_stem().map_or_else(
                    || p.display().to_string(),
                    |s| s.to_string_lossy().into_owned(),
                );
                let set = load_prompts(p, field, limit)?;
                let encoded = self
                    .encode_all(dir, tokenizer, &set)
                    .with_context(|| p.display().to_string())?;
                Ok((name, encoded))
            })
            .collect()
    }
}

/// A prompt set's name and its prompts as `(id, token ids)`.
pub type EncodedSet = (String, Vec<(String, Vec<u32>)>);

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spot-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn auto_field_ids_limit_and_blank_lines() {
        let p = write(
            "a.jsonl",
            "{\"question\": \"q1\", \"answer\": \"a\"}\n\n{\"question\": \"q2\", \"id\": 7}\n{\"question\": \"q3\"}\n",
        );
        let v = load_prompts(&p, None, None).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].id, "line 1");
        assert_eq!(v[1].id, "7");
        assert_eq!(v[1].text, "q2");
        assert_eq!(v[2].id, "line 4");
        assert_eq!(load_prompts(&p, None, Some(2)).unwrap().len(), 2);
        assert_eq!(
            load_prompts(&p, Some("answer"), Some(1)).unwrap()[0].text,
            "a"
        );
    }

    #[test]
    fn shipped_humaneval_set_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/humaneval.jsonl");
        let v = load_prompts(&p, None, None).unwrap();
        assert_eq!(v.len(), 164);
        assert_eq!(v[0].id, "HumanEval/0");
        assert!(v[0].text.contains("def has_close_elements"));
        assert_eq!(v[163].id, "HumanEval/163");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let p = write("b.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": 3}\n");
        let e = load_prompts(&p, None, None).unwrap_err().to_string();
        assert!(
            e.contains("b.jsonl line 2") && e.contains("`prompt` is not a string"),
            "{e}"
        );
        let e = load_prompts(&p, Some("question"), None).unwrap_err();
        assert!(matches!(
            e,
            PromptError::BadField {
                line: 1,
                problem: "is missing",
                ..
            }
        ));
        assert!(e.to_string().contains("fields present: prompt"), "{e}");
        let p = write("c.jsonl", "{\"prompt\": \"x\"}\nnot json\n");
        let e = load_prompts(&p, None, None).unwrap_err();
        assert!(matches!(e, PromptError::BadLine { line: 2, .. }), "{e}");
        let p = write("d.jsonl", "[1, 2]\n");
        assert!(matches!(
            load_prompts(&p, None, None).unwrap_err(),
            PromptError::BadLine { line: 1, .. }
        ));
        let p = write("e.jsonl", "{\"other\": \"x\"}\n");
        let e = load_prompts(&p, None, None).unwrap_err();
        assert!(matches!(e, PromptError::NoAutoField { .. }), "{e}");
        let p = write("f.jsonl", "\n\n");
        assert!(matches!(
            load_prompts(&p, None, None).unwrap_err(),
            PromptError::Empty { .. }
        ));
        let e = load_prompts(Path::new("/nonexistent/p.jsonl"), None, None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/p.jsonl"), "{e}");
    }
}
