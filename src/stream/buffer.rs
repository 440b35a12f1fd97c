//! One topic's buffer of recent events: ordered by index, bounded in count
//! and bytes, read by subscribers at their own pace.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

use super::Event;

pub struct Buffer {
    inner: Mutex<Inner>,
    max_events: usize,
    max_bytes: usize,
}

struct Inner {
    events: VecDeque<Arc<Event>>,
    bytes: usize,
    /// Highest index whose events were evicted (or never held: the state
    /// the publisher started from): a subscriber whose cursor is below it
    /// may have missed some.
    evicted_upto: u64,
    /// Bumped when the state is replaced; subscribers must start over.
    generation: u64,
}

impl Buffer {
    /// A buffer holding every event after `floor`.
    pub fn new(max_events: usize, max_bytes: usize, floor: u64) -> Self {
        Buffer {
            inner: Mutex::new(Inner {
                events: VecDeque::new(),
                bytes: 0,
                evicted_upto: floor,
                generation: 0,
            }),
            max_events,
            max_bytes,
        }
    }

    /// Appends the events of one index (in order), evicting the oldest
    /// beyond the limits.
    pub fn append(&self, _index: u64, events: Vec<Arc<Event>>) {
        let mut b = self.inner.lock();
        for e in events {
            b.bytes += e.size();
            b.events.push_back(e);
        }
        while b.events.len() > self.max_events || (b.bytes > self.max_bytes && b.events.len() > 1) {
            let old = b.events.pop_front().expect("not empty");
            b.bytes -= old.size();
            b.evicted_upto = b.evicted_upto.max(old.index);
        }
    }

    /// Events after `cursor`, or `None` if some of them were evicted.
    pub fn after(&self, cursor: u64) -> Option<Vec<Arc<Event>>> {
        let b = self.inner.lock();
        if cursor < b.evicted_upto {
            return None;
        }
        let start = b.events.partition_point(|e| e.index <= cursor);
        Some(b.events.range(start..).cloned().collect())
    }

    /// Whether every event after `index` is still here.
    pub fn covers(&self, index: u64) -> bool {
        index >= self.inner.lock().evicted_upto
    }

    pub fn generation(&self) -> u64 {
        self.inner.lock().generation
    }

    /// The state was replaced at `floor`: nothing before it is here.
    pub fn reset(&self, floor: u64) {
        let mut b = self.inner.lock();
        b.events.clear();
        b.bytes = 0;
        b.evicted_upto = floor;
        b.generation += 1;
    }

    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
