//! Restoring a whole snapshot on a running cluster (`PUT /v1/snapshot`),
//! through Raft and bounded per entry.
//!
//! A snapshot may be far larger than one Raft entry may be (1 MiB of
//! writes, see ARCHITECTURE.md "Invariants"), so the server that received
//! it proposes it in chunks (`Command::RestoreChunk`, `CHUNK_BYTES` each),
//! which apply stages aside in the state: rows of their own and part of
//! Raft snapshots, so a restart or a follower catching up by snapshot
//! still holds them. Then one `Command::RestoreCommit` checks the staged
//! bytes whole (count, length, crc32), decodes them and swaps the whole
//! state at its index, atomically (the state machine persists it as one
//! replace, as a snapshot install). Only one restore is staged at a time:
//! a restore's first chunk discards any other's, a failed commit discards
//! its own, and a new leader aborts one it finds staged (its proposer is
//! gone), so a half-staged restore never lingers past a leader change.
//!
//! Indexes never go back: every index row of the restored state is raised
//! to the commit's index, and the `restored` floor answers for every key
//! without a row (see `tombstones::floor`), so any index a query reports
//! after the restore is at least the commit's, above all reported before.

use std::sync::Arc;

use super::tx::Tx;
use super::{Row, Staged, State, Table};

/// The bytes of one chunk: with its command's framing well under the
/// 1 MiB a Raft entry holds (`server::BATCH_BYTES`).
pub const CHUNK_BYTES: usize = 512 << 10;

/// The row key of a staged chunk (ordered by `seq`).
pub(crate) fn chunk_key(id: &str, seq: usize) -> String {
    format!("{id}/{seq:010}")
}

/// The id and chunk number of a chunk row's key.
pub(crate) fn parse_chunk_key(key: &str) -> Option<(&str, usize)> {
    let (id, seq) = key.rsplit_once('/')?;
    Some((id, seq.parse().ok()?))
}

/// Applies chunk `seq` of restore `id`: chunk 0 starts it (discarding any
/// other staged restore), the others must follow in order.
pub fn stage(tx: &mut Tx, id: &str, seq: u32, data: &[u8]) -> Result<(), String> {
    if seq == 0 {
        discard(tx);
        tx.state.restore = Some(Staged {
            id: id.to_string(),
            chunks: imbl::Vector::new(),
        });
    }
    let next = match &tx.state.restore {
        Some(s) if s.id == id => s.chunks.len(),
        _ => return Err(format!("snapshot restore {id} is not being staged")),
    };
    if seq as usize != next {
        return Err(format!(
            "snapshot restore {id}: chunk {seq} out of order (expected {next})"
        ));
    }
    tx.put_restore_chunk(id, next, Arc::new(data.to_vec()));
    Ok(())
}

/// Drops restore `id` if it is the one staged.
pub fn abort(tx: &mut Tx, id: &str) {
    if tx.state.restore.as_ref().is_some_and(|s| s.id == id) {
        discard(tx);
    }
}

/// Drops whatever restore is staged, with its rows.
fn discard(tx: &mut Tx) {
    if let Some(s) = tx.state.restore.clone() {
        for seq in (0..s.chunks.len()).rev() {
            tx.remove_restore_chunk(&s.id, seq);
        }
        tx.state.restore = None;
    }
}

/// Commits restore `id`: the staged bytes must be `chunks` chunks of `len`
/// bytes in all with crc32 `crc`, and decode as a state; then the state
/// becomes the restored one (see `restored`). On refusal the staged
/// restore is dropped and nothing else changes.
pub fn commit(tx: &mut Tx, id: &str, chunks: u32, len: u64, crc: u32) -> Result<(), String> {
    let staged = match &tx.state.restore {
        Some(s) if s.id == id => s.clone(),
        _ => return Err(format!("snapshot restore {id} is not being staged")),
    };
    let checked = (|| {
        if staged.chunks.len() != chunks as usize {
            return Err(format!(
                "snapshot restore {id}: {} chunks staged, {chunks} sent",
                staged.chunks.len()
            ));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        for c in &staged.chunks {
            bytes.extend_from_slice(c);
        }
        if bytes.len() as u64 != len || crc32fast::hash(&bytes) != crc {
            return Err(format!(
                "snapshot restore {id}: staged bytes do not match (length or checksum)"
            ));
        }
        super::snapshot::decode(&bytes)
            .map_err(|e| format!("snapshot restore {id}: the snapshot does not decode: {e}"))
    })();
    match checked {
        Ok(new) => {
            let next = restored(tx.state, new, tx.index);
            *tx.state = next;
            tx.mark_replaced();
            Ok(())
        }
        Err(e) => {
            discard(tx);
            Err(e)
        }
    }
}

/// The state a restore at `index` leaves: `new`'s tables, every index row
/// raised to `index` and the `restored` floor at `index` (indexes never go
/// back), the cluster id kept if the snapshot has none.
pub fn restored(old: &State, mut new: State, index: u64) -> State {
    let index = index.max(old.index);
    new.index = index;
    new.indexes = new
        .indexes
        .into_iter()
        .map(|(k, v)| (k, v.max(index)))
        .collect();
    // The floor a restore leaves: it counts for every key without a row.
    new.indexes.insert(super::keys::RESTORED, index);
    if new.cluster_id.is_empty() {
        new.cluster_id = old.cluster_id.clone();
    }
    // A snapshot without a CA keeps the running one: leaves already out
    // must keep verifying.
    if new.connect_ca.is_none() {
        new.connect_ca = old.connect_ca.clone();
    }
    // So does one from before autopilot's configuration was kept.
    if new.autopilot.is_none() {
        new.autopilot = old.autopilot.clone();
    }
    // Events are in no snapshot: the ring goes on, so times keep rising.
    new.events = old.events.clone();
    new.restore = None;
    new.now_ms = None;
    super::tombstones::rebuild(&mut new);
    new
}

impl Tx<'_> {
    /// Stages chunk `seq` of restore `id` (see `restore`).
    pub(crate) fn put_restore_chunk(&mut self, id: &str, seq: usize, data: Arc<Vec<u8>>) {
        if let Some(s) = &mut self.state.restore {
            s.chunks.push_back(data.clone());
        }
        let key = super::restore::chunk_key(id, seq);
        self.record(Table::Restore, key, None, Some(Row::RestoreChunk(data)));
    }

    /// Forgets the row of staged chunk `seq` of restore `id`.
    pub(crate) fn remove_restore_chunk(&mut self, id: &str, seq: usize) {
        let key = super::restore::chunk_key(id, seq);
        self.record(Table::Restore, key, None, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Response, apply_command, keys, snapshot};
    use crate::structs::KvOp;

    fn set(key: &str) -> Command {
        Command::Kv(KvOp::set(key, b"v".to_vec()))
    }

    fn stage_all(st: &mut State, at: &mut u64, id: &str, bytes: &[u8]) -> u32 {
        let mut n = 0;
        for (seq, c) in bytes.chunks(1000).enumerate() {
            *at += 1;
            let cmd = Command::RestoreChunk {
                id: id.into(),
                seq: seq as u32,
                data: c.to_vec(),
            };
            assert_eq!(apply_command(st, *at, &cmd).0, Response::Ok);
            n += 1;
        }
        n
    }

    #[test]
    fn a_restore_swaps_the_state_and_no_index_goes_back() {
        let mut snap = State::default();
        apply_command(&mut snap, 2, &set("a"));
        apply_command(&mut snap, 3, &set("gone"));
        let bytes = snapshot::export(&snap).unwrap();

        let mut st = State::default();
        for i in 0..30 {
            apply_command(&mut st, 10 + i, &set(&format!("k{i}")));
        }
        apply_command(&mut st, 50, &set("a"));
        let probes = [
            keys::kv("a"),
            keys::kv("k3"),
            keys::kv("never"),
            keys::NODES,
        ];
        let before: Vec<u64> = probes.iter().map(|k| st.index_of([k])).collect();
        let mut at = 60;
        let chunks = stage_all(&mut st, &mut at, "r1", &bytes);
        // Staged aside: nothing visible changed yet.
        assert_eq!(st.kv.len(), 30 + 1);
        at += 1;
        let cmd = Command::RestoreCommit {
            id: "r1".into(),
            chunks,
            len: bytes.len() as u64,
            crc: crc32fast::hash(&bytes),
        };
        let (resp, set) = apply_command(&mut st, at, &cmd);
        assert_eq!(resp, Response::Ok);
        assert!(set.replaced);
        assert_eq!(
            st.kv.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["a", "gone"]
        );
        assert!(st.restore.is_none());
        // The rows keep the snapshot's own indexes...
        assert_eq!(st.kv["a"].modify_index, 2);
        // ...but no reported index went back.
        for (k, b) in probes.iter().zip(before) {
            assert!(st.index_of([k]) >= b.max(at), "{k}");
        }
        assert!(st.index_of_prefix(&keys::kv("")) >= at);
        // What a load finds is what apply left.
        let mut loaded = st.clone();
        loaded.tombstones = Default::default();
        crate::state::tombstones::rebuild(&mut loaded);
        assert_eq!(loaded.tombstones, st.tombstones);
    }

    #[test]
    fn a_staged_restore_survives_a_restart_and_a_raft_snapshot() {
        use crate::state::{MemoryBackend, Store};
        let disk = MemoryBackend::default();
        let store = Store::open(Box::new(disk.clone())).unwrap();
        let mut st = (*store.state()).clone();
        let mut sets = Vec::new();
        for (i, c) in [&b"abc"[..], &b"de"[..]].iter().enumerate() {
            let cmd = Command::RestoreChunk {
                id: "r1".into(),
                seq: i as u32,
                data: c.to_vec(),
            };
            sets.push(apply_command(&mut st, 3 + i as u64, &cmd).1);
        }
        store.commit(st.clone(), &sets, vec![]).unwrap();
        // Reopened on the same rows: the chunks are there, in order.
        let again = Store::open(Box::new(disk.clone())).unwrap();
        assert_eq!(again.state().restore, st.restore);
        // In a Raft snapshot too.
        let decoded = snapshot::decode(&snapshot::encode(&st).unwrap()).unwrap();
        assert_eq!(decoded.restore, st.restore);
        // A user's snapshot never carries one.
        let exported = snapshot::decode(&snapshot::export(&st).unwrap()).unwrap();
        assert!(exported.restore.is_none());
        // Dropped: its rows go too.
        let (_, set) = apply_command(&mut st, 9, &Command::RestoreAbort { id: "r1".into() });
        store.commit(st, &[set], vec![]).unwrap();
        let again = Store::open(Box::new(disk)).unwrap();
        assert!(again.state().restore.is_none());
    }

    #[test]
    fn a_bad_commit_or_a_new_restore_discards_the_staged_one() {
        let mut snap = State::default();
        apply_command(&mut snap, 2, &set("a"));
        let bytes = snapshot::export(&snap).unwrap();
        let mut st = State::default();
        apply_command(&mut st, 5, &set("live"));
        let mut at = 5;
        let chunks = stage_all(&mut st, &mut at, "r1", &bytes);
        // A wrong checksum: refused, staging dropped, nothing else changed.
        let bad = Command::RestoreCommit {
            id: "r1".into(),
            chunks,
            len: bytes.len() as u64,
            crc: crc32fast::hash(&bytes) ^ 1,
        };
        assert!(matches!(
            apply_command(&mut st, 40, &bad).0,
            Response::Rejected(_)
        ));
        assert!(st.restore.is_none());
        assert_eq!(st.kv.keys().map(|k| &**k).collect::<Vec<_>>(), ["live"]);
        // A chunk out of order is refused.
        let skip = Command::RestoreChunk {
            id: "r2".into(),
            seq: 3,
            data: vec![1],
        };
        assert!(matches!(
            apply_command(&mut st, 41, &skip).0,
            Response::Rejected(_)
        ));
        // A second restore's first chunk replaces the first one's.
        let mut at = 50;
        stage_all(&mut st, &mut at, "r1", &bytes);
        stage_all(&mut st, &mut at, "r2", &bytes[..10]);
        assert_eq!(st.restore.as_ref().unwrap().id, "r2");
        assert_eq!(st.restore.as_ref().unwrap().chunks.len(), 1);
        // Aborting another id changes nothing; its own id drops it.
        apply_command(&mut st, 90, &Command::RestoreAbort { id: "r1".into() });
        assert!(st.restore.is_some());
        apply_command(&mut st, 91, &Command::RestoreAbort { id: "r2".into() });
        assert!(st.restore.is_none());
        assert_eq!(st.kv.keys().map(|k| &**k).collect::<Vec<_>>(), ["live"]);
    }
}
