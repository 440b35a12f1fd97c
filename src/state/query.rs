//! Prepared queries in the state: one meta row each (`query/<id>`),
//! written whole by `Command::QuerySet`, removed by `Command::QueryDelete`
//! or with the session they are bound to; in the snapshot trailer.
//! `resolve` finds what an execute by ID or name runs: a query by ID, a
//! query by its whole name, else the template with the longest name that
//! prefixes it, rendered for that name.

use std::sync::Arc;

use super::tx::Tx;
use super::{Response, Row, State, Table, keys};
use crate::structs::query::{PreparedQuery, Template};

/// The meta row of query `id`.
pub fn row_key(id: &str) -> String {
    format!("query/{id}")
}

/// Names are matched in any case, as Consul's name index is.
fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Creates (`update` false) or replaces a query, after the checks only the
/// state can make, in Consul's words.
pub fn set(tx: &mut Tx, query: &PreparedQuery, update: bool) -> Response {
    let current = tx.state.queries.get(&query.id).cloned();
    match (&current, update) {
        (None, true) => {
            return Response::Rejected(format!(
                "Cannot modify non-existent prepared query: '{}'",
                query.id
            ));
        }
        (Some(_), false) => {
            return Response::Rejected(format!("Query ID '{}' is already in use", query.id));
        }
        _ => {}
    }
    let others = || tx.state.queries.values().filter(|q| q.id != query.id);
    if !query.name.is_empty() {
        if others().any(|q| same_name(&q.name, &query.name)) {
            return Response::Rejected(format!(
                "name '{}' aliases an existing query name",
                query.name
            ));
        }
        if tx.state.queries.keys().any(|id| same_name(id, &query.name)) {
            return Response::Rejected(format!(
                "name '{}' aliases an existing query ID",
                query.name
            ));
        }
    } else if query.is_template() && others().any(|q| q.is_template() && q.name.is_empty()) {
        return Response::Rejected("a query template with an empty name already exists".into());
    }
    if !query.session.is_empty() && !tx.state.sessions.contains_key(&query.session) {
        return Response::Rejected(format!("invalid session {:?}", query.session));
    }
    // Checked by the proposer; checked again so that no entry, however it
    // was made, stores a query that cannot be executed.
    if let Err(e) = query.validate() {
        return Response::Rejected(e);
    }
    let mut next = query.clone();
    next.create_index = current.as_ref().map_or(tx.index, |c| c.create_index);
    next.modify_index = tx.index;
    tx.put_query(Arc::new(next));
    Response::Ok
}

/// Deletes a query; an unknown one changes nothing.
pub fn delete(tx: &mut Tx, id: &str) -> Response {
    if tx.state.queries.contains_key(id) {
        tx.remove_query(id);
    }
    Response::Ok
}

/// A session was invalidated: the queries bound to it go with it (Consul).
pub fn session_gone(tx: &mut Tx, session: &str) {
    let bound: Vec<String> = tx
        .state
        .queries
        .values()
        .filter(|q| q.session == session)
        .map(|q| q.id.clone())
        .collect();
    for id in bound {
        tx.remove_query(&id);
    }
}

/// Looks like a query ID (a UUID): tried as one before as a name.
fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::parse_str(s).is_ok()
}

/// The query `id_or_name` executes, rendered when it is a template; `None`
/// when nothing matches. `segment` is the asking agent's network segment.
pub fn resolve(state: &State, id_or_name: &str, segment: &str) -> Option<PreparedQuery> {
    if id_or_name.is_empty() {
        return None;
    }
    let found = is_uuid(id_or_name)
        .then(|| state.queries.get(id_or_name))
        .flatten()
        .or_else(|| {
            let lower = id_or_name.to_ascii_lowercase();
            state
                .queries
                .values()
                .filter(|q| {
                    if q.is_template() {
                        lower.starts_with(&q.name.to_ascii_lowercase())
                    } else {
                        !q.name.is_empty() && same_name(&q.name, id_or_name)
                    }
                })
                .max_by_key(|q| q.name.len())
        })?;
    if !found.is_template() {
        return Some((**found).clone());
    }
    // Compiled when stored: a failure here means a definition from a
    // version that checked less; it matches nothing.
    let t = Template::compile(found).ok()?;
    Some(t.render(id_or_name, segment))
}

impl Tx<'_> {
    pub fn put_query(&mut self, q: Arc<PreparedQuery>) {
        let before = self.state.queries.insert(q.id.clone(), q.clone());
        self.record(
            Table::Meta,
            row_key(&q.id),
            before.map(Row::Query),
            Some(Row::Query(q)),
        );
        self.touch(keys::QUERIES);
    }

    pub fn remove_query(&mut self, id: &str) {
        let before = self.state.queries.remove(id);
        self.record(Table::Meta, row_key(id), before.map(Row::Query), None);
        self.touch(keys::QUERIES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, MemoryBackend, Store, apply_command, snapshot};
    use crate::structs::query::{NAME_PREFIX_MATCH, QueryTemplate, ServiceQuery};

    fn query(id: &str, name: &str, service: &str) -> PreparedQuery {
        PreparedQuery {
            id: id.into(),
            name: name.into(),
            service: ServiceQuery {
                service: service.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn set_cmd(q: PreparedQuery, update: bool) -> Command {
        Command::QuerySet {
            query: Box::new(q),
            update,
        }
    }

    const A: &str = "8f246b77-f3e1-ff88-5b48-8ec93abf3e05";
    const B: &str = "8f246b77-f3e1-ff88-5b48-8ec93abf3e06";
    const C: &str = "8f246b77-f3e1-ff88-5b48-8ec93abf3e07";

    /// Names are unique in any case, may not alias an ID, and resolve
    /// exactly for queries and by longest prefix for templates.
    #[test]
    fn names_are_unique_and_resolve_by_longest_prefix() {
        let mut st = State::default();
        let (r, _) = apply_command(&mut st, 2, &set_cmd(query(A, "web", "web"), false));
        assert_eq!(r, Response::Ok);
        let (r, _) = apply_command(&mut st, 3, &set_cmd(query(B, "WEB", "x"), false));
        assert_eq!(
            r,
            Response::Rejected("name 'WEB' aliases an existing query name".into())
        );
        let (r, _) = apply_command(&mut st, 3, &set_cmd(query(B, A, "x"), false));
        assert!(matches!(r, Response::Rejected(e) if e.contains("aliases an existing query ID")));
        let (r, _) = apply_command(&mut st, 3, &set_cmd(query(C, "nope", "x"), true));
        assert!(matches!(r, Response::Rejected(e) if e.starts_with("Cannot modify")));

        let mut short = query(B, "geo-", "${name.suffix}");
        short.template = QueryTemplate {
            r#type: NAME_PREFIX_MATCH.into(),
            ..Default::default()
        };
        let mut long = short.clone();
        long.id = C.into();
        long.name = "geo-db-".into();
        long.service.service = "db-${name.suffix}".into();
        apply_command(&mut st, 4, &set_cmd(short, false));
        apply_command(&mut st, 5, &set_cmd(long, false));
        assert_eq!(resolve(&st, "web", "").unwrap().id, A);
        assert_eq!(resolve(&st, A, "").unwrap().name, "web");
        assert_eq!(resolve(&st, "geo-x", "").unwrap().service.service, "x");
        assert_eq!(
            resolve(&st, "geo-db-y", "").unwrap().service.service,
            "db-y"
        );
        assert!(resolve(&st, "other", "").is_none());
        assert_eq!(st.queries[A].create_index, 2);
    }

    /// A query bound to a session goes when the session is invalidated;
    /// queries survive rows on disk and snapshots.
    #[test]
    fn session_bound_queries_go_with_their_session_and_queries_persist() {
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = State::default();
        let s: crate::structs::Session = serde_json::from_value(serde_json::json!({
            "ID": "sess", "Name": "", "Node": "n1", "NodeChecks": [], "ServiceChecks": [],
            "LockDelay": 0, "Behavior": "release", "TTL": "", "CreateIndex": 1, "ModifyIndex": 1
        }))
        .unwrap();
        st.sessions.insert("sess".into(), Arc::new(s));
        let mut bound = query(A, "", "web");
        bound.session = "sess".into();
        let (r, s1) = apply_command(&mut st, 2, &set_cmd(bound, false));
        assert_eq!(r, Response::Ok);
        let (_, s2) = apply_command(&mut st, 3, &set_cmd(query(B, "kept", "db"), false));
        let mut ghost = query(C, "", "x");
        ghost.session = "gone".into();
        let (r, _) = apply_command(&mut st, 4, &set_cmd(ghost, false));
        assert_eq!(r, Response::Rejected("invalid session \"gone\"".into()));

        let decoded = snapshot::decode(&snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(decoded.queries, st.queries);

        let (_, s3) = apply_command(&mut st, 5, &Command::SessionDestroy { id: "sess".into() });
        assert!(!st.queries.contains_key(A));
        assert!(st.queries.contains_key(B));
        store.commit(st.clone(), &[s1, s2, s3], vec![]).unwrap();
        drop(store);
        let again = Store::open(Box::new(disk)).unwrap();
        assert_eq!(again.state().queries, st.queries);
    }
}
