//! Typed errors. They carry no HTTP type: the one table that turns them
//! into status codes and Consul's bodies is `request::error`, in the HTTP
//! layer.

#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
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
    /// `?dc=` names a datacenter this server knows no server of (Consul's
    /// 500 and words).
    #[error("No path to datacenter")]
    NoPathToDatacenter,
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
}

/// The one table from domain errors to gRPC status codes (as
/// `request::error` is to HTTP's), for every gRPC service: the codes
/// Consul's gRPC endpoints answer with, the error's text as the message.
impl From<&Error> for tonic::Status {
    fn from(e: &Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::BadRequest(_) => tonic::Status::invalid_argument(msg),
            Error::TooLarge(_) | Error::Busy(_) => tonic::Status::resource_exhausted(msg),
            Error::NotFound(_) => tonic::Status::not_found(msg),
            Error::Forbidden(_) => tonic::Status::permission_denied(msg),
            // ACLs off: the call cannot be answered in this state.
            Error::Unauthorized(_) => tonic::Status::failed_precondition(msg),
            Error::NoLeader | Error::LeadershipLost | Error::NoPathToDatacenter => {
                tonic::Status::unavailable(msg)
            }
            Error::Internal(_) => tonic::Status::internal(msg),
        }
    }
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Error::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// The gRPC table: each kind answers the code Consul's gRPC services
    /// use, with the error's text.
    #[test]
    fn every_kind_has_its_grpc_code() {
        let cases = [
            (Error::bad("bad"), Code::InvalidArgument),
            (Error::TooLarge("big".into()), Code::ResourceExhausted),
            (Error::Busy("busy".into()), Code::ResourceExhausted),
            (Error::NotFound("nope".into()), Code::NotFound),
            (
                Error::Forbidden("Permission denied".into()),
                Code::PermissionDenied,
            ),
            (
                Error::Unauthorized("ACL support disabled".into()),
                Code::FailedPrecondition,
            ),
            (Error::NoLeader, Code::Unavailable),
            (Error::LeadershipLost, Code::Unavailable),
            (Error::NoPathToDatacenter, Code::Unavailable),
            (Error::Internal("boom".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let status = tonic::Status::from(&e);
            assert_eq!((status.code(), status.message()), (code, &*e.to_string()));
        }
    }
}
