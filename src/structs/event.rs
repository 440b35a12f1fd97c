//! Consul's user events (`/v1/event/*`): the event as its JSON shows it,
//! what a fire must satisfy, which agents it is for, and the index a list
//! of them reports.

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Consul's limit on an event's name and payload together (serf's
/// `UserEventSizeLimit`): events are meant to be small signals.
pub const SIZE_LIMIT: usize = 512;

/// How many events an agent keeps (Consul's `userEventBufferSize`), and
/// how many the servers keep for agents to follow.
pub const RING: usize = 256;

/// Where agents read the servers' ring of events (`http::event`).
pub const RING_PATH: &str = "/v1/internal/event/ring";

/// The event version this server writes and understands.
pub const VERSION: u32 = 1;

/// A user event, in Consul's JSON (`Payload` base64, null when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEvent {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(
        rename = "Payload",
        serialize_with = "payload_out",
        deserialize_with = "payload_in",
        default
    )]
    pub payload: Option<Vec<u8>>,
    #[serde(rename = "NodeFilter", default)]
    pub node_filter: String,
    #[serde(rename = "ServiceFilter", default)]
    pub service_filter: String,
    #[serde(rename = "TagFilter", default)]
    pub tag_filter: String,
    #[serde(rename = "Version", default)]
    pub version: u32,
    /// Its place in the order of events: set when the servers apply it.
    #[serde(rename = "LTime", default)]
    pub ltime: u64,
}

fn payload_out<S: Serializer>(p: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(v) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v)),
        None => s.serialize_none(),
    }
}

fn payload_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
}

/// Why a fire is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    #[error("User event missing name")]
    MissingName,
    #[error("Cannot provide tag filter without service filter")]
    TagWithoutService,
    #[error("Invalid {0} filter: {1}")]
    BadFilter(&'static str, String),
    /// Consul's (serf's) words; a 413.
    #[error("user event exceeds configured limit of {SIZE_LIMIT} bytes before encoding")]
    TooLarge,
}

impl UserEvent {
    /// Checks what Consul checks before it sends an event: a name, a tag
    /// filter only with a service filter, filters that compile, and the
    /// size of name and payload.
    pub fn validate(&self) -> Result<(), EventError> {
        if self.name.is_empty() {
            return Err(EventError::MissingName);
        }
        if !self.tag_filter.is_empty() && self.service_filter.is_empty() {
            return Err(EventError::TagWithoutService);
        }
        for (what, f) in [
            ("node", &self.node_filter),
            ("service", &self.service_filter),
            ("tag", &self.tag_filter),
        ] {
            if !f.is_empty() {
                filter(f).map_err(|e| EventError::BadFilter(what, e))?;
            }
        }
        if self.name.len() + self.payload.as_ref().map_or(0, Vec::len) > SIZE_LIMIT {
            return Err(EventError::TooLarge);
        }
        Ok(())
    }

    /// Whether the agent of `node`, running `services` (ID, name, tags),
    /// is to receive this event (Consul's `shouldProcessUserEvent`): the
    /// node filter matches its name; the service filter one of its
    /// services (by ID or name), and the tag filter one of that service's
    /// tags. An event of a newer version, or whose filter does not
    /// compile, is for no one.
    pub fn is_for<'a>(
        &self, node: &str, services: impl IntoIterator<Item = (&'a str, &'a str, &'a [String])>,
    ) -> bool {
        if self.version > VERSION {
            return false;
        }
        if !self.node_filter.is_empty() {
            match filter(&self.node_filter) {
                Ok(re) if re.is_match(node) => {}
                _ => return false,
            }
        }
        if self.service_filter.is_empty() {
            return true;
        }
        let Ok(service) = filter(&self.service_filter) else {
            return false;
        };
        let tag = match self.tag_filter.as_str() {
            "" => None,
            t => match filter(t) {
                Ok(re) => Some(re),
                Err(_) => return false,
            },
        };
        services.into_iter().any(|(id, name, tags)| {
            (service.is_match(id) || service.is_match(name))
                && tag
                    .as_ref()
                    .is_none_or(|t| tags.iter().any(|x| t.is_match(x)))
        })
    }
}

/// A filter as Go's `regexp.Compile` takes it (unanchored), bounded in
/// size so that a fire cannot make every agent compile a huge automaton.
fn filter(re: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(re)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| e.to_string())
}

/// The index of a list of events, as Consul derives it from the last
/// one's ID (its UUID's two 64-bit halves XORed; not monotonic, so a
/// blocking list waits while the index *equals* the caller's). An empty
/// list is 1, never 0, so that a watcher does not spin.
pub fn list_index(events: &[UserEvent]) -> u64 {
    events.last().map_or(1, |e| id_index(&e.id))
}

/// The index an event's ID stands for (Consul's `uuidToUint64`), never 0.
pub fn id_index(id: &str) -> u64 {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    let half = |r: std::ops::Range<usize>| {
        hex.get(r)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    };
    match half(0..16) ^ half(16..32) {
        0 => 1,
        i => i,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(node: &str, service: &str, tag: &str) -> UserEvent {
        UserEvent {
            id: "0c4a4a3a-6b1e-4d5f-9a2b-3c4d5e6f7a8b".into(),
            name: "deploy".into(),
            payload: Some(b"v2".to_vec()),
            node_filter: node.into(),
            service_filter: service.into(),
            tag_filter: tag.into(),
            version: VERSION,
            ltime: 0,
        }
    }

    #[test]
    fn json_is_consuls() {
        let v = serde_json::to_value(event("", "", "")).unwrap();
        assert_eq!(v["Payload"], "djI=");
        assert_eq!(v["Version"], 1);
        let none = UserEvent {
            payload: None,
            ..event("", "", "")
        };
        assert!(serde_json::to_value(&none).unwrap()["Payload"].is_null());
        let back: UserEvent = serde_json::from_value(v).unwrap();
        assert_eq!(back.payload.as_deref(), Some(&b"v2"[..]));
    }

    #[test]
    fn validation_in_consuls_words() {
        assert_eq!(
            event("", "", "x").validate(),
            Err(EventError::TagWithoutService)
        );
        assert!(matches!(
            event("(", "", "").validate(),
            Err(EventError::BadFilter("node", _))
        ));
        let big = UserEvent {
            payload: Some(vec![b'x'; SIZE_LIMIT - "deploy".len() + 1]),
            ..event("", "", "")
        };
        assert_eq!(big.validate(), Err(EventError::TooLarge));
        let fits = UserEvent {
            payload: Some(vec![b'x'; SIZE_LIMIT - "deploy".len()]),
            ..event("", "", "")
        };
        assert_eq!(fits.validate(), Ok(()));
    }

    #[test]
    fn filters_pick_agents() {
        let tags = vec!["v1".to_string(), "primary".to_string()];
        let web = [("web-1", "web", tags.as_slice())];
        assert!(event("", "", "").is_for("n1", []));
        assert!(event("^n", "", "").is_for("n1", []));
        assert!(!event("^m", "", "").is_for("n1", []));
        assert!(event("", "web", "").is_for("n1", web));
        assert!(!event("", "db", "").is_for("n1", web));
        assert!(event("", "^web$", "prim").is_for("n1", web));
        assert!(!event("", "web", "^secondary$").is_for("n1", web));
        assert!(!event("", "web", "").is_for("n1", []));
        let newer = UserEvent {
            version: VERSION + 1,
            ..event("", "", "")
        };
        assert!(!newer.is_for("n1", []));
    }

    #[test]
    fn index_from_the_last_id() {
        assert_eq!(list_index(&[]), 1);
        let e = event("", "", "");
        assert_eq!(list_index(&[e]), 0x0c4a4a3a6b1e4d5f ^ 0x9a2b3c4d5e6f7a8b);
    }
}
