//! Errors: what the HTTP side answers (OpenAI's error body) and what starting a server can
//! fail with.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A failed request, answered as OpenAI does: `{"error": {"message", "type", "param",
/// "code"}}` with an HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status (400 for every fault of the request).
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The field at fault, when one is (`"temperature"`, `"messages[1].content"`).
    pub param: Option<String>,
    /// A short machine-readable code (`"model_not_found"`, `"context_length_exceeded"`).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (e.g. its body is not JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A status other than 400 (404 for an unknown route, 503 when the queue is full, 500).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// OpenAI's `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} ({p}): {}", self.status, self.message),
            None => write!(f, "{}: {}", self.status, self.message),
        }
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Full or draining: a client may try again after a second.
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}

/// Why a server did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// Loading the model (on the engine thread) failed.
    #[error("loading the model failed: {0}")]
    Load(String),
    /// A setting is out of range.
    #[error("invalid server setting `{field}`: {reason}")]
    Setting {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The async runtime or the HTTP server failed.
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The engine thread ended unexpectedly (a panic in a model or strategy).
    #[error("the decoding engine stopped: {0}")]
    Engine(String),
}
