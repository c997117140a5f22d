//! Chat templates: the Jinja `chat_template` of a model folder rendered in Rust (minijinja),
//! the way Python `transformers`' `apply_chat_template(tokenize=False)` renders it.
//!
//! The template comes from `chat_template.jinja` or from `tokenizer_config.json`'s
//! `chat_template` (a string, or a list of named templates of which `default` is used), with
//! its `bos_token` / `eos_token` (strings or `{"content": ...}` objects; an absent or null token
//! is undefined in the template, as in transformers). The environment matches transformers':
//! `trim_blocks`, `lstrip_blocks`, loop controls, Python string methods (`.strip()`,
//! `.startswith()`, `.split()`, ...), `raise_exception`, `strftime_now`, and a `tojson` that
//! writes `json.dumps(ensure_ascii=False)` output.
//!
//! ```
//! use spot_hf::chat::{ChatTemplate, Message};
//!
//! let t = ChatTemplate::new(
//!     "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\
//!      {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
//!     None,
//!     None,
//! )?;
//! let text = t.render(&[Message::user(" Hello! ")], true)?;
//! assert_eq!(text, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
//! # Ok::<(), spot_hf::ModelError>(())
//! ```

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::hf::read_json;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
}

/// A parsed chat template with its special tokens.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
    path: PathBuf,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TokenField {
    Text(String),
    Added { content: String },
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<TemplateField>,
    #[serde(default)]
    bos_token: Option<TokenField>,
    #[serde(default)]
    eos_token: Option<TokenField>,
}

fn token(t: Option<TokenField>) -> Option<String> {
    t.map(|t| match t {
        TokenField::Text(s) | TokenField::Added { content: s } => s,
    })
}

/// The most template instructions one render may execute: real chat templates need a few
/// hundred per message, so this allows conversations of thousands of turns and stops a hostile
/// template within about a second.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

impl ChatTemplate {
    /// A template from its source and special tokens (`None`: undefined in the template).
    pub fn new(source: &str, bos: Option<&str>, eos: Option<&str>) -> Result<Self> {
        Self::build(
            source.to_string(),
            bos.map(str::to_string),
            eos.map(str::to_string),
            PathBuf::from("<chat template>"),
        )
    }

    /// The template of a model folder: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template`. An absent template is an error naming the file and field.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let cfg: TokenizerConfig = if path.exists() {
            read_json(&path)?
        } else {
            TokenizerConfig {
                chat_template: None,
                bos_token: None,
                eos_token: None,
            }
        };
        let (bos, eos) = (token(cfg.bos_token), token(cfg.eos_token));
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?;
            return Self::build(source, bos, eos, jinja);
        }
        let missing = |reason: &str| ModelError::InvalidConfig {
            path: path.clone(),
            field: "chat_template",
            reason: reason.to_string(),
        };
        let source = match cfg.chat_template {
            Some(TemplateField::One(s)) => s,
            Some(TemplateField::Named(list)) => list
                .into_iter()
                .find(|t| t.name == "default")
                .map(|t| t.template)
                .ok_or_else(|| missing("a list of templates without one named \"default\""))?,
            None => {
                return Err(missing(
                    "absent (and there is no chat_template.jinja): the folder has no chat template",
                ));
            }
        };
        Self::build(source, bos, eos, path)
    }

    fn build(
        source: String,
        bos: Option<String>,
        eos: Option<String>,
        path: PathBuf,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A hostile template must not run for ever (`{% for i in range(99999) %}` nested).
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source)
            .map_err(|e| template_error(&path, &e))?;
        Ok(Self {
            env,
            bos,
            eos,
            path,
        })
    }

    /// A one-turn prompt: `system` (when given) and `user`, ending with the assistant's header.
    pub fn prompt(&self, system: Option<&str>, user: &str) -> Result<String> {
        let mut messages: Vec<Message> = system.map(Message::system).into_iter().collect();
        messages.push(Message::user(user));
        self.render(&messages, true)
    }

    /// Renders `messages` (a list of objects with at least `role` and `content`; any
    /// serialisable list works, e.g. `serde_json::Value`), ending with the assistant's header
    /// when `add_generation_prompt`.
    pub fn render<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| template_error(&self.path, &e))?;
        let mut ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            tools => Value::from(()),
            documents => Value::from(()),
        };
        if let Some(b) = &self.bos {
            ctx = context! { bos_token => b, ..ctx };
        }
        if let Some(e) = &self.eos {
            ctx = context! { eos_token => e, ..ctx };
        }
        tmpl.render(ctx).map_err(|e| template_error(&self.path, &e))
    }
}

fn template_error(path: &Path, e: &Error) -> ModelError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::ChatTemplate {
        path: path.to_path_buf(),
        message,
    }
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: today's UTC date with `%Y %m %d %B %b %e %H %M %S %%`.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_time(secs, &fmt)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn format_time(secs: u64, fmt: &str) -> String {
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// JSON as Python's `json.dumps(x, ensure_ascii=False)` writes it: `", "` and `": "`
/// separators, keys in their order, no HTML escaping.
fn tojson(value: Value) -> std::result::Result<Value, Error> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonJson);
    value
        .serialize(&mut ser)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

/// serde_json's compact output with Python's default separators.
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_json_follow_python() {
        // 2024-02-29 13:05:09 UTC.
        assert_eq!(
            format_time(1_709_211_909, "%d %B %Y, %b %e %H:%M:%S %%"),
            "29 February 2024, Feb 29 13:05:09 %"
        );
        let t = ChatTemplate::new("{{ x | tojson }}", None, None).unwrap();
        let x = Value::from_serialize(serde_json::json!({"b": [1, "é<"], "a": null}));
        let out = t
            .env
            .render_str("{{ x | tojson }}", context! { x => x })
            .unwrap();
        assert_eq!(out, r#"{"a": null, "b": [1, "é<"]}"#);
    }

    #[test]
    fn template_errors_are_typed() {
        let e = ChatTemplate::new("{% for %}", None, None).unwrap_err();
        assert!(matches!(e, ModelError::ChatTemplate { .. }), "{e}");
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        let e = t.render(&[Message::user("x")], false).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }
}
