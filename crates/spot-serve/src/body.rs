//! Reading request bodies field by field: every field is typed and named in its error, and a
//! field the endpoint does not know is refused (serde's `deny_unknown_fields` cannot name the
//! shared fields of two endpoints without repeating them).

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object whose fields are taken one by one; [`Fields::finish`] refuses what is left.
pub(crate) struct Fields {
    map: Map<String, Value>,
}

impl Fields {
    /// The body's object; anything else (not JSON, not an object) is a 400.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
        match value {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::bad_request(format!(
                "the body must be a JSON object, got {}",
                kind(&other)
            ))),
        }
    }

    /// Field `key` as a `T`; absent or `null` is `None`.
    pub fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ApiError> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| ApiError::invalid(key, format!("invalid `{key}`: {e}"))),
        }
    }

    /// Field `key`, which must be present.
    pub fn require<T: DeserializeOwned>(&mut self, key: &str) -> Result<T, ApiError> {
        self.take(key)?
            .ok_or_else(|| ApiError::invalid(key, format!("`{key}` is required")))
    }

    /// A field this server accepts only at its neutral value (e.g. `top_p` 1): another value
    /// is refused as unsupported instead of being ignored.
    pub fn neutral(&mut self, key: &str, ok: impl Fn(&Value) -> bool) -> Result<(), ApiError> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(()),
            Some(v) if ok(&v) => Ok(()),
            Some(v) => Err(ApiError::invalid(
                key,
                format!("`{key}` = {v} is not supported by this server"),
            )),
        }
    }

    /// Refuses the fields nobody took.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => Err(ApiError::invalid(k.clone(), format!("unknown field `{k}`"))),
        }
    }
}

/// The JSON kind of a value, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_typed_named_and_unknown_ones_refused() {
        let mut f = Fields::parse(br#"{"a": 1, "b": "x", "c": null, "top_p": 0.5}"#).unwrap();
        assert_eq!(f.take::<u32>("a").unwrap(), Some(1));
        let e = f.take::<u32>("b").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("b"));
        assert_eq!(f.take::<u32>("c").unwrap(), None);
        let e = f.neutral("top_p", |v| v.as_f64() == Some(1.0)).unwrap_err();
        assert!(e.message.contains("not supported"), "{e}");
        let mut f = Fields::parse(br#"{"zz": 1}"#).unwrap();
        assert!(f.require::<u32>("a").is_err());
        assert_eq!(f.finish().unwrap_err().param.as_deref(), Some("zz"));
        assert!(Fields::parse(b"[1]").is_err());
        assert!(Fields::parse(b"{").is_err());
    }
}
