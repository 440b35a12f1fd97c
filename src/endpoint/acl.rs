//! What the ACL endpoints share (the ACL area's handlers are still
//! `http::acl`'s and `http::login`'s; logins are `endpoint::login`): Consul's
//! refusal with ACLs off, a write's answer as an error, and the times and
//! IDs of new ACL objects.

use crate::error::{Error, Result};
use crate::server::Server;
use crate::state::Response as Applied;
use crate::state::acl::BOOTSTRAP_DONE;

/// Consul answers ACL endpoints with ACLs off so.
pub fn enabled(s: &Server) -> Result<()> {
    if s.acl().enabled() {
        Ok(())
    } else {
        Err(Error::Unauthorized("ACL support disabled".into()))
    }
}

/// A write's answer as the caller's: a bootstrap done again is 403.
pub fn applied(r: Applied) -> Result<()> {
    match r {
        Applied::Ok => Ok(()),
        Applied::Rejected(reason) if reason.starts_with(BOOTSTRAP_DONE) => {
            Err(Error::Forbidden(format!("Permission denied: {reason}")))
        }
        Applied::Rejected(reason) => Err(Error::BadRequest(reason)),
        other => Err(Error::Internal(format!("unexpected answer {other:?}"))),
    }
}

/// A time as Consul's JSON writes it.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// A new object's ID or secret.
pub fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}
