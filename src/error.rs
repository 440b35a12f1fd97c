//! Typed errors, and the one place they become HTTP status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Bad input: a one-line reason, nothing changed.
    #[error("{0}")]
    BadRequest(String),
    /// A body, value or write past its size limit (Consul's 413): it could
    /// never be accepted, so nothing was proposed.
    #[error("{0}")]
    TooLarge(String),
    /// This server is over a queue or connection budget right now: nothing
    /// was changed, and the same request may succeed later (Consul's rate
    /// limiter answers 429 too).
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NotFound(String),
    /// Refused by ACLs: Consul's `Permission denied: …` or `ACL not found`
    /// (a 403), nothing read or changed.
    #[error("{0}")]
    Forbidden(String),
    /// An ACL endpoint with ACLs off (Consul's 401 `ACL support disabled`).
    #[error("{0}")]
    Unauthorized(String),
    /// No leader could be reached within the hold time.
    #[error("No cluster leader")]
    NoLeader,
    /// Leadership moved while a write was in flight: it may or may not commit.
    #[error("leadership lost while committing log")]
    LeadershipLost,
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed ACL check is Consul's 403 with its `Permission denied` text.
impl From<crate::acl::Denied> for Error {
    fn from(d: crate::acl::Denied) -> Self {
        Error::Forbidden(d.to_string())
    }
}

impl Error {
    pub fn bad(msg: impl Into<String>) -> Self {
        Error::BadRequest(msg.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Error::NoLeader | Error::LeadershipLost | Error::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        crate::metrics::HTTP_ERRORS.inc();
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        (status, self.to_string()).into_response()
    }
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Error::Internal(e.to_string())
    }
}
