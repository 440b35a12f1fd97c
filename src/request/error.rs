//! The one table from domain errors (`crate::error::Error`) to HTTP: the
//! status code per kind, and Consul's body (the error's text, plain). Both
//! routers (the servers' and the agents') answer errors through it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// The status code an error is answered with.
pub fn status(e: &Error) -> StatusCode {
    match e {
        Error::BadRequest(_) => StatusCode::BAD_REQUEST,
        Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        Error::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Forbidden(_) => StatusCode::FORBIDDEN,
        Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        Error::NoLeader
        | Error::LeadershipLost
        | Error::Internal(_)
        | Error::NoPathToDatacenter => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        crate::metrics::HTTP_ERRORS.inc();
        let status = status(&self);
        if status.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        (status, self.to_string()).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_consuls_status_and_its_text_as_the_body() {
        let cases = [
            (Error::bad("Missing node name"), 400),
            (Error::TooLarge("too big".into()), 413),
            (Error::Busy("busy".into()), 429),
            (Error::NotFound("nope".into()), 404),
            (Error::Forbidden("Permission denied".into()), 403),
            (Error::Unauthorized("ACL support disabled".into()), 401),
            (Error::NoLeader, 500),
            (Error::LeadershipLost, 500),
            (Error::Internal("boom".into()), 500),
        ];
        for (e, code) in cases {
            assert_eq!(status(&e).as_u16(), code, "{e:?}");
        }
        assert_eq!(Error::NoLeader.to_string(), "No cluster leader");
    }
}
