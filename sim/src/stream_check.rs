//! Checker (d): what an event-stream subscriber saw, against what was
//! committed.
//!
//! The subscriber moves between servers and resumes from the last index it
//! holds. Its view must stay exactly the committed KV state:
//! - a snapshot equals the committed state at its index, which never lies
//!   behind what the subscriber already had;
//! - after it, every index with KV changes arrives once, in order, with
//!   exactly the changes committed there; none is skipped, none invented;
//! - a snapshot comes only when asked for (index 0) or announced
//!   (`NewSnapshotToFollow`);
//! - by the end the subscriber has caught up with the last commit;
//! - with ACLs on, its token reads only some keys: no event (snapshot or
//!   live) carries a key it may not read, and "committed" above means the
//!   changes to keys it may read (an index that changed none of them is
//!   not delivered at all).

use std::collections::BTreeMap;

use crate::node::{Committed, StreamItem};
use crate::workload::{StreamRecord, is_snapshot};

#[derive(Debug, Default)]
pub struct StreamStats {
    pub connects: usize,
    /// Connects that resumed from an index (no snapshot asked for).
    pub resumes: usize,
    pub snapshots: usize,
    /// `NewSnapshotToFollow` received.
    pub restarts: usize,
    /// Events received after snapshots (each checked).
    pub events: usize,
    pub indexes: usize,
    pub failures: Vec<String>,
}

type View = BTreeMap<String, String>;

/// Per index, the KV changes committed there.
type Changes = BTreeMap<u64, BTreeMap<String, Option<String>>>;

/// The committed KV state at `index`.
fn state_at(kv: &Changes, index: u64) -> View {
    let mut view = View::new();
    for changes in kv.range(..=index).map(|(_, c)| c) {
        for (key, value) in changes {
            match value {
                Some(v) => view.insert(key.clone(), v.clone()),
                None => view.remove(key),
            };
        }
    }
    view
}

fn diff(expected: &View, got: &View) -> String {
    let mut out = Vec::new();
    for (k, v) in expected {
        match got.get(k) {
            None => out.push(format!("{k} missing")),
            Some(g) if g != v => out.push(format!("{k} is {g}, committed {v}")),
            _ => {}
        }
    }
    for k in got.keys().filter(|k| !expected.contains_key(*k)) {
        out.push(format!("{k} was never committed there"));
    }
    out.join("; ")
}

impl StreamStats {
    /// Adds another subscriber's figures and failures.
    pub fn add(&mut self, o: StreamStats) {
        self.connects += o.connects;
        self.resumes += o.resumes;
        self.snapshots += o.snapshots;
        self.restarts += o.restarts;
        self.events += o.events;
        self.indexes += o.indexes;
        self.failures.extend(o.failures);
    }
}

/// Checks one subscriber's log; `may_read`: the keys its token may read
/// (every key with ACLs off).
pub fn check_stream(
    log: &[StreamRecord], truth: &Committed, may_read: &dyn Fn(&str) -> bool,
) -> StreamStats {
    let mut st = StreamStats::default();
    st.failures.extend(truth.conflicts.iter().cloned());
    // What the subscriber is owed: the changes to keys it may read.
    let kv: Changes = truth
        .kv
        .iter()
        .filter_map(|(index, changes)| {
            let readable: BTreeMap<_, _> = changes
                .iter()
                .filter(|(key, _)| may_read(key))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (!readable.is_empty()).then_some((*index, readable))
        })
        .collect();
    let mut cursor = 0u64;
    let mut view = View::new();
    let mut want_snapshot = true;
    let fail = |st: &mut StreamStats, msg: String| {
        if st.failures.len() < 5 {
            st.failures.push(format!("event stream: {msg}"));
        }
    };
    for rec in log {
        let items = match rec {
            StreamRecord::Connect { server, index } => {
                st.connects += 1;
                if *index == 0 {
                    want_snapshot = true;
                } else {
                    // A resume from the view it holds, even one a server
                    // told it to replace (NewSnapshotToFollow) before it
                    // moved on: that view is still the committed state at
                    // its cursor, so events after it are a valid answer.
                    st.resumes += 1;
                    if *index != cursor {
                        fail(
                            &mut st,
                            format!("resumed at {index}, its view is at {cursor}"),
                        );
                    }
                    want_snapshot = false;
                }
                let _ = server;
                continue;
            }
            StreamRecord::Batch(items) => items,
        };
        for item in items {
            if let StreamItem::Event { index, key, .. } = item
                && !may_read(key)
            {
                fail(
                    &mut st,
                    format!("an event for {key} (index {index}), which its token may not read"),
                );
            }
        }
        if items.contains(&StreamItem::NewSnapshotToFollow) {
            if items.len() != 1 {
                fail(
                    &mut st,
                    format!("NewSnapshotToFollow inside a batch: {items:?}"),
                );
            }
            st.restarts += 1;
            want_snapshot = true;
            continue;
        }
        if is_snapshot(items) {
            let Some(StreamItem::EndOfSnapshot(at)) = items.last() else {
                unreachable!("is_snapshot");
            };
            st.snapshots += 1;
            if !want_snapshot {
                fail(&mut st, format!("a snapshot at {at} nobody asked for"));
            }
            if *at < cursor {
                fail(
                    &mut st,
                    format!("snapshot at {at} is behind index {cursor} already seen"),
                );
            }
            view = items
                .iter()
                .filter_map(|i| match i {
                    StreamItem::Event {
                        key,
                        value: Some(v),
                        ..
                    } => Some((key.clone(), v.clone())),
                    _ => None,
                })
                .collect();
            let committed = state_at(&kv, *at);
            if view != committed {
                fail(
                    &mut st,
                    format!(
                        "snapshot at {at} differs from the committed state: {}",
                        diff(&committed, &view)
                    ),
                );
                view = committed;
            }
            cursor = *at;
            want_snapshot = false;
            continue;
        }
        if want_snapshot {
            fail(&mut st, format!("events before a snapshot: {items:?}"));
            continue;
        }
        // Events, grouped by index.
        let mut by_index: BTreeMap<u64, BTreeMap<String, Option<String>>> = BTreeMap::new();
        let mut last = cursor;
        for item in items {
            let StreamItem::Event { index, key, value } = item else {
                fail(&mut st, format!("a marker among events: {items:?}"));
                continue;
            };
            st.events += 1;
            if *index < last || *index <= cursor {
                fail(
                    &mut st,
                    format!("index {index} after {last} (resumed at {cursor})"),
                );
            }
            last = last.max(*index);
            // One index may change a key twice (writes batched into one
            // entry): the later event is the key's value at that index.
            by_index
                .entry(*index)
                .or_default()
                .insert(key.clone(), value.clone());
        }
        let Some(&top) = by_index.keys().next_back() else {
            continue;
        };
        if top <= cursor {
            // Only old indexes, already reported above.
            continue;
        }
        for (index, committed) in kv.range(cursor + 1..=top) {
            match by_index.get(index) {
                None => fail(&mut st, format!("index {index} skipped: {committed:?}")),
                Some(got) if got != committed => fail(
                    &mut st,
                    format!("index {index} delivered as {got:?}, committed as {committed:?}"),
                ),
                Some(_) => {}
            }
        }
        for index in by_index.keys() {
            if !kv.contains_key(index) {
                fail(&mut st, format!("index {index} has no committed KV change"));
            }
        }
        for (key, value) in by_index.into_values().flatten() {
            match value {
                Some(v) => view.insert(key, v),
                None => view.remove(&key),
            };
        }
        st.indexes += kv.range(cursor + 1..=top).count();
        cursor = top;
    }
    if let Some((&last, _)) = kv.iter().next_back()
        && cursor < last
    {
        fail(
            &mut st,
            format!("the subscriber ended at index {cursor}, the last KV commit is {last}"),
        );
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth(changes: &[(u64, &str, Option<&str>)]) -> Committed {
        let mut t = Committed::default();
        for (i, k, v) in changes {
            t.kv.entry(*i)
                .or_default()
                .insert(k.to_string(), v.map(str::to_string));
        }
        t
    }

    fn ev(index: u64, key: &str, value: Option<&str>) -> StreamItem {
        StreamItem::Event {
            index,
            key: key.into(),
            value: value.map(str::to_string),
        }
    }

    fn all(_: &str) -> bool {
        true
    }

    fn connect(index: u64) -> StreamRecord {
        StreamRecord::Connect { server: 0, index }
    }

    fn batch(items: Vec<StreamItem>) -> StreamRecord {
        StreamRecord::Batch(items)
    }

    fn committed() -> Committed {
        truth(&[
            (3, "a", Some("1")),
            (5, "b", Some("2")),
            (6, "a", None),
            (6, "c", Some("3")),
            (9, "b", Some("4")),
        ])
    }

    fn good_log() -> Vec<StreamRecord> {
        vec![
            connect(0),
            batch(vec![ev(4, "a", Some("1")), StreamItem::EndOfSnapshot(4)]),
            batch(vec![ev(5, "b", Some("2"))]),
            // Moves to another server, resumes from 5.
            connect(5),
            batch(vec![ev(6, "a", None), ev(6, "c", Some("3"))]),
            connect(6),
            batch(vec![StreamItem::NewSnapshotToFollow]),
            batch(vec![
                ev(8, "b", Some("2")),
                ev(8, "c", Some("3")),
                StreamItem::EndOfSnapshot(8),
            ]),
            batch(vec![ev(9, "b", Some("4"))]),
        ]
    }

    #[test]
    fn a_faithful_stream_passes() {
        let st = check_stream(&good_log(), &committed(), &all);
        assert!(st.failures.is_empty(), "{:?}", st.failures);
        assert_eq!(
            (st.connects, st.resumes, st.snapshots, st.restarts),
            (3, 2, 2, 1)
        );
    }

    #[test]
    fn a_skipped_index_fails() {
        let mut log = good_log();
        log.remove(2); // index 5 never arrives; 6 comes after 4
        log[2] = connect(4);
        let st = check_stream(&log, &committed(), &all);
        assert!(
            st.failures.iter().any(|f| f.contains("index 5 skipped")),
            "{:?}",
            st.failures
        );
    }

    #[test]
    fn an_index_delivered_twice_fails() {
        let mut log = good_log();
        log.insert(3, batch(vec![ev(5, "b", Some("2"))]));
        let st = check_stream(&log, &committed(), &all);
        assert!(!st.failures.is_empty());
    }

    #[test]
    fn half_an_index_fails() {
        let mut log = good_log();
        log[4] = batch(vec![ev(6, "c", Some("3"))]);
        let st = check_stream(&log, &committed(), &all);
        assert!(
            st.failures
                .iter()
                .any(|f| f.contains("index 6 delivered as")),
            "{:?}",
            st.failures
        );
    }

    #[test]
    fn a_wrong_or_stale_snapshot_fails() {
        let mut log = good_log();
        log[1] = batch(vec![ev(4, "a", Some("9")), StreamItem::EndOfSnapshot(4)]);
        assert!(!check_stream(&log, &committed(), &all).failures.is_empty());
        let mut log = good_log();
        log[7] = batch(vec![ev(3, "a", Some("1")), StreamItem::EndOfSnapshot(3)]);
        let st = check_stream(&log, &committed(), &all);
        assert!(
            st.failures.iter().any(|f| f.contains("behind")),
            "{:?}",
            st.failures
        );
    }

    #[test]
    fn an_unannounced_snapshot_and_falling_behind_fail() {
        let mut log = good_log();
        log.remove(6); // no NewSnapshotToFollow before the second snapshot
        assert!(!check_stream(&log, &committed(), &all).failures.is_empty());
        let mut log = good_log();
        log.pop();
        let st = check_stream(&log, &committed(), &all);
        assert!(
            st.failures.iter().any(|f| f.contains("ended at index 8")),
            "{:?}",
            st.failures
        );
    }

    /// A token that may not read `c`: the good log without c's events.
    fn not_c(key: &str) -> bool {
        key != "c"
    }

    fn without_c(log: Vec<StreamRecord>) -> Vec<StreamRecord> {
        log.into_iter()
            .map(|r| match r {
                StreamRecord::Batch(items) => batch(
                    items
                        .into_iter()
                        .filter(|i| !matches!(i, StreamItem::Event { key, .. } if key == "c"))
                        .collect(),
                ),
                r => r,
            })
            .collect()
    }

    #[test]
    fn a_restricted_subscriber_gets_exactly_what_it_may_read() {
        let st = check_stream(&without_c(good_log()), &committed(), &not_c);
        assert!(st.failures.is_empty(), "{:?}", st.failures);
        // A key it may not read, live or in a snapshot.
        let mut live = without_c(good_log());
        live[4] = batch(vec![ev(6, "a", None), ev(6, "c", Some("3"))]);
        let mut snapshot = without_c(good_log());
        snapshot[7] = batch(vec![
            ev(8, "b", Some("2")),
            ev(8, "c", Some("3")),
            StreamItem::EndOfSnapshot(8),
        ]);
        for log in [live, snapshot] {
            let st = check_stream(&log, &committed(), &not_c);
            assert!(
                st.failures
                    .iter()
                    .any(|f| f.contains("c (index") && f.contains("may not read")),
                "{:?}",
                st.failures
            );
        }
        // Still owed every change it may read: index 6 (a's delete).
        let mut log = without_c(good_log());
        log[4] = batch(vec![ev(9, "b", Some("4"))]);
        let st = check_stream(&log, &committed(), &not_c);
        assert!(
            st.failures.iter().any(|f| f.contains("index 6 skipped")),
            "{:?}",
            st.failures
        );
    }
}
