//! Applying one command to a version of the state, deterministically: the
//! dispatch from a command to the table that applies it, through a `Tx`.

use super::tx::Tx;
use super::{ChangeSet, Command, Payload, Response, State, Table, keys};

/// Applies `cmd` at Raft index `index`; returns the answer and the changes.
pub fn apply_command(state: &mut State, index: u64, cmd: &Command) -> (Response, ChangeSet) {
    let mut tx = Tx::new(state, index);
    let response = match cmd {
        Command::Noop => Response::Ok,
        Command::InitCluster { cluster_id } => {
            if tx.state.cluster_id.is_empty() {
                tx.state.cluster_id = cluster_id.clone();
                tx.touch(keys::CLUSTER);
            }
            Response::Ok
        }
        Command::Kv(op) => match super::kv::apply_op(&mut tx, op) {
            Ok(outcome) => Response::Kv(outcome),
            Err(reason) => Response::Rejected(reason),
        },
        Command::Txn(ops) => super::kv::apply_txn(&mut tx, ops),
        Command::Register(req) => result(super::catalog::register(&mut tx, req)),
        Command::Deregister(req) => result(super::catalog::deregister(&mut tx, req)),
        Command::ConfigSet { entry, cas } => super::config::set(&mut tx, entry, *cas),
        Command::ConfigDelete { kind, name, cas } => {
            super::config::delete(&mut tx, kind, name, *cas)
        }
        Command::ReapTombstones { upto } => {
            let (reaped, floors) = super::tombstones::reap(tx.state, *upto);
            for key in reaped {
                tx.record(Table::Index, key.to_string(), None, None);
            }
            // Persisted with their new values; nobody watches them.
            tx.keep_indexes(floors);
            Response::Ok
        }
        Command::SessionCreate {
            session,
            server_node,
        } => result(super::session::create(&mut tx, session, *server_node)),
        Command::SessionDestroy { id } => {
            super::session::invalidate(&mut tx, id);
            Response::Bool(true)
        }
        Command::Timed { now_ms, cmd } => {
            tx.state.now_ms = Some(*now_ms);
            super::session::tick(&mut tx);
            let (r, s) = apply_command(tx.state, index, &Command::from(cmd.clone()));
            tx.absorb(s);
            tx.state.now_ms = None;
            r
        }
        Command::RestoreChunk { id, seq, data } => {
            result(super::restore::stage(&mut tx, id, *seq, data))
        }
        Command::RestoreCommit {
            id,
            chunks,
            len,
            crc,
        } => result(super::restore::commit(&mut tx, id, *chunks, *len, *crc)),
        Command::CaSet { ca, cas } => super::connect::set(&mut tx, ca, *cas),
        Command::EventFire { event } => super::events::fire(&mut tx, event),
        Command::RestoreAbort { id } => {
            super::restore::abort(&mut tx, id);
            Response::Ok
        }
        Command::AclTokenSet { token } => super::acl::set_token(&mut tx, token),
        Command::AclTokenDelete { accessor } => super::acl::delete_token(&mut tx, accessor),
        Command::AclPolicySet { policy } => super::acl::set_policy(&mut tx, policy),
        Command::AclPolicyDelete { id } => super::acl::delete_policy(&mut tx, id),
        Command::AclRoleSet { role } => super::acl::set_role(&mut tx, role),
        Command::AclRoleDelete { id } => super::acl::delete_role(&mut tx, id),
        Command::AclAuthMethodSet { method } => super::acl::set_auth_method(&mut tx, method),
        Command::AclAuthMethodDelete { name } => super::acl::delete_auth_method(&mut tx, name),
        Command::AclBindingRuleSet { rule } => super::acl::set_binding_rule(&mut tx, rule),
        Command::AclBindingRuleDelete { id } => super::acl::delete_binding_rule(&mut tx, id),
        Command::AclBootstrap { token } => super::acl::bootstrap(&mut tx, token, 0),
        Command::AclBootstrapReset { token, reset_index } => {
            super::acl::bootstrap(&mut tx, token, *reset_index)
        }
        Command::AutopilotSet { config, cas } => {
            super::operator::set_autopilot(&mut tx, config, *cas)
        }
        Command::CoordinateBatch { updates } => super::coordinate::apply_batch(&mut tx, updates),
        Command::FederationStateSet { state } => super::federation::set(&mut tx, state),
        Command::FederationStateDelete { datacenter } => {
            super::federation::delete(&mut tx, datacenter)
        }
        Command::QuerySet { query, update } => super::query::set(&mut tx, query, *update),
        Command::QueryDelete { id } => super::query::delete(&mut tx, id),
        Command::AclReplicate {
            set,
            delete_tokens,
            delete_roles,
            delete_policies,
        } => super::acl::replicate(&mut tx, set, delete_tokens, delete_roles, delete_policies),
        Command::ConfigReplicate { set, delete } => super::config::replicate(&mut tx, set, delete),
        Command::VirtualIpsSet { service, manual } => {
            super::virtual_ip::set_manual(&mut tx, service, manual)
        }
        Command::AclInit { initial_management } => {
            super::acl::init(&mut tx, initial_management.as_deref())
        }
    };
    let set = tx.finish();
    (response, set)
}

/// Applies a Raft entry's payload at `index`: one command, or a batch of
/// them at one index as one change set, each seeing the ones before it.
pub fn apply_payload(state: &mut State, index: u64, payload: &Payload) -> (Response, ChangeSet) {
    let cmds = match payload {
        Payload::One(cmd) => return apply_command(state, index, cmd),
        Payload::Batch(cmds) => cmds,
    };
    let mut set = ChangeSet {
        index,
        ..Default::default()
    };
    let mut responses = Vec::with_capacity(cmds.len());
    for c in cmds {
        let (r, s) = apply_command(state, index, c);
        set.changes.extend(s.changes);
        set.watch_keys.extend(s.watch_keys);
        set.replaced |= s.replaced;
        responses.push(r);
    }
    state.index = state.index.max(index);
    (Response::Batch(responses), set)
}

fn result(r: Result<(), String>) -> Response {
    match r {
        Ok(()) => Response::Ok,
        Err(reason) => Response::Rejected(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{KvOp, KvOutcome, KvVerb};

    fn op(verb: KvVerb, key: &str, value: &str, index: u64) -> Command {
        Command::Kv(KvOp {
            verb,
            key: key.into(),
            value: value.into(),
            flags: 0,
            index,
            session: String::new(),
        })
    }

    #[test]
    fn a_batch_applies_in_order_at_one_index_with_one_answer_each() {
        let mut st = State::default();
        apply_command(&mut st, 5, &op(KvVerb::Set, "b", "old", 0));
        let batch = Payload::Batch(vec![
            op(KvVerb::Set, "a", "1", 0),
            // Sees the write before it: the key exists, so cas 0 fails.
            op(KvVerb::Cas, "a", "2", 0),
            op(KvVerb::Cas, "b", "new", 5),
            op(KvVerb::Delete, "missing", "", 0),
        ]);
        let (resp, set) = apply_payload(&mut st, 9, &batch);
        assert_eq!(
            resp,
            Response::Batch(vec![
                Response::Kv(KvOutcome::Done(true)),
                Response::Kv(KvOutcome::Done(false)),
                Response::Kv(KvOutcome::Done(true)),
                Response::Kv(KvOutcome::Done(true)),
            ])
        );
        assert_eq!(set.index, 9);
        assert_eq!(set.changes.len(), 2);
        assert!(set.watch_keys.contains("kv/a") && set.watch_keys.contains("kv/b"));
        assert_eq!(st.index, 9);
        assert_eq!(st.kv["a"].value, b"1");
        assert_eq!(st.kv["b"].value, b"new");
        assert_eq!(st.kv["b"].modify_index, 9);
        assert_eq!(st.kv["b"].create_index, 5);
    }
}
