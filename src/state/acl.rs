//! The ACL tables: tokens (by accessor, found by the hash of their
//! secret), policies and roles, written only by apply; and the bootstrap
//! mark (`PUT /v1/acl/bootstrap` succeeds once).
//!
//! Every change touches the `acl` watch key: its index is the generation
//! that token resolution caches are checked against (`state::token_resolver`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tx::Tx;
use super::{Response, Row, State, Table, keys};
use crate::structs::acl::{
    self, AclPolicy, AclRole, AclToken, GLOBAL_MANAGEMENT_ID, GLOBAL_MANAGEMENT_NAME,
};
use crate::structs::auth::{AclAuthMethod, AclBindingRule};

/// Consul's answer to a second bootstrap (a 403).
pub const BOOTSTRAP_DONE: &str = "ACL bootstrap no longer allowed";
/// Consul's refusal of a reset file naming another index than the last
/// bootstrap's.
pub const BAD_RESET_INDEX: &str = "Invalid bootstrap reset index";

/// One row of the ACL table, as persisted (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AclRow {
    Token(Arc<AclToken>),
    Policy(Arc<AclPolicy>),
    Role(Arc<AclRole>),
    AuthMethod(Arc<AclAuthMethod>),
    BindingRule(Arc<AclBindingRule>),
    /// The index bootstrap was done at.
    Bootstrapped(u64),
}

/// Row keys within the table: a kind letter, `/`, the ID.
pub fn token_key(accessor: &str) -> String {
    format!("t/{accessor}")
}
pub fn policy_key(id: &str) -> String {
    format!("p/{id}")
}
pub fn role_key(id: &str) -> String {
    format!("r/{id}")
}
pub fn auth_method_key(name: &str) -> String {
    format!("m/{name}")
}
pub fn binding_rule_key(id: &str) -> String {
    format!("b/{id}")
}
pub const BOOTSTRAP_KEY: &str = "bootstrap";

/// Puts a row read back from storage (or a snapshot) into the state.
pub fn load(st: &mut State, row: AclRow) {
    match row {
        AclRow::Token(t) => {
            st.acl_secrets
                .insert(t.secret_hash.clone(), t.accessor_id.clone());
            st.acl_tokens.insert(t.accessor_id.clone(), t);
        }
        AclRow::Policy(p) => {
            st.acl_policies.insert(p.id.clone(), p);
        }
        AclRow::Role(r) => {
            st.acl_roles.insert(r.id.clone(), r);
        }
        AclRow::AuthMethod(m) => {
            st.acl_auth_methods.insert(m.name.clone(), m);
        }
        AclRow::BindingRule(b) => {
            st.acl_binding_rules.insert(b.id.clone(), b);
        }
        AclRow::Bootstrapped(i) => st.acl_bootstrapped = i,
    }
}

/// Every row of the tables, keyed (snapshots, a whole replace).
pub fn rows(st: &State) -> Vec<(String, AclRow)> {
    let mut out = Vec::new();
    for t in st.acl_tokens.values() {
        out.push((token_key(&t.accessor_id), AclRow::Token(t.clone())));
    }
    for p in st.acl_policies.values() {
        out.push((policy_key(&p.id), AclRow::Policy(p.clone())));
    }
    for r in st.acl_roles.values() {
        out.push((role_key(&r.id), AclRow::Role(r.clone())));
    }
    for m in st.acl_auth_methods.values() {
        out.push((auth_method_key(&m.name), AclRow::AuthMethod(m.clone())));
    }
    for b in st.acl_binding_rules.values() {
        out.push((binding_rule_key(&b.id), AclRow::BindingRule(b.clone())));
    }
    if st.acl_bootstrapped > 0 {
        out.push((
            BOOTSTRAP_KEY.to_string(),
            AclRow::Bootstrapped(st.acl_bootstrapped),
        ));
    }
    out
}

/// A token by the hash of its secret.
pub fn token_by_secret_hash<'a>(st: &'a State, hash: &str) -> Option<&'a Arc<AclToken>> {
    st.acl_secrets.get(hash).and_then(|a| st.acl_tokens.get(a))
}

fn policy_by_name<'a>(st: &'a State, name: &str) -> Option<&'a Arc<AclPolicy>> {
    st.acl_policies.values().find(|p| p.name == name)
}

fn role_by_name<'a>(st: &'a State, name: &str) -> Option<&'a Arc<AclRole>> {
    st.acl_roles.values().find(|r| r.name == name)
}

/// Creates or replaces a token. Its secret's hash may belong to no other
/// token; every policy and role it names must exist.
pub fn set_token(tx: &mut Tx, token: &AclToken) -> Response {
    if token.accessor_id.is_empty() || token.secret_hash.is_empty() {
        return Response::Rejected("Token is missing its AccessorID or SecretID".into());
    }
    if let Some(other) = tx.state.acl_secrets.get(&token.secret_hash)
        && *other != token.accessor_id
    {
        return Response::Rejected("Invalid Token: SecretID is already in use".into());
    }
    if let Err(e) = links_exist(tx.state, token) {
        return Response::Rejected(e);
    }
    let existing = tx.state.acl_tokens.get(&token.accessor_id).cloned();
    if let Some(e) = &existing
        && e.secret_hash != token.secret_hash
    {
        return Response::Rejected("Changing a token's SecretID is not allowed".into());
    }
    let mut t = token.clone();
    t.secret_id = String::new();
    t.create_index = existing.as_ref().map_or(tx.index, |e| e.create_index);
    t.modify_index = tx.index;
    put(tx, AclRow::Token(Arc::new(t)));
    Response::Ok
}

fn links_exist(st: &State, token: &AclToken) -> Result<(), String> {
    // A login checked against a method deleted since makes no token.
    if !token.auth_method.is_empty() && !st.acl_auth_methods.contains_key(&token.auth_method) {
        return Err(format!("auth method {:?} not found", token.auth_method));
    }
    for p in &token.policies {
        if !st.acl_policies.contains_key(&p.id) {
            return Err(format!("cannot find policy {}", p.id));
        }
    }
    for r in &token.roles {
        if !st.acl_roles.contains_key(&r.id) {
            return Err(format!("cannot find role {}", r.id));
        }
    }
    Ok(())
}

pub fn delete_token(tx: &mut Tx, accessor: &str) -> Response {
    if accessor == acl::ANONYMOUS_ID {
        return Response::Rejected("Delete of the anonymous token is not allowed".into());
    }
    remove(tx, &token_key(accessor));
    Response::Ok
}

pub fn set_policy(tx: &mut Tx, policy: &AclPolicy) -> Response {
    if policy.id == GLOBAL_MANAGEMENT_ID
        && tx.state.acl_policies.contains_key(GLOBAL_MANAGEMENT_ID)
        && policy.name != GLOBAL_MANAGEMENT_NAME
    {
        return Response::Rejected(
            "Changing the Name of the builtin global-management policy is not permitted".into(),
        );
    }
    if let Some(other) = policy_by_name(tx.state, &policy.name)
        && other.id != policy.id
    {
        return Response::Rejected(format!(
            "Invalid Policy: A Policy with Name {:?} already exists",
            policy.name
        ));
    }
    let existing = tx.state.acl_policies.get(&policy.id).cloned();
    let mut p = policy.clone();
    p.create_index = existing.as_ref().map_or(tx.index, |e| e.create_index);
    p.modify_index = tx.index;
    put(tx, AclRow::Policy(Arc::new(p)));
    Response::Ok
}

pub fn delete_policy(tx: &mut Tx, id: &str) -> Response {
    if id == GLOBAL_MANAGEMENT_ID {
        return Response::Rejected(
            "Delete of the builtin global-management policy is not permitted".into(),
        );
    }
    remove(tx, &policy_key(id));
    Response::Ok
}

pub fn set_role(tx: &mut Tx, role: &AclRole) -> Response {
    if let Some(other) = role_by_name(tx.state, &role.name)
        && other.id != role.id
    {
        return Response::Rejected(format!(
            "Invalid Role: A Role with Name {:?} already exists",
            role.name
        ));
    }
    for p in &role.policies {
        if !tx.state.acl_policies.contains_key(&p.id) {
            return Response::Rejected(format!("cannot find policy {}", p.id));
        }
    }
    let existing = tx.state.acl_roles.get(&role.id).cloned();
    let mut r = role.clone();
    r.create_index = existing.as_ref().map_or(tx.index, |e| e.create_index);
    r.modify_index = tx.index;
    put(tx, AclRow::Role(Arc::new(r)));
    Response::Ok
}

pub fn delete_role(tx: &mut Tx, id: &str) -> Response {
    remove(tx, &role_key(id));
    Response::Ok
}

/// Creates or replaces an auth method (the HTTP layer checked its config).
pub fn set_auth_method(tx: &mut Tx, method: &AclAuthMethod) -> Response {
    let existing = tx.state.acl_auth_methods.get(&method.name).cloned();
    if let Some(e) = &existing
        && e.kind != method.kind
    {
        return Response::Rejected("Invalid Auth Method: the Type field is immutable".into());
    }
    let mut m = method.clone();
    m.create_index = existing.as_ref().map_or(tx.index, |e| e.create_index);
    m.modify_index = tx.index;
    put(tx, AclRow::AuthMethod(Arc::new(m)));
    Response::Ok
}

/// Deletes an auth method with its binding rules and every token its
/// logins made, in one apply: from this index on no server honours them.
pub fn delete_auth_method(tx: &mut Tx, name: &str) -> Response {
    let rules: Vec<String> = tx
        .state
        .acl_binding_rules
        .values()
        .filter(|b| b.auth_method == name)
        .map(|b| b.id.clone())
        .collect();
    let tokens: Vec<String> = tx
        .state
        .acl_tokens
        .values()
        .filter(|t| t.auth_method == name)
        .map(|t| t.accessor_id.clone())
        .collect();
    for id in rules {
        remove(tx, &binding_rule_key(&id));
    }
    for accessor in tokens {
        remove(tx, &token_key(&accessor));
    }
    remove(tx, &auth_method_key(name));
    Response::Ok
}

/// Creates or replaces a binding rule of an existing auth method.
pub fn set_binding_rule(tx: &mut Tx, rule: &AclBindingRule) -> Response {
    if !tx.state.acl_auth_methods.contains_key(&rule.auth_method) {
        return Response::Rejected(format!(
            "Invalid Binding Rule: unknown AuthMethod {:?}",
            rule.auth_method
        ));
    }
    let existing = tx.state.acl_binding_rules.get(&rule.id).cloned();
    let mut b = rule.clone();
    b.create_index = existing.as_ref().map_or(tx.index, |e| e.create_index);
    b.modify_index = tx.index;
    put(tx, AclRow::BindingRule(Arc::new(b)));
    Response::Ok
}

pub fn delete_binding_rule(tx: &mut Tx, id: &str) -> Response {
    remove(tx, &binding_rule_key(id));
    Response::Ok
}

/// Replication from the primary (`Command::AclReplicate`): its objects as
/// it has them, links unchecked (the primary's state is whole; a token may
/// name a policy it deleted, as there). Deletes first, so that a token
/// replacing another with the same secret finds it gone. Local tokens are
/// this datacenter's own: never deleted nor overwritten here, and a global
/// token whose secret a local one holds is left out. The built-ins are
/// never deleted.
pub fn replicate(
    tx: &mut Tx, set: &crate::structs::replication::AclReplica, delete_tokens: &[String],
    delete_roles: &[String], delete_policies: &[String],
) -> Response {
    for accessor in delete_tokens {
        let local = tx.state.acl_tokens.get(accessor).is_none_or(|t| t.local);
        if !local && accessor != acl::ANONYMOUS_ID {
            remove(tx, &token_key(accessor));
        }
    }
    for id in delete_roles {
        remove(tx, &role_key(id));
    }
    for id in delete_policies
        .iter()
        .filter(|id| *id != GLOBAL_MANAGEMENT_ID)
    {
        remove(tx, &policy_key(id));
    }
    for p in &set.policies {
        let mut p = p.clone();
        p.create_index = tx
            .state
            .acl_policies
            .get(&p.id)
            .map_or(tx.index, |e| e.create_index);
        p.modify_index = tx.index;
        put(tx, AclRow::Policy(Arc::new(p)));
    }
    for r in &set.roles {
        let mut r = r.clone();
        r.create_index = tx
            .state
            .acl_roles
            .get(&r.id)
            .map_or(tx.index, |e| e.create_index);
        r.modify_index = tx.index;
        put(tx, AclRow::Role(Arc::new(r)));
    }
    for t in set
        .tokens
        .iter()
        .filter(|t| !t.local && !t.secret_hash.is_empty())
    {
        if tx
            .state
            .acl_tokens
            .get(&t.accessor_id)
            .is_some_and(|e| e.local)
        {
            continue;
        }
        if let Some(other) = tx.state.acl_secrets.get(&t.secret_hash).cloned()
            && other != t.accessor_id
        {
            if tx.state.acl_tokens.get(&other).is_some_and(|o| o.local) {
                continue;
            }
            remove(tx, &token_key(&other));
        }
        // A changed secret is a new token in the primary's eyes: the old
        // row (and its hash) goes with the put.
        let mut t = t.clone();
        t.secret_id = String::new();
        t.create_index = tx
            .state
            .acl_tokens
            .get(&t.accessor_id)
            .map_or(tx.index, |e| e.create_index);
        t.modify_index = tx.index;
        put(tx, AclRow::Token(Arc::new(t)));
    }
    Response::Ok
}

/// `PUT /v1/acl/bootstrap`: a management token, once; again only with the
/// reset index the last bootstrap reported (`reset_index`, 0 for none).
pub fn bootstrap(tx: &mut Tx, token: &AclToken, reset_index: u64) -> Response {
    let done = tx.state.acl_bootstrapped;
    if done > 0 && reset_index == 0 {
        return Response::Rejected(format!("{BOOTSTRAP_DONE} (reset index: {done})"));
    }
    if done > 0 && reset_index != done {
        return Response::Rejected(format!(
            "{BAD_RESET_INDEX} (specified {reset_index}, reset index: {done})"
        ));
    }
    builtins(tx);
    let r = set_token(tx, token);
    if r == Response::Ok {
        put(tx, AclRow::Bootstrapped(tx.index));
    }
    r
}

/// The leader's first duty with ACLs on: the built-in policy and anonymous
/// token, and the initial management token (its secret's hash) unless a
/// token with that secret exists. Idempotent: every leader may propose it.
/// An initial management token is the bootstrap, as Consul's: once it is
/// there, `PUT /v1/acl/bootstrap` is refused (until an operator's reset).
pub fn init(tx: &mut Tx, initial_management: Option<&AclToken>) -> Response {
    builtins(tx);
    let Some(t) = initial_management else {
        return Response::Ok;
    };
    if !tx.state.acl_secrets.contains_key(&t.secret_hash) {
        let r = set_token(tx, t);
        if r != Response::Ok {
            return r;
        }
    }
    if tx.state.acl_bootstrapped == 0 {
        put(tx, AclRow::Bootstrapped(tx.index));
    }
    Response::Ok
}

fn builtins(tx: &mut Tx) {
    if !tx.state.acl_policies.contains_key(GLOBAL_MANAGEMENT_ID) {
        let mut p = acl::global_management();
        p.hash = acl::content_hash(&[&p.name, &p.rules]);
        set_policy(tx, &p);
    }
    if !tx.state.acl_tokens.contains_key(acl::ANONYMOUS_ID) {
        set_token(tx, &acl::anonymous());
    }
}

fn put(tx: &mut Tx, row: AclRow) {
    let key = match &row {
        AclRow::Token(t) => token_key(&t.accessor_id),
        AclRow::Policy(p) => policy_key(&p.id),
        AclRow::Role(r) => role_key(&r.id),
        AclRow::AuthMethod(m) => auth_method_key(&m.name),
        AclRow::BindingRule(b) => binding_rule_key(&b.id),
        AclRow::Bootstrapped(_) => BOOTSTRAP_KEY.to_string(),
    };
    let before = remove_row(tx.state, &key);
    load(tx.state, row.clone());
    tx.put_acl(key, before, Some(row));
}

fn remove(tx: &mut Tx, key: &str) {
    if let Some(before) = remove_row(tx.state, key) {
        tx.put_acl(key.to_string(), Some(before), None);
    }
}

fn remove_row(st: &mut State, key: &str) -> Option<AclRow> {
    let (kind, id) = key.split_once('/').unwrap_or((key, ""));
    match kind {
        "t" => {
            let t = st.acl_tokens.remove(id)?;
            st.acl_secrets.remove(&t.secret_hash);
            Some(AclRow::Token(t))
        }
        "p" => st.acl_policies.remove(id).map(AclRow::Policy),
        "r" => st.acl_roles.remove(id).map(AclRow::Role),
        "m" => st.acl_auth_methods.remove(id).map(AclRow::AuthMethod),
        "b" => st.acl_binding_rules.remove(id).map(AclRow::BindingRule),
        _ if st.acl_bootstrapped > 0 => {
            let i = std::mem::take(&mut st.acl_bootstrapped);
            Some(AclRow::Bootstrapped(i))
        }
        _ => None,
    }
}

impl Tx<'_> {
    /// An ACL row changed (`state::acl` keeps the maps): wakes `acl`, the
    /// resolution caches' generation.
    pub(crate) fn put_acl(
        &mut self, key: String, before: Option<super::acl::AclRow>,
        after: Option<super::acl::AclRow>,
    ) {
        self.touch(keys::ACL);
        self.record(Table::Acl, key, before.map(Row::Acl), after.map(Row::Acl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, apply_command, keys};

    fn token(accessor: &str, secret: &str) -> AclToken {
        AclToken {
            accessor_id: accessor.into(),
            secret_hash: acl::secret_hash(secret),
            ..Default::default()
        }
    }

    #[test]
    fn bootstrap_succeeds_once_and_tokens_are_found_by_secret() {
        let mut st = State::default();
        let (r, set) = apply_command(
            &mut st,
            3,
            &Command::AclBootstrap {
                token: Box::new(token("a1", "s1")),
            },
        );
        assert_eq!(r, Response::Ok);
        assert!(set.watch_keys.contains(&keys::ACL));
        assert!(st.acl_policies.contains_key(GLOBAL_MANAGEMENT_ID));
        assert_eq!(
            token_by_secret_hash(&st, &acl::secret_hash("s1"))
                .unwrap()
                .create_index,
            3
        );
        let (r, _) = apply_command(
            &mut st,
            4,
            &Command::AclBootstrap {
                token: Box::new(token("a2", "s2")),
            },
        );
        assert_eq!(
            r,
            Response::Rejected(format!("{BOOTSTRAP_DONE} (reset index: 3)"))
        );
        assert!(token_by_secret_hash(&st, &acl::secret_hash("s2")).is_none());
    }

    #[test]
    fn an_initial_management_token_is_the_bootstrap_and_a_reset_allows_one_more() {
        let mut st = State::default();
        let init = Command::AclInit {
            initial_management: Some(Box::new(token("root", "s0"))),
        };
        assert_eq!(apply_command(&mut st, 5, &init).0, Response::Ok);
        // A second leader's init changes nothing: the bootstrap stays at 5.
        assert_eq!(apply_command(&mut st, 9, &init).0, Response::Ok);
        let again = |reset_index| match reset_index {
            0 => Command::AclBootstrap {
                token: Box::new(token("a1", "s1")),
            },
            reset_index => Command::AclBootstrapReset {
                token: Box::new(token("a1", "s1")),
                reset_index,
            },
        };
        assert_eq!(
            apply_command(&mut st, 10, &again(0)).0,
            Response::Rejected(format!("{BOOTSTRAP_DONE} (reset index: 5)"))
        );
        assert_eq!(
            apply_command(&mut st, 11, &again(4)).0,
            Response::Rejected(format!("{BAD_RESET_INDEX} (specified 4, reset index: 5)"))
        );
        assert!(token_by_secret_hash(&st, &acl::secret_hash("s1")).is_none());
        assert_eq!(apply_command(&mut st, 12, &again(5)).0, Response::Ok);
        assert!(token_by_secret_hash(&st, &acl::secret_hash("s1")).is_some());
        // The reset is used up: the next one must name the new index.
        assert_eq!(
            apply_command(&mut st, 13, &again(5)).0,
            Response::Rejected(format!("{BAD_RESET_INDEX} (specified 5, reset index: 12)"))
        );
    }

    #[test]
    fn init_without_an_initial_management_token_leaves_bootstrap_open() {
        let mut st = State::default();
        let init = Command::AclInit {
            initial_management: None,
        };
        apply_command(&mut st, 5, &init);
        assert_eq!(st.acl_bootstrapped, 0);
    }

    #[test]
    fn a_deleted_token_is_no_longer_found_and_the_generation_moves() {
        let mut st = State::default();
        apply_command(
            &mut st,
            2,
            &Command::AclTokenSet {
                token: Box::new(token("a", "s")),
            },
        );
        let before = st.index_of([&keys::ACL]);
        apply_command(
            &mut st,
            5,
            &Command::AclTokenDelete {
                accessor: "a".into(),
            },
        );
        assert!(token_by_secret_hash(&st, &acl::secret_hash("s")).is_none());
        assert!(st.index_of([&keys::ACL]) > before);
        let back =
            crate::state::snapshot::decode(&crate::state::snapshot::encode(&st).unwrap()).unwrap();
        assert!(back.acl_tokens.is_empty());
    }

    #[test]
    fn a_secret_belongs_to_one_token() {
        let mut st = State::default();
        apply_command(
            &mut st,
            2,
            &Command::AclTokenSet {
                token: Box::new(token("a", "s")),
            },
        );
        let (r, _) = apply_command(
            &mut st,
            3,
            &Command::AclTokenSet {
                token: Box::new(token("b", "s")),
            },
        );
        assert!(matches!(r, Response::Rejected(_)));
        assert_eq!(st.acl_tokens.len(), 1);
    }

    #[test]
    fn deleting_an_auth_method_takes_its_rules_and_tokens_and_refuses_late_logins() {
        let mut st = State::default();
        let method = AclAuthMethod {
            name: "m".into(),
            kind: "jwt".into(),
            ..Default::default()
        };
        let set = Command::AclAuthMethodSet {
            method: Box::new(method),
        };
        assert_eq!(apply_command(&mut st, 2, &set).0, Response::Ok);
        let rule = AclBindingRule {
            id: "r".into(),
            auth_method: "m".into(),
            ..Default::default()
        };
        let set_rule = Command::AclBindingRuleSet {
            rule: Box::new(rule),
        };
        assert_eq!(apply_command(&mut st, 3, &set_rule).0, Response::Ok);
        let login = |accessor: &str, secret: &str| Command::AclTokenSet {
            token: Box::new(AclToken {
                auth_method: "m".into(),
                ..token(accessor, secret)
            }),
        };
        assert_eq!(apply_command(&mut st, 4, &login("a", "s")).0, Response::Ok);
        apply_command(
            &mut st,
            5,
            &Command::AclTokenSet {
                token: Box::new(token("b", "t")),
            },
        );
        let del = Command::AclAuthMethodDelete { name: "m".into() };
        assert_eq!(apply_command(&mut st, 6, &del).0, Response::Ok);
        assert!(st.acl_binding_rules.is_empty());
        assert!(token_by_secret_hash(&st, &acl::secret_hash("s")).is_none());
        assert!(token_by_secret_hash(&st, &acl::secret_hash("t")).is_some());
        // A login checked before the delete and applied after makes nothing.
        assert!(matches!(
            apply_command(&mut st, 7, &login("c", "u")).0,
            Response::Rejected(_)
        ));
        assert!(matches!(
            apply_command(&mut st, 8, &set_rule).0,
            Response::Rejected(_)
        ));
        let back =
            crate::state::snapshot::decode(&crate::state::snapshot::encode(&st).unwrap()).unwrap();
        assert!(back.acl_auth_methods.is_empty());
    }
}
