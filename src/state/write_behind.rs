//! Write-behind for the state's rows: applied batches are merged in memory
//! and written to the backend together, every `INTERVAL` (a `TICK` while
//! fewer than `FEW` rows wait) or sooner when `SOON` bytes wait, on a
//! thread of their own, in write-outs of at most `CHUNK_ROWS` rows.
//!
//! Why it is safe: the rows are not the durable record, the Raft log is (it
//! is fsync'd before a write is acknowledged; the rows never were). Each
//! write-out is one atomic batch that ends on an applied batch and carries
//! its applied log id, so the backend always holds the state of some
//! applied index. A crash loses at most the rows of the last `INTERVAL`,
//! and the restart re-applies them from the log (or first installs the
//! saved snapshot, if the log was purged past them: openraft does both at
//! start).
//!
//! Why it pays: every applied batch used to be a sled batch of its own,
//! each row a page update and each batch work for sled's I/O threads: under
//! load a quarter of a server's CPU. Merged, a key written many times in a
//! write-out is written once, and sled is woken far less often. etcd's
//! backend commits the same way (bbolt, every 100 ms).
//!
//! A replace (snapshot install, restore commit) is queued as well, as one
//! write-out of its own that fills a new tree and then points at it
//! (`Persist::replace`), dropping what was merged before it: those rows
//! belong to the state being replaced. Filling a million rows takes
//! seconds; the server serves the new state from memory and applies the
//! entries after it meanwhile, their write-outs queued behind it (up to
//! `REPLACE_HARD` bytes, not `HARD`: the applier must not wait). Until the
//! new tree is pointed at, the backend holds the old state and its older
//! applied id: a crash then restarts from the saved snapshot (made durable
//! before the install) or the log, as after any lost write-out.
//!
//! Why write-outs are bounded by rows: sled holds one epoch guard over a
//! whole batch, so every copy of a node the batch replaces stays allocated
//! until the batch ends, and is freed later still. Write-outs of thousands
//! of rows multiplied a leader's memory per KV entry by four (measured:
//! 1,852 B -> 8,523 B at 100,000 entries); write-outs no larger than one
//! applied batch or `CHUNK_ROWS` keep it where per-batch writes had it.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::persist::{Ops, Persist, RowVisitor};

/// How long an applied row may wait before it is written.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// How often the writer looks: a write-out of fewer than `FEW` rows is
/// written once it is this old (light load: small write-outs cost little,
/// and a large one every `INTERVAL` delays the requests it runs beside).
pub const TICK: Duration = Duration::from_millis(20);
/// Rows below which a write-out waits only a `TICK`.
pub const FEW: usize = CHUNK_ROWS / 4;
/// Bytes waiting that start a write-out before the interval ends.
pub const SOON: usize = 8 << 20;
/// Bytes waiting past which the applier writes them itself: the writer
/// thread fell behind, and memory must not grow without bound. It also
/// bounds what a clean shutdown writes before it exits (16 MiB of rows
/// into a tree of a million took 1.9 s here; 64 MiB took 3.3 s quiet and
/// past the 10 s a supervisor waits under load, so the restart began with
/// a snapshot install and a rejoin).
pub const HARD: usize = 16 << 20;
/// `HARD` while a replace is queued or being written: a million rows take
/// the writer ten seconds, and an applier blocked behind them would stop
/// a joining server from applying the entries after its snapshot for as
/// long (measured: serving 20.9 s after start instead of 5.9 s).
pub const REPLACE_HARD: usize = 128 << 20;
/// Rows in one write-out at most (and `SOON` bytes), unless one applied
/// batch alone has more (it is then written alone, as it always was).
pub const CHUNK_ROWS: usize = 512;

/// A `Persist` that merges batches and writes them behind.
pub struct WriteBehind {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    inner: Box<dyn Persist>,
    /// The data dir whose `persist::ROWS_OK` a failed write-out removes,
    /// so the next start rebuilds the rows.
    data_dir: Option<PathBuf>,
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Held while merged rows are written: two write-outs never overlap,
    /// so they reach the backend in the order their rows were applied.
    writing: Mutex<()>,
    /// Without a thread: write out at every `n`th batch.
    every: Option<usize>,
}

/// Merged batches waiting to be written: each ends on an applied batch.
struct Chunk {
    rows: Rows,
    bytes: usize,
    /// When its first batch came.
    since: Instant,
}

enum Rows {
    /// Applied batches, merged: a key written in several is written once.
    Merged(BTreeMap<Vec<u8>, Option<Vec<u8>>>),
    /// A whole new state, for the backend's `replace`.
    Whole(Ops),
}

impl Chunk {
    fn new() -> Self {
        Chunk {
            rows: Rows::Merged(BTreeMap::new()),
            bytes: 0,
            since: Instant::now(),
        }
    }

    /// How many merged rows it holds; `None` for a replace, which takes
    /// no more.
    fn merged(&self) -> Option<usize> {
        match &self.rows {
            Rows::Merged(m) => Some(m.len()),
            Rows::Whole(_) => None,
        }
    }
}

#[derive(Default)]
struct Pending {
    /// Oldest first; each holds at most `CHUNK_ROWS` rows and `SOON`
    /// bytes unless one applied batch alone has more.
    chunks: VecDeque<Chunk>,
    bytes: usize,
    /// Batches merged since the last write-out.
    batches: usize,
    /// The writer thread's last write-out failed: told to the next caller,
    /// whose error stops Raft (fail stop).
    failed: Option<String>,
    stop: bool,
    /// The writer is writing a replace (popped from `chunks`).
    replacing: bool,
}

impl Pending {
    /// The bytes past which the applier writes them itself.
    fn hard(&self) -> usize {
        let queued = self.chunks.front().is_some_and(|c| c.merged().is_none());
        if self.replacing || queued {
            REPLACE_HARD
        } else {
            HARD
        }
    }
}

impl WriteBehind {
    /// Writes behind on a thread of its own. A failed write-out makes
    /// `data_dir`'s rows untrusted (`persist::distrust_rows`).
    pub fn new(inner: Box<dyn Persist>, data_dir: Option<PathBuf>) -> anyhow::Result<Self> {
        let mut shared = Shared::new(inner, None);
        shared.data_dir = data_dir;
        let shared = Arc::new(shared);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("state-write".into())
            .spawn(move || s.run())?;
        Ok(WriteBehind {
            shared,
            thread: Some(thread),
        })
    }

    /// Writes behind without a thread: every `n`th batch writes out what
    /// it and the batches before it merged. For the simulation, which must
    /// stay deterministic, and whose crashes then lose rows as a real
    /// server's do.
    pub fn every(inner: Box<dyn Persist>, n: usize) -> Self {
        WriteBehind {
            shared: Arc::new(Shared::new(inner, Some(n.max(1)))),
            thread: None,
        }
    }
}

impl Shared {
    fn new(inner: Box<dyn Persist>, every: Option<usize>) -> Self {
        Shared {
            inner,
            data_dir: None,
            pending: Mutex::default(),
            wake: Condvar::new(),
            writing: Mutex::new(()),
            every,
        }
    }

    /// Writes what is merged, write-out by write-out.
    fn write_out(&self) -> anyhow::Result<()> {
        let r = self.write_out_once();
        if r.is_err() {
            self.distrust();
        }
        r
    }

    /// The rows may now be damaged on disk (sled, failing in the middle of
    /// a write, was seen to keep a later batch and lose an earlier row):
    /// the next start must not trust them.
    fn distrust(&self) {
        if let Some(dir) = &self.data_dir {
            super::persist::distrust_rows(dir);
        }
    }

    /// Writes the waiting chunks in order, each as one batch.
    fn write_out_once(&self) -> anyhow::Result<()> {
        let _order = self.writing.lock();
        loop {
            let chunk = {
                let mut p = self.pending.lock();
                if let Some(why) = &p.failed {
                    anyhow::bail!("{why}");
                }
                match p.chunks.pop_front() {
                    Some(c) => {
                        p.bytes -= c.bytes;
                        c
                    }
                    None => {
                        p.batches = 0;
                        return Ok(());
                    }
                }
            };
            match chunk.rows {
                Rows::Merged(m) if m.is_empty() => {}
                Rows::Merged(m) => self.inner.batch(m.into_iter().collect())?,
                Rows::Whole(ops) => {
                    let started = Instant::now();
                    let rows = ops.len();
                    self.pending.lock().replacing = true;
                    let r = self.inner.replace(ops);
                    self.pending.lock().replacing = false;
                    r?;
                    tracing::info!(
                        rows,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "wrote the rows of a replaced state"
                    );
                }
            }
        }
    }

    /// The writer thread, until stopped (then once more): writes what
    /// waits once its oldest batch is `INTERVAL` old (or `SOON` bytes
    /// wait), or a `TICK` old while fewer than `FEW` rows wait.
    fn run(&self) {
        loop {
            let stop = {
                let mut p = self.pending.lock();
                loop {
                    if p.stop || p.bytes >= SOON {
                        break p.stop;
                    }
                    let Some(oldest) = p.chunks.front() else {
                        // Idle: the first batch wakes it.
                        self.wake.wait(&mut p);
                        continue;
                    };
                    let Some(rows) = oldest.merged() else {
                        // A replace: the sooner it is written, the less
                        // queues behind it.
                        break false;
                    };
                    let age = oldest.since.elapsed();
                    let few = p.chunks.len() == 1 && rows < FEW;
                    if age >= INTERVAL || (few && age >= TICK) {
                        break false;
                    }
                    self.wake.wait_for(&mut p, TICK.min(INTERVAL - age));
                }
            };
            if let Err(e) = self.write_out() {
                let why = format!("write of state rows to {}: {e:#}", self.inner.location());
                tracing::error!("{why}");
                self.pending.lock().failed.get_or_insert(why);
                return;
            }
            if stop {
                return;
            }
        }
    }
}

impl Persist for WriteBehind {
    /// Reads what was applied: the merged rows are written first.
    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        self.shared.write_out()?;
        self.shared.inner.get(key)
    }

    fn batch(&self, ops: Ops) -> anyhow::Result<()> {
        let s = &self.shared;
        let bytes: usize = ops
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        let now = {
            let mut p = s.pending.lock();
            if let Some(why) = &p.failed {
                anyhow::bail!("{why}");
            }
            let fits = p.chunks.back().is_some_and(|c| {
                c.merged()
                    .is_some_and(|n| n + ops.len() <= CHUNK_ROWS && c.bytes + bytes <= SOON)
            });
            if !fits {
                p.chunks.push_back(Chunk::new());
                if p.chunks.len() == 1 && s.every.is_none() {
                    // The writer was idle.
                    s.wake.notify_one();
                }
            }
            p.bytes += bytes;
            let chunk = p.chunks.back_mut().expect("pushed above");
            chunk.bytes += bytes;
            if let Rows::Merged(m) = &mut chunk.rows {
                m.extend(ops);
            }
            p.batches += 1;
            match s.every {
                Some(n) => p.batches >= n,
                None => {
                    if p.bytes >= SOON {
                        s.wake.notify_one();
                    }
                    p.bytes >= p.hard()
                }
            }
        };
        if now { s.write_out() } else { Ok(()) }
    }

    /// Replaces everything: what was merged belongs to the state being
    /// replaced, so it is dropped, not written. With a writer thread the
    /// replace is queued (see the module's comment); its rows are the
    /// state's own, not counted against `HARD`, and a later replace drops
    /// it.
    fn replace(&self, ops: Ops) -> anyhow::Result<()> {
        let s = &self.shared;
        let threaded = s.every.is_none();
        // Without a thread (the simulation) it is written here and now.
        let _order = (!threaded).then(|| s.writing.lock());
        {
            let mut p = s.pending.lock();
            if let Some(why) = &p.failed {
                anyhow::bail!("{why}");
            }
            p.chunks.clear();
            p.bytes = 0;
            p.batches = 0;
            if threaded {
                p.chunks.push_back(Chunk {
                    rows: Rows::Whole(ops),
                    bytes: 0,
                    since: Instant::now(),
                });
                s.wake.notify_one();
                return Ok(());
            }
        }
        let r = s.inner.replace(ops);
        if r.is_err() {
            s.distrust();
        }
        r
    }

    fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()> {
        self.shared.write_out()?;
        self.shared.inner.scan_prefix(prefix, f)
    }

    fn flush(&self) -> anyhow::Result<()> {
        self.shared.write_out()
    }

    fn location(&self) -> String {
        self.shared.inner.location()
    }
}

impl Drop for WriteBehind {
    /// Stops the writer thread once it has written what is merged.
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shared.pending.lock().stop = true;
            self.shared.wake.notify_one();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::MemoryBackend;

    fn put(k: &str, v: &str) -> (Vec<u8>, Option<Vec<u8>>) {
        (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()))
    }

    fn rows(p: &MemoryBackend) -> Vec<(String, String)> {
        let mut out = Vec::new();
        p.scan_prefix(&[], &mut |k, v| {
            out.push((
                String::from_utf8_lossy(k).into(),
                String::from_utf8_lossy(v).into(),
            ));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn batches_are_merged_and_written_whole_every_nth() {
        let disk = MemoryBackend::default();
        let w = WriteBehind::every(Box::new(disk.clone()), 3);
        w.batch(vec![put("a", "1"), put("applied", "1")]).unwrap();
        w.batch(vec![put("a", "2"), put("b", "1"), put("applied", "2")])
            .unwrap();
        // Nothing written yet: a crash now finds the state before both.
        assert!(rows(&disk).is_empty());
        w.batch(vec![(b"b".to_vec(), None), put("applied", "3")])
            .unwrap();
        assert_eq!(
            rows(&disk),
            [("a".into(), "2".into()), ("applied".into(), "3".into())]
        );
    }

    /// Records the size of every batch the backend is given.
    struct Sizes(MemoryBackend, Arc<Mutex<Vec<usize>>>);

    impl Persist for Sizes {
        fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
            self.0.get(key)
        }
        fn batch(&self, ops: Ops) -> anyhow::Result<()> {
            self.1.lock().push(ops.len());
            self.0.batch(ops)
        }
        fn replace(&self, ops: Ops) -> anyhow::Result<()> {
            self.0.replace(ops)
        }
        fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()> {
            self.0.scan_prefix(prefix, f)
        }
        fn location(&self) -> String {
            self.0.location()
        }
    }

    fn rows_of(batch: usize, n: usize) -> Ops {
        let mut ops: Ops = (0..n)
            .map(|i| put(&format!("k{batch}/{i:04}"), "v"))
            .collect();
        ops.push(put("applied", &batch.to_string()));
        ops
    }

    #[test]
    fn write_outs_hold_at_most_chunk_rows_and_end_on_an_applied_batch() {
        let disk = MemoryBackend::default();
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let w = WriteBehind::every(Box::new(Sizes(disk.clone(), sizes.clone())), 1000);
        // Small batches share a write-out (their `applied` rows merge
        // into one); a batch that would overflow it starts the next; one
        // larger than `CHUNK_ROWS` is written alone.
        for b in 0..4 {
            w.batch(rows_of(b, 99)).unwrap();
        }
        w.batch(rows_of(4, 200)).unwrap();
        w.batch(rows_of(5, CHUNK_ROWS + 10)).unwrap();
        w.batch(rows_of(6, 9)).unwrap();
        w.flush().unwrap();
        assert_eq!(
            *sizes.lock(),
            [4 * 99 + 1, 200 + 1, CHUNK_ROWS + 11, 9 + 1],
            "write-outs of merged batches"
        );
        assert_eq!(w.get(b"applied").unwrap(), Some(b"6".to_vec()));
        // Large values: a write-out holds at most `SOON` bytes too.
        sizes.lock().clear();
        let big = vec![b'x'; SOON / 4];
        for b in 0..4u8 {
            w.batch(vec![(vec![b'v', b], Some(big.clone()))]).unwrap();
        }
        w.flush().unwrap();
        assert_eq!(*sizes.lock(), [3, 1], "write-outs of large values");
        let written = rows(&disk).len();
        assert_eq!(written, 4 * 99 + 200 + CHUNK_ROWS + 10 + 9 + 1 + 4);
    }

    #[test]
    fn reads_see_every_batch_and_a_replace_drops_what_was_merged() {
        let disk = MemoryBackend::default();
        let w = WriteBehind::every(Box::new(disk.clone()), 100);
        w.batch(vec![put("a", "1")]).unwrap();
        assert_eq!(w.get(b"a").unwrap(), Some(b"1".to_vec()));
        w.batch(vec![put("b", "1")]).unwrap();
        w.replace(vec![put("c", "1")]).unwrap();
        w.flush().unwrap();
        assert_eq!(rows(&disk), [("c".into(), "1".into())]);
    }

    /// A backend whose `replace` waits until the test lets it go on.
    struct SlowReplace(MemoryBackend, Mutex<std::sync::mpsc::Receiver<()>>);

    impl Persist for SlowReplace {
        fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
            self.0.get(key)
        }
        fn batch(&self, ops: Ops) -> anyhow::Result<()> {
            self.0.batch(ops)
        }
        fn replace(&self, ops: Ops) -> anyhow::Result<()> {
            // Not forever: a replace written in the caller's thread
            // must fail the test, not hang it.
            let _ = self.1.lock().recv_timeout(Duration::from_secs(2));
            self.0.replace(ops)
        }
        fn scan_prefix(&self, prefix: &[u8], f: &mut RowVisitor) -> anyhow::Result<()> {
            self.0.scan_prefix(prefix, f)
        }
        fn location(&self) -> String {
            self.0.location()
        }
    }

    /// A write-behind over a `SlowReplace`: its disk, and the sender that
    /// lets the replace go on.
    fn slow_writer() -> (WriteBehind, MemoryBackend, std::sync::mpsc::Sender<()>) {
        let disk = MemoryBackend::default();
        let (go, wait) = std::sync::mpsc::channel();
        let slow = SlowReplace(disk.clone(), Mutex::new(wait));
        (WriteBehind::new(Box::new(slow), None).unwrap(), disk, go)
    }

    #[test]
    fn a_replace_is_written_behind_and_the_batches_after_it_land_on_it() {
        let (w, disk, go) = slow_writer();
        w.batch(vec![put("a", "1")]).unwrap();
        // Returns while the backend is still filling: an install does not
        // wait for a million rows to be written.
        w.replace(vec![put("c", "1"), put("applied", "5")]).unwrap();
        w.batch(vec![put("d", "1"), put("applied", "6")]).unwrap();
        // Past the interval, the batch after the replace is still not
        // written: a crash while the replace fills finds the old rows with
        // their own applied id, never the old rows with a later one (a
        // restart would then skip re-applying the restore from the log).
        std::thread::sleep(INTERVAL * 2);
        let before = rows(&disk);
        assert!(!before.contains(&("c".into(), "1".into())));
        assert!(!before.contains(&("d".into(), "1".into())));
        assert!(!before.iter().any(|(k, _)| k == "applied"), "{before:?}");
        go.send(()).unwrap();
        w.flush().unwrap();
        assert_eq!(
            rows(&disk),
            [
                ("applied".into(), "6".into()),
                ("c".into(), "1".into()),
                ("d".into(), "1".into())
            ]
        );
    }

    #[test]
    fn batches_past_hard_do_not_wait_for_a_replace_being_written() {
        let (w, disk, go) = slow_writer();
        w.replace(vec![put("applied", "1")]).unwrap();
        // Twice `HARD` in batches after it, while the replace is held: each
        // returns at once (the applier of a joining server keeps applying).
        let value = vec![b'v'; 1 << 20];
        let started = Instant::now();
        for i in 0..((2 * HARD) >> 20) {
            w.batch(vec![(format!("k{i:03}").into_bytes(), Some(value.clone()))])
                .unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the applier waited for the replace: {:?}",
            started.elapsed()
        );
        go.send(()).unwrap();
        w.flush().unwrap();
        assert_eq!(rows(&disk).len(), 1 + ((2 * HARD) >> 20));
    }

    #[test]
    fn the_thread_writes_within_the_interval_and_on_drop() {
        let disk = MemoryBackend::default();
        let w = WriteBehind::new(Box::new(disk.clone()), None).unwrap();
        w.batch(vec![put("a", "1")]).unwrap();
        let start = Instant::now();
        while rows(&disk).is_empty() {
            assert!(start.elapsed() < INTERVAL * 50, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        w.batch(vec![put("b", "1")]).unwrap();
        drop(w);
        assert_eq!(rows(&disk).len(), 2);
    }
}
