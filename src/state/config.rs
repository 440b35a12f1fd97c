//! The config entry table: writes with Consul's CAS semantics and
//! discovery-chain graph validation, and the `EntryLookup` the compiler
//! reads through.
//!
//! Graph validation runs inside apply, against the exact state the write
//! lands on, so two racing writes can never together break a chain.

use std::sync::Arc;

use serde_json::Value;

use super::tx::Tx;
use super::tx::pair_key;
use super::{Response, Row, State, Table, keys};
use crate::config_check::decode_and_validate;
use crate::discovery_chain::{EntryChange, EntryLookup, references, validate_write};
use crate::structs::config_entry::{ConfigEntry, Kind};

pub fn set(tx: &mut Tx, body: &Value, cas: Option<u64>) -> Response {
    let mut entry = match decode_and_validate(body) {
        Ok(e) => e,
        Err(e) => return Response::Rejected(e.to_string()),
    };
    let existing = tx
        .state
        .config
        .get(&(entry.kind(), entry.name().to_string()))
        .cloned();
    if let Some(cas) = cas {
        let ok = match &existing {
            None => cas == 0,
            Some(e) => e.modify_index() == cas,
        };
        if !ok {
            return Response::Bool(false);
        }
    }
    if let Err(e) = validate_write(&*tx.state, &EntryChange::Upsert(entry.clone())) {
        return Response::Rejected(e.to_string());
    }
    let create = existing.as_ref().map_or(tx.index, |e| e.create_index());
    entry.set_indexes(create, tx.index);
    if let Some(old) = &existing {
        let mut same = (**old).clone();
        same.set_indexes(create, tx.index);
        if same == entry {
            // Unchanged: keep the indexes, wake nobody.
            return Response::Bool(true);
        }
    }
    tx.put_config(entry);
    Response::Bool(true)
}

pub fn delete(tx: &mut Tx, kind: &str, name: &str, cas: Option<u64>) -> Response {
    let kind: Kind = match kind.parse() {
        Ok(k) => k,
        Err(e) => return Response::Rejected(e),
    };
    let existing = tx.state.config.get(&(kind, name.to_string())).cloned();
    if let Some(cas) = cas
        && existing.as_ref().map(|e| e.modify_index()) != Some(cas)
    {
        return Response::Bool(false);
    }
    if existing.is_none() {
        return Response::Bool(true);
    }
    let change = EntryChange::Delete {
        kind,
        name: name.to_string(),
    };
    if let Err(e) = validate_write(&*tx.state, &change) {
        return Response::Rejected(e.to_string());
    }
    tx.remove_config(kind, name);
    Response::Bool(true)
}

/// Replication from the primary (`Command::ConfigReplicate`): its entries
/// as it has them, replacing these whole, and those it no longer has
/// removed. The graph is not checked entry by entry: the primary's whole
/// set passed its checks there, and one entry of it may only make sense
/// with another of the same batch. An entry that does not decode (a kind
/// this server does not serve) is left out.
pub fn replicate(tx: &mut Tx, set: &[Value], delete: &[(String, String)]) -> Response {
    for (kind, name) in delete {
        if let Ok(kind) = kind.parse::<Kind>() {
            tx.remove_config(kind, name);
        }
    }
    for body in set {
        let Ok(mut entry) = from_stored(body) else {
            continue;
        };
        let existing = tx
            .state
            .config
            .get(&(entry.kind(), entry.name().to_string()))
            .cloned();
        let create = existing.as_ref().map_or(tx.index, |e| e.create_index());
        entry.set_indexes(create, tx.index);
        tx.put_config(entry);
    }
    Response::Ok
}

/// Records what `entry` refers to in the reverse index.
pub(crate) fn index(state: &mut State, entry: &Arc<ConfigEntry>) {
    if !entry.kind().is_chain_graph() {
        return;
    }
    for target in references(entry) {
        *state
            .config_refs
            .entry(target)
            .or_default()
            .entry(entry.name().to_string())
            .or_default() += 1;
    }
}

pub(crate) fn unindex(state: &mut State, entry: &ConfigEntry) {
    if !entry.kind().is_chain_graph() {
        return;
    }
    for target in references(entry) {
        if let Some(by) = state.config_refs.get_mut(&target) {
            let gone = match by.get_mut(entry.name()) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => true,
                None => false,
            };
            if gone {
                by.remove(entry.name());
            }
            if by.is_empty() {
                state.config_refs.remove(&target);
            }
        }
    }
}

impl EntryLookup for State {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry> {
        self.config.get(&(kind, name.to_string())).map(|e| &**e)
    }

    fn list(&self, kind: Kind) -> Vec<&ConfigEntry> {
        self.config
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .map(|(_, e)| &**e)
            .collect()
    }

    fn referrers(&self, service: &str) -> Vec<String> {
        self.config_refs
            .get(service)
            .map(|by| by.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// An entry as persisted and snapshotted: its Consul JSON with indexes.
pub(crate) fn to_stored(entry: &ConfigEntry) -> Value {
    entry.to_json()
}

/// Reads back what `to_stored` wrote.
pub(crate) fn from_stored(v: &Value) -> anyhow::Result<ConfigEntry> {
    let mut body = v.clone();
    let index = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (create, modify) = (index("CreateIndex"), index("ModifyIndex"));
    if let Value::Object(m) = &mut body {
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
    }
    let mut entry = crate::config_check::decode_entry(&body)
        .map_err(|e| anyhow::anyhow!("stored config entry: {e}"))?;
    entry.set_indexes(create, modify);
    Ok(entry)
}

impl Tx<'_> {
    pub fn put_config(&mut self, entry: ConfigEntry) {
        let key = (entry.kind(), entry.name().to_string());
        let after = Arc::new(entry);
        let before = self.state.config.insert(key.clone(), after.clone());
        if let Some(b) = &before {
            super::config::unindex(self.state, b);
        }
        super::config::index(self.state, &after);
        self.touch(keys::config(key.0.as_str(), &key.1));
        self.touch(keys::config_kind(key.0.as_str()));
        if key.0 == Kind::TerminatingGateway {
            self.terminating_links_changed(before.as_deref(), Some(&after));
        }
        self.record(
            Table::Config,
            pair_key(key.0.as_str(), &key.1),
            before.map(Row::Config),
            Some(Row::Config(after)),
        );
    }

    pub fn remove_config(&mut self, kind: Kind, name: &str) {
        if let Some(before) = self.state.config.remove(&(kind, name.to_string())) {
            super::config::unindex(self.state, &before);
            self.touch(keys::config(kind.as_str(), name));
            self.touch(keys::config_kind(kind.as_str()));
            if kind == Kind::TerminatingGateway {
                self.terminating_links_changed(Some(&before), None);
            }
            self.record(
                Table::Config,
                pair_key(kind.as_str(), name),
                Some(Row::Config(before)),
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::discovery_chain::graph::affected_chains;
    use crate::state::{Command, apply_command};

    /// `n` services, each with its own service-defaults, resolver and router.
    fn populated(n: usize) -> State {
        let mut st = State::default();
        let mut index = 1;
        for i in 0..n {
            for entry in [
                json!({"Kind": "service-defaults", "Name": format!("s{i}"), "Protocol": "http"}),
                json!({"Kind": "service-resolver", "Name": format!("s{i}"),
                       "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}}}),
                json!({"Kind": "service-router", "Name": format!("s{i}"),
                       "Routes": [{"Match": {"HTTP": {"PathPrefix": "/v1"}},
                                   "Destination": {"ServiceSubset": "v1"}}]}),
            ] {
                index += 1;
                let (r, _) =
                    apply_command(&mut st, index, &Command::ConfigSet { entry, cas: None });
                assert_eq!(r, Response::Bool(true));
            }
        }
        st
    }

    #[test]
    fn a_write_only_recompiles_the_chains_it_affects() {
        let st = populated(2_000);
        let affected = affected_chains(&st, Kind::ServiceDefaults, "s42");
        assert_eq!(
            affected.into_iter().collect::<Vec<_>>(),
            vec!["s42".to_string()]
        );
    }

    /// `cargo test --release --lib config_write_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn config_write_cost() {
        for n in [100, 10_000] {
            let st = populated(n);
            let rounds = 200;
            let started = Instant::now();
            for r in 0..rounds {
                let mut st = st.clone();
                let entry = json!({"Kind": "service-defaults", "Name": "s7", "Protocol": "http",
                                   "Meta": {"round": r.to_string()}});
                apply_command(
                    &mut st,
                    1_000_000 + r,
                    &Command::ConfigSet { entry, cas: None },
                );
            }
            let per = started.elapsed() / rounds as u32;
            println!("config write with {n} services having their own entries: {per:?} per write");
        }
    }
}
