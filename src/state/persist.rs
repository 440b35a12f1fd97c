//! Where the state machine's tables live on disk: one ordered key space of
//! rows, written in one atomic batch per applied group of commands.
//!
//! Rows are `table byte + key`; a key of two names (a service's or check's
//! node and ID, a config entry's kind and name) is `tx::pair_key`,
//! length-prefixed, so no two names share a row. KV entries are bincode, catalog rows and
//! config entries JSON (their Consul shape skips empty fields), indexes a
//! big-endian u64. The batch also carries the Raft adapter's meta rows
//! (last applied log id, membership), so a restart finds state and applied
//! pointer in step. Not fsync'd here: the Raft log is the durable record and
//! a restart re-applies whatever the state lags behind it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use anyhow::Context;

use super::{ChangeSet, Row, State, Table, WatchKey};
use crate::disk::{DiskError, STATE_FORMAT};
use crate::structs::{HealthCheck, KvEntry, Node, NodeService};

pub type Ops = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// An ordered, atomic-batch key space: sled on disk, a map in simulations.
pub trait Persist: Send + Sync {
    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>>;
    /// Applies all ops atomically.
    fn batch(&self, ops: Ops) -> anyhow::Result<()>;
    /// Replaces the whole key space with the rows `ops` puts, atomically: a
    /// crash at any point leaves the old rows or the new ones, never a mix.
    fn replace(&self, ops: Ops) -> anyhow::Result<()>;
    /// The rows whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()>;
    /// Where the rows are, for messages.
    fn location(&self) -> String;
    /// Writes whatever an earlier `batch` left waiting (`WriteBehind`).
    fn flush(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Called with each row of a scan, in key order.
pub type RowVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> anyhow::Result<()> + 'a;

const KV: u8 = b'k';
const NODE: u8 = b'n';
const SERVICE: u8 = b's';
const CHECK: u8 = b'c';
const CONFIG: u8 = b'e';
const INDEX: u8 = b'i';
const SESSION: u8 = b'x';
const LOCK_DELAY: u8 = b'l';
/// Chunks of a staged restore: `id/seq` → the bytes.
const RESTORE: u8 = b'r';
/// ACL tokens, policies, roles: `state::acl`'s row keys → JSON.
const ACL: u8 = b'a';
/// The Connect CA: one row, `p` + `ca`.
const CONNECT_CA: u8 = b'p';
/// Network coordinates: node → JSON.
const COORDINATE: u8 = b'o';
/// Meta rows: `m` + name. The Raft adapter owns names other than these.
pub const META: u8 = b'm';
const META_INDEX: &[u8] = b"mindex";
const META_CLUSTER: &[u8] = b"mcluster_id";
/// Autopilot's configuration (`state::operator`): a meta row, so a data
/// dir without one (older) reads as the defaults.
pub(crate) const AUTOPILOT_ROW: &str = "autopilot";
const META_AUTOPILOT: &[u8] = b"mautopilot";
/// WAN federation states (`state::federation`): a meta row per datacenter.
const META_FEDERATION: &[u8] = b"mfederation/";
/// Prepared queries (`state::query`): a meta row each.
const META_QUERY: &[u8] = b"mquery/";
/// Services' virtual IPs (`state::virtual_ip`): a meta row each.
const META_VIP: &[u8] = b"mvip/";
/// The rows' format version (`disk::STATE_FORMAT`), big-endian u32.
const META_FORMAT: &[u8] = b"mformat";

fn format_row() -> (Vec<u8>, Option<Vec<u8>>) {
    (
        META_FORMAT.to_vec(),
        Some(STATE_FORMAT.to_be_bytes().to_vec()),
    )
}

/// The rows' format version: `None` for an empty key space, 0 for rows
/// written before versions existed.
pub fn found_format(p: &dyn Persist) -> anyhow::Result<Option<u32>> {
    if let Some(v) = p.get(META_FORMAT)? {
        let v: [u8; 4] = v
            .as_slice()
            .try_into()
            .map_err(|_| anyhow::anyhow!("{}: bad format row", p.location()))?;
        return Ok(Some(u32::from_be_bytes(v)));
    }
    let mut empty = true;
    p.scan_prefix(&[], &mut |_, _| {
        empty = false;
        Ok(())
    })?;
    Ok((!empty).then_some(0))
}

/// Refuses rows of another format version; marks an empty key space with
/// this one.
pub fn check_format(p: &dyn Persist) -> anyhow::Result<()> {
    match found_format(p)? {
        None => p.batch(vec![format_row()]),
        Some(STATE_FORMAT) => Ok(()),
        Some(found) => Err(DiskError::Version {
            path: p.location().into(),
            found,
            expected: STATE_FORMAT,
        }
        .into()),
    }
}

fn row_key(tag: u8, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(tag);
    k.extend_from_slice(key.as_bytes());
    k
}

pub fn meta_key(name: &str) -> Vec<u8> {
    row_key(META, name)
}

fn encode_row(row: &Row) -> anyhow::Result<Vec<u8>> {
    Ok(match row {
        Row::Kv(e) => bincode::serialize(&**e)?,
        Row::Node(n) => serde_json::to_vec(&**n)?,
        Row::Service(s) => serde_json::to_vec(&**s)?,
        Row::Check(c) => serde_json::to_vec(&**c)?,
        Row::Config(e) => serde_json::to_vec(&super::config::to_stored(e))?,
        Row::Session(s) => serde_json::to_vec(&**s)?,
        Row::LockDelay(d) => serde_json::to_vec(d)?,
        Row::RestoreChunk(c) => (**c).clone(),
        Row::Acl(r) => serde_json::to_vec(r)?,
        Row::ConnectCa(ca) => serde_json::to_vec(&**ca)?,
        Row::Autopilot(a) => serde_json::to_vec(&**a)?,
        Row::Coordinate(c) => serde_json::to_vec(&**c)?,
        Row::Federation(f) => serde_json::to_vec(&**f)?,
        Row::Query(q) => serde_json::to_vec(&**q)?,
        Row::VirtualIp(v) => serde_json::to_vec(&**v)?,
    })
}

fn table_tag(t: Table) -> u8 {
    match t {
        Table::Kv => KV,
        Table::Nodes => NODE,
        Table::Services => SERVICE,
        Table::Checks => CHECK,
        Table::Config => CONFIG,
        Table::Sessions => SESSION,
        Table::LockDelays => LOCK_DELAY,
        Table::Restore => RESTORE,
        Table::Acl => ACL,
        Table::Index => INDEX,
        Table::ConnectCa => CONNECT_CA,
        Table::Coordinates => COORDINATE,
        Table::Meta => META,
    }
}

/// Writes the changes of applied commands (the last version `state` gives
/// the final value of every touched index) plus `meta`, atomically.
pub fn write_changes(
    p: &dyn Persist, sets: &[ChangeSet], state: &State, meta: Ops,
) -> anyhow::Result<()> {
    let mut ops: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    for set in sets {
        for c in &set.changes {
            let value = c.after.as_ref().map(encode_row).transpose()?;
            ops.insert(row_key(table_tag(c.table), &c.key), value);
        }
        for k in &set.watch_keys {
            // The final value; none if a later command in these sets
            // reaped it.
            let v = state.indexes.get(k).map(|v| v.to_be_bytes().to_vec());
            ops.insert(row_key(INDEX, k), v);
        }
    }
    ops.insert(
        META_INDEX.to_vec(),
        Some(state.index.to_be_bytes().to_vec()),
    );
    if !state.cluster_id.is_empty() {
        ops.insert(
            META_CLUSTER.to_vec(),
            Some(state.cluster_id.as_bytes().to_vec()),
        );
    }
    let mut ops: Ops = ops.into_iter().collect();
    ops.extend(meta);
    p.batch(ops)
}

/// Replaces the whole key space with `state` (snapshot install).
pub fn replace_all(p: &dyn Persist, state: &State, meta: Ops) -> anyhow::Result<()> {
    let mut ops: Ops = Vec::new();
    for (k, e) in &state.kv {
        ops.push((row_key(KV, k), Some(bincode::serialize(&**e)?)));
    }
    for (k, n) in &state.nodes {
        ops.push((row_key(NODE, k), Some(serde_json::to_vec(&**n)?)));
    }
    for ((n, id), s) in &state.services {
        ops.push((
            row_key(SERVICE, &super::tx::node_key(n, id)),
            Some(serde_json::to_vec(&**s)?),
        ));
    }
    for ((n, id), c) in &state.checks {
        ops.push((
            row_key(CHECK, &super::tx::node_key(n, id)),
            Some(serde_json::to_vec(&**c)?),
        ));
    }
    for ((kind, name), e) in &state.config {
        ops.push((
            row_key(CONFIG, &super::tx::pair_key(kind.as_str(), name)),
            Some(serde_json::to_vec(&**e)?),
        ));
    }
    for (k, v) in &state.indexes {
        ops.push((row_key(INDEX, k), Some(v.to_be_bytes().to_vec())));
    }
    for (id, s) in &state.sessions {
        ops.push((row_key(SESSION, id), Some(serde_json::to_vec(&**s)?)));
    }
    for (k, d) in &state.lock_delays {
        ops.push((row_key(LOCK_DELAY, k), Some(serde_json::to_vec(d)?)));
    }
    for (k, r) in super::acl::rows(state) {
        ops.push((row_key(ACL, &k), Some(serde_json::to_vec(&r)?)));
    }
    if let Some(r) = &state.restore {
        for (seq, c) in r.chunks.iter().enumerate() {
            let key = super::restore::chunk_key(&r.id, seq);
            ops.push((row_key(RESTORE, &key), Some((**c).clone())));
        }
    }
    if let Some(ca) = &state.connect_ca {
        ops.push((row_key(CONNECT_CA, "ca"), Some(serde_json::to_vec(&**ca)?)));
    }
    for (k, c) in &state.coordinates {
        ops.push((row_key(COORDINATE, k), Some(serde_json::to_vec(&**c)?)));
    }
    if let Some(a) = &state.autopilot {
        ops.push((META_AUTOPILOT.to_vec(), Some(serde_json::to_vec(&**a)?)));
    }
    for (dc, f) in &state.federation {
        let key = super::federation::row_key(dc);
        ops.push((meta_key(&key), Some(serde_json::to_vec(&**f)?)));
    }
    for (id, q) in &state.queries {
        let key = super::query::row_key(id);
        ops.push((meta_key(&key), Some(serde_json::to_vec(&**q)?)));
    }
    for (service, v) in &state.virtual_ips {
        let key = super::virtual_ip::row_key(service);
        ops.push((meta_key(&key), Some(serde_json::to_vec(&**v)?)));
    }
    ops.push((
        META_INDEX.to_vec(),
        Some(state.index.to_be_bytes().to_vec()),
    ));
    ops.push((
        META_CLUSTER.to_vec(),
        Some(state.cluster_id.as_bytes().to_vec()),
    ));
    ops.push(format_row());
    ops.extend(meta);
    p.replace(ops)
}

fn be_u64(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[8 - n..].copy_from_slice(&v[..n]);
    u64::from_be_bytes(b)
}

/// Loads every table from the key space.
///
/// The KV table is read and built on a thread of its own while this one
/// reads the others (the per-key indexes are as many rows as KV entries):
/// a restart with a million entries spends its time decoding rows and
/// inserting them into the maps, and the two halves take about as long.
pub fn load_state(p: &dyn Persist) -> anyhow::Result<State> {
    let started = std::time::Instant::now();
    let (kv, mut st) = std::thread::scope(|scope| {
        let kv = std::thread::Builder::new()
            .name("load-kv".into())
            .spawn_scoped(scope, || load_kv(p))
            .map_err(anyhow::Error::from);
        let rest = load_rest(p);
        let kv = kv.and_then(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("loading the KV table panicked"))?
        });
        Ok::<_, anyhow::Error>((kv?, rest?))
    })?;
    st.kv = kv;
    super::derived::reindex(&mut st);
    tracing::info!(
        kv = st.kv.len(),
        indexes = st.indexes.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "state loaded"
    );
    Ok(st)
}

fn load_kv(p: &dyn Persist) -> anyhow::Result<imbl::OrdMap<Arc<str>, Arc<KvEntry>>> {
    let mut kv = imbl::OrdMap::new();
    p.scan_prefix(&[KV], &mut |k, v| {
        let key = std::str::from_utf8(&k[1..]).context("row key")?;
        let e: KvEntry = bincode::deserialize(v)?;
        kv.insert(Arc::from(key), Arc::new(e));
        if kv.len().is_multiple_of(250_000) {
            tracing::info!(entries = kv.len(), "loading the KV table");
        }
        Ok(())
    })?;
    Ok(kv)
}

/// Every table but KV.
fn load_rest(p: &dyn Persist) -> anyhow::Result<State> {
    let mut st = State::default();
    for tag in [
        NODE, SERVICE, CHECK, CONFIG, INDEX, SESSION, LOCK_DELAY, RESTORE, ACL, CONNECT_CA,
        COORDINATE, META,
    ] {
        p.scan_prefix(&[tag], &mut |k, v| {
            let key = std::str::from_utf8(&k[1..]).context("row key")?;
            match tag {
                NODE => {
                    let n: Node = serde_json::from_slice(v)?;
                    st.nodes.insert(key.to_string(), Arc::new(n));
                }
                SERVICE => {
                    let s: NodeService = serde_json::from_slice(v)?;
                    let (node, _) = super::tx::split_pair_key(key)
                        .with_context(|| format!("service row key {key:?}"))?;
                    let node = node.to_string();
                    st.services.insert((node, s.id.clone()), Arc::new(s));
                }
                CHECK => {
                    let c: HealthCheck = serde_json::from_slice(v)?;
                    st.checks
                        .insert((c.node.clone(), c.check_id.clone()), Arc::new(c));
                }
                CONFIG => {
                    let e = super::config::from_stored(&serde_json::from_slice(v)?)?;
                    st.config
                        .insert((e.kind(), e.name().to_string()), Arc::new(e));
                }
                INDEX => {
                    st.indexes.insert(WatchKey::stored(key), be_u64(v));
                }
                SESSION => {
                    let s: crate::structs::Session = serde_json::from_slice(v)?;
                    st.sessions.insert(key.to_string(), Arc::new(s));
                }
                LOCK_DELAY => {
                    st.lock_delays
                        .insert(key.to_string(), serde_json::from_slice(v)?);
                }
                RESTORE => {
                    // Rows in key order: one restore's chunks, 0, 1, ...
                    let (id, seq) = super::restore::parse_chunk_key(key)
                        .with_context(|| format!("restore chunk row {key:?}"))?;
                    let staged = st.restore.get_or_insert_with(|| super::Staged {
                        id: id.to_string(),
                        chunks: imbl::Vector::new(),
                    });
                    if staged.id != id || staged.chunks.len() != seq {
                        anyhow::bail!("restore chunk row {key:?} out of order");
                    }
                    staged.chunks.push_back(Arc::new(v.to_vec()));
                }
                ACL => super::acl::load(&mut st, serde_json::from_slice(v)?),
                CONNECT_CA => st.connect_ca = Some(Arc::new(serde_json::from_slice(v)?)),
                COORDINATE => {
                    st.coordinates
                        .insert(key.to_string(), Arc::new(serde_json::from_slice(v)?));
                }
                META if k == META_INDEX => st.index = be_u64(v),
                META if k == META_AUTOPILOT => {
                    st.autopilot = Some(Arc::new(serde_json::from_slice(v)?))
                }
                META if k.starts_with(META_FEDERATION) => {
                    let f: crate::structs::federation::FederationState = serde_json::from_slice(v)?;
                    st.federation.insert(f.datacenter.clone(), Arc::new(f));
                }
                META if k.starts_with(META_QUERY) => {
                    let q: crate::structs::query::PreparedQuery = serde_json::from_slice(v)?;
                    st.queries.insert(q.id.clone(), Arc::new(q));
                }
                META if k.starts_with(META_VIP) => {
                    let v: super::virtual_ip::ServiceVirtualIp = serde_json::from_slice(v)?;
                    st.virtual_ips.insert(v.service.clone(), Arc::new(v));
                }
                META if k == META_CLUSTER => {
                    st.cluster_id = String::from_utf8_lossy(v).into_owned()
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    Ok(st)
}

/// The file in the data dir that vouches for the state's rows: written
/// once they have loaded, removed when a write of them fails or the server
/// stops on a storage fault (sled, failing in the middle of a write on a
/// full disk, was seen to keep a later batch's applied id and lose an
/// earlier row). A start that finds rows without it drops them and
/// rebuilds them from the snapshot and the Raft log, the durable record,
/// rather than trust what a failing disk left half written.
pub const ROWS_OK: &str = "state-rows-ok";

/// Removes the data dir's `ROWS_OK` (a storage fault stops the server).
pub fn distrust_rows(data_dir: &std::path::Path) {
    let _ = std::fs::remove_file(data_dir.join(ROWS_OK));
}

/// The sled key space: one tree of the server's database, named by the
/// `server` tree's `state_tree` row (a snapshot install fills a new tree and
/// then points that row at it).
pub struct SledBackend {
    db: sled::Db,
    dir: std::path::PathBuf,
    tree: RwLock<sled::Tree>,
}

const STATE_TREE: &[u8] = b"state_tree";
/// Rows per batch while a replace fills its new tree. Atomicity comes from
/// the pointer row, not the batch; and sled holds one epoch guard over a
/// batch, so one batch of a million rows kept every node copy it made
/// alive: 10.4 s and 7 GB of RSS to fill 1,000,000 KV rows, against 2.9 s
/// and 0.87 GB in batches of 512 (measured in one process, mimalloc).
const FILL_ROWS: usize = 512;
const SERVER_TREE: &str = "server";

impl SledBackend {
    /// The name of the tree in use.
    fn current(db: &sled::Db) -> anyhow::Result<Vec<u8>> {
        Ok(match db.open_tree(SERVER_TREE)?.get(STATE_TREE)? {
            Some(n) => n.to_vec(),
            None => b"state".to_vec(),
        })
    }

    /// The format version of the rows in `db`, changing nothing (for
    /// `cairn debug data-dir`).
    pub fn format_in(db: &sled::Db, dir: &std::path::Path) -> anyhow::Result<Option<u32>> {
        let p = SledBackend {
            tree: RwLock::new(db.open_tree(Self::current(db)?)?),
            db: db.clone(),
            dir: dir.to_path_buf(),
        };
        found_format(&p)
    }

    /// The state in `db` (opened in `dir`); drops what a crash in the
    /// middle of an install left behind.
    pub fn new(db: &sled::Db, dir: &std::path::Path) -> anyhow::Result<Self> {
        let name = Self::current(db)?;
        for other in db.tree_names() {
            if other.starts_with(b"state") && *other != *name {
                db.drop_tree(&other)?;
            }
        }
        Ok(SledBackend {
            tree: RwLock::new(db.open_tree(&name)?),
            db: db.clone(),
            dir: dir.to_path_buf(),
        })
    }

    /// Drops the state's rows, keeping the rest of the database (the vote,
    /// the node id): the start that follows rebuilds them from the
    /// snapshot and the Raft log.
    pub fn discard(db: &sled::Db) -> anyhow::Result<()> {
        for name in db.tree_names() {
            if name.starts_with(b"state") {
                db.drop_tree(&name)?;
            }
        }
        db.open_tree(SERVER_TREE)?.remove(STATE_TREE)?;
        db.flush()?;
        Ok(())
    }

    fn tree(&self) -> sled::Tree {
        // A poisoned lock only means a panic between two plain assignments.
        self.tree.read().clone()
    }
}

impl Persist for SledBackend {
    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.tree().get(key)?.map(|v| v.to_vec()))
    }

    fn batch(&self, ops: Ops) -> anyhow::Result<()> {
        let mut b = sled::Batch::default();
        for (k, v) in ops {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        self.tree().apply_batch(b)?;
        Ok(())
    }

    fn replace(&self, ops: Ops) -> anyhow::Result<()> {
        // Built aside, made durable, then pointed to with one durable row:
        // a crash before the pointer moves leaves the old tree in use (the
        // new one is dropped on open), after it the new one, whole.
        let name = format!("state-{}", self.db.generate_id()?);
        let fresh = self.db.open_tree(&name)?;
        let mut rows = ops
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .peekable();
        while rows.peek().is_some() {
            let mut b = sled::Batch::default();
            for (k, v) in rows.by_ref().take(FILL_ROWS) {
                b.insert(k, v);
            }
            fresh.apply_batch(b)?;
        }
        self.db.flush()?;
        self.db
            .open_tree(SERVER_TREE)?
            .insert(STATE_TREE, name.as_bytes())?;
        self.db.flush()?;
        let old = std::mem::replace(&mut *self.tree.write(), fresh);
        self.db.drop_tree(old.name())?;
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()> {
        for kv in self.tree().scan_prefix(prefix) {
            let (k, v) = kv?;
            f(&k, &v)?;
        }
        Ok(())
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }
}

/// An in-memory key space for simulations; clones share it, so a simulated
/// crash can hand the same "disk" to the restarted server.
#[derive(Clone, Default)]
pub struct MemoryBackend {
    map: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
}

impl Persist for MemoryBackend {
    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.map.lock().get(key).cloned())
    }

    fn batch(&self, ops: Ops) -> anyhow::Result<()> {
        let mut map = self.map.lock();
        for (k, v) in ops {
            match v {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        Ok(())
    }

    fn replace(&self, ops: Ops) -> anyhow::Result<()> {
        let mut map = self.map.lock();
        map.clear();
        map.extend(ops.into_iter().filter_map(|(k, v)| Some((k, v?))));
        Ok(())
    }

    fn location(&self) -> String {
        "the simulated state".into()
    }

    fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()> {
        // Copied out first: the visitor may take a while, and the map's
        // lock is the simulated disk's.
        let rows: Vec<(Vec<u8>, Vec<u8>)> = self
            .map
            .lock()
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in &rows {
            f(k, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(p: &dyn Persist) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        p.scan_prefix(&[], &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        out
    }

    fn put(k: &str, v: &str) -> (Vec<u8>, Option<Vec<u8>>) {
        (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn a_replace_leaves_the_old_rows_or_the_new_ones_across_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let open = || sled::open(dir.path()).unwrap();
        {
            let db = open();
            let p = SledBackend::new(&db, dir.path()).unwrap();
            p.batch(vec![put("a", "old"), put("b", "old")]).unwrap();
            // A crash in the middle of an install: the new tree is partly
            // filled and not yet pointed to.
            db.open_tree("state-999")
                .unwrap()
                .insert("a", "half")
                .unwrap();
            db.flush().unwrap();
        }
        {
            let db = open();
            let p = SledBackend::new(&db, dir.path()).unwrap();
            let old = vec![
                (b"a".to_vec(), b"old".to_vec()),
                (b"b".to_vec(), b"old".to_vec()),
            ];
            assert_eq!(rows(&p), old);
            assert!(!db.tree_names().iter().any(|n| &**n == b"state-999"));
            p.replace(vec![put("c", "new")]).unwrap();
            assert_eq!(rows(&p), vec![(b"c".to_vec(), b"new".to_vec())]);
            db.flush().unwrap();
        }
        let db = open();
        let p = SledBackend::new(&db, dir.path()).unwrap();
        assert_eq!(rows(&p), vec![(b"c".to_vec(), b"new".to_vec())]);
        // The old tree is gone; only the one in use is left.
        let states = db
            .tree_names()
            .into_iter()
            .filter(|n| n.starts_with(b"state"))
            .count();
        assert_eq!(states, 1);
    }

    /// Two services whose node and ID, joined by NUL as rows once were,
    /// both gave `a\0b\0c`: one overwrote the other on disk, and after a
    /// restart the survivor came back under the wrong node.
    #[test]
    fn names_that_joined_into_one_key_get_rows_of_their_own() {
        use super::super::{pair_key, split_pair_key};
        let pairs = [("a\0b", "c"), ("a", "b\0c"), ("a:1", "b"), ("a", ":1b")];
        let mut st = State::default();
        for (node, id) in pairs {
            assert_eq!(split_pair_key(&pair_key(node, id)), Some((node, id)));
            let svc = NodeService {
                id: id.into(),
                ..Default::default()
            };
            st.services
                .insert((node.to_string(), id.to_string()), Arc::new(svc));
        }
        let keys: std::collections::BTreeSet<String> =
            pairs.iter().map(|(n, i)| pair_key(n, i)).collect();
        assert_eq!(keys.len(), pairs.len());
        let p = MemoryBackend::default();
        replace_all(&p, &st, Vec::new()).unwrap();
        let loaded = load_state(&p).unwrap();
        let got: Vec<_> = loaded.services.keys().cloned().collect();
        let want: Vec<_> = st.services.keys().cloned().collect();
        assert_eq!(got, want);
        assert_eq!(split_pair_key("5:ab"), None);
        assert_eq!(split_pair_key("x:ab"), None);
    }

    #[test]
    fn rows_of_another_format_version_are_refused() {
        let p = MemoryBackend::default();
        check_format(&p).unwrap();
        assert_eq!(
            p.get(META_FORMAT).unwrap(),
            Some(STATE_FORMAT.to_be_bytes().to_vec())
        );
        check_format(&p).unwrap();
        p.batch(vec![(
            META_FORMAT.to_vec(),
            Some(7u32.to_be_bytes().to_vec()),
        )])
        .unwrap();
        let e = check_format(&p).unwrap_err().to_string();
        assert!(e.contains("format version 7"), "{e}");
        // Rows from before versions existed are not guessed at either.
        let p = MemoryBackend::default();
        p.batch(vec![put("kfoo", "x")]).unwrap();
        assert!(check_format(&p).is_err());
    }
}
