//! Typed errors, and the one place they become HTTP status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input: a one-line reason, nothing changed.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
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

impl Error {
    pub fn bad(msg: impl Into<String>) -> Self {
        Error::BadRequest(msg.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
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

/// A client agent's failed request to its servers, as its HTTP API
/// answers it: none reachable is Consul's "No known Consul servers".
impl From<crate::agent::ServerError> for Error {
    fn from(e: crate::agent::ServerError) -> Self {
        match e {
            crate::agent::ServerError::Unreachable(_) => {
                Error::Internal("No known Consul servers".into())
            }
            other => Error::Internal(other.to_string()),
        }
    }
}

/// A refused maintenance request, with Consul's codes: a missing or bad
/// `enable` is 400, an unknown service 404.
impl From<crate::agent::MaintenanceError> for Error {
    fn from(e: crate::agent::MaintenanceError) -> Self {
        use crate::agent::MaintenanceError as M;
        match e {
            M::MissingEnable | M::InvalidEnable(_) | M::MissingService => {
                Error::BadRequest(e.to_string())
            }
            M::UnknownService(_) => Error::NotFound(e.to_string()),
        }
    }
}
