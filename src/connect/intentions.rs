//! Intentions as Consul 1.9+ serves them: the sources of `service-intentions`
//! config entries, shown one by one as legacy `Intention`s, matched by
//! source or destination in precedence order, and decided for a
//! source → destination pair (`/check`, `/v1/agent/connect/authorize`,
//! proxycfg's snapshots).

use serde_json::Value;

use crate::discovery_chain::EntryLookup;
use crate::state::State;
use crate::structs::config_entry::{
    ConfigEntry, Kind, ServiceIntentionsConfigEntry, SourceIntention,
};
use crate::structs::connect::Intention;

/// The decision when no intention matches, as Consul's: allow with ACLs
/// off, else `--acl-default-policy`.
pub fn default_allow(acl: &crate::state::token_resolver::AclConfig) -> bool {
    !acl.enabled || acl.default_policy == crate::acl::DefaultPolicy::Allow
}

const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// One source of an entry as a legacy intention.
pub fn to_intention(entry: &ServiceIntentionsConfigEntry, s: &SourceIntention) -> Intention {
    Intention {
        id: s.legacy_id.clone(),
        description: s.description.clone(),
        source_peer: String::new(),
        source_ns: "default".into(),
        source_partition: "default".into(),
        source_name: s.name.clone(),
        destination_ns: "default".into(),
        destination_partition: "default".into(),
        destination_name: entry.name.clone(),
        source_type: s.type_.clone(),
        action: (s.permissions.is_empty()).then(|| s.action.clone()),
        permissions: s.permissions.clone(),
        meta: s.legacy_meta.clone(),
        precedence: s.precedence,
        created_at: s.legacy_create_time.clone().unwrap_or(ZERO_TIME.into()),
        updated_at: s.legacy_update_time.clone().unwrap_or(ZERO_TIME.into()),
        create_index: entry.create_index,
        modify_index: entry.modify_index,
    }
}

fn entries(state: &State) -> impl Iterator<Item = &ServiceIntentionsConfigEntry> {
    state
        .config
        .range((Kind::ServiceIntentions, String::new())..)
        .take_while(|((k, _), _)| *k == Kind::ServiceIntentions)
        .filter_map(|(_, e)| e.as_intentions())
}

/// Consul's evaluation order: precedence, highest first; ties by
/// destination then source name.
fn sort(list: &mut [Intention]) {
    list.sort_by(|a, b| {
        b.precedence
            .cmp(&a.precedence)
            .then_with(|| a.destination_name.cmp(&b.destination_name))
            .then_with(|| a.source_name.cmp(&b.source_name))
    });
}

/// Every intention.
pub fn all(state: &State) -> Vec<Intention> {
    let mut out: Vec<Intention> = entries(state)
        .flat_map(|e| e.sources.iter().map(move |s| to_intention(e, s)))
        .collect();
    sort(&mut out);
    out
}

/// The intentions that apply to connections into `destination` (its own
/// entry's and the `*` entry's), in evaluation order.
pub fn for_destination(state: &State, destination: &str) -> Vec<Intention> {
    let mut out = Vec::new();
    for name in [destination, "*"] {
        if let Some(e) = state
            .get(Kind::ServiceIntentions, name)
            .and_then(ConfigEntry::as_intentions)
        {
            out.extend(e.sources.iter().map(|s| to_intention(e, s)));
        }
        if destination == "*" {
            break;
        }
    }
    sort(&mut out);
    out
}

/// The intentions whose source is `source` or `*`, in evaluation order.
pub fn for_source(state: &State, source: &str) -> Vec<Intention> {
    let mut out: Vec<Intention> = all(state)
        .into_iter()
        .filter(|i| i.source_name == source || i.source_name == "*")
        .collect();
    sort(&mut out);
    out
}

/// The first intention (in evaluation order) matching `source` →
/// `destination`.
pub fn matching(state: &State, source: &str, destination: &str) -> Option<Intention> {
    for_destination(state, destination)
        .into_iter()
        .find(|i| i.source_name == source || i.source_name == "*")
}

/// The services `source` may dial, as Consul infers a transparent proxy's
/// upstreams (`IntentionTopology`): every typical service but `source`
/// whose first matching intention allows it (one with L7 permissions
/// counts: its requests are decided one by one), or, when none matches,
/// every one under a default allow.
pub fn allowed_upstreams(state: &State, source: &str, default_allow: bool) -> Vec<String> {
    crate::state::gateways::typical_services(state)
        .into_iter()
        .filter(|dest| dest != source)
        .filter(|dest| match matching(state, source, dest) {
            Some(i) => !i.permissions.is_empty() || i.action.as_deref() == Some("allow"),
            None => default_allow,
        })
        .collect()
}

/// Consul's `Intention.String()`.
pub fn describe(i: &Intention) -> String {
    let id = if i.id.is_empty() {
        String::new()
    } else {
        format!("ID: {}, ", i.id)
    };
    let detail = if i.permissions.is_empty() {
        format!(
            "Action: {}",
            i.action.clone().unwrap_or_default().to_uppercase()
        )
    } else {
        format!("Permissions: {}", i.permissions.len())
    };
    format!(
        "{} => {} ({id}Precedence: {}, {detail})",
        i.source_name, i.destination_name, i.precedence
    )
}

/// An L4 decision for `source` → `destination`, with Consul's reason: the
/// matching intention's action; one with L7 permissions denies (L4 cannot
/// honour them); none: the default.
pub fn authorize(
    state: &State, source: &str, destination: &str, default_allow: bool,
) -> (bool, String) {
    match matching(state, source, destination) {
        Some(i) if i.permissions.is_empty() => (
            i.action.as_deref() == Some("allow"),
            format!("Matched L4 intention: {}", describe(&i)),
        ),
        Some(i) => (false, format!("Matched L7 intention: {}", describe(&i))),
        None => (
            default_allow,
            "Default behavior configured by ACLs".to_string(),
        ),
    }
}

/// The `service-intentions` entry of `destination` with the source of
/// `intention` put in place of the one with its source name (legacy
/// writes), as a config entry body to propose.
pub fn upsert_source(
    existing: Option<&ServiceIntentionsConfigEntry>, intention: &Intention, legacy_id: &str,
    now: &str,
) -> Value {
    let mut entry = existing
        .cloned()
        .unwrap_or_else(|| ServiceIntentionsConfigEntry {
            kind: Kind::ServiceIntentions.as_str().into(),
            name: intention.destination_name.clone(),
            ..Default::default()
        });
    let old = entry
        .sources
        .iter()
        .position(|s| s.name == intention.source_name);
    let created = old
        .and_then(|i| entry.sources[i].legacy_create_time.clone())
        .unwrap_or_else(|| now.to_string());
    let source = SourceIntention {
        name: intention.source_name.clone(),
        action: intention.action.clone().unwrap_or_default(),
        permissions: intention.permissions.clone(),
        description: intention.description.clone(),
        type_: "consul".into(),
        legacy_id: legacy_id.to_string(),
        legacy_meta: intention.meta.clone(),
        legacy_create_time: (!legacy_id.is_empty()).then_some(created),
        legacy_update_time: (!legacy_id.is_empty()).then(|| now.to_string()),
        ..Default::default()
    };
    match old {
        Some(i) => entry.sources[i] = source,
        None => entry.sources.push(source),
    }
    entry_body(&entry)
}

/// The entry as a config write body (without its indexes).
pub fn entry_body(entry: &ServiceIntentionsConfigEntry) -> Value {
    let mut v = ConfigEntry::ServiceIntentions(entry.clone()).to_json();
    if let Value::Object(m) = &mut v {
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
        if let Some(Value::Array(sources)) = m.get_mut("Sources") {
            for s in sources {
                if let Value::Object(s) = s {
                    s.remove("Precedence");
                }
            }
        }
    }
    v
}
