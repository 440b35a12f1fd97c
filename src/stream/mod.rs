//! The event publisher: every applied change set, in commit order, for
//! whatever reacts to change (the stream endpoint, proxycfg).
//!
//! For now a broadcast of change sets; topics, buffers and snapshots build
//! on it.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::state::ChangeSet;

pub struct Publisher {
    tx: broadcast::Sender<Arc<ChangeSet>>,
}

impl Default for Publisher {
    fn default() -> Self {
        Publisher {
            tx: broadcast::channel(1024).0,
        }
    }
}

impl Publisher {
    /// Called after each applied batch, outside the state machine's writes.
    pub fn publish(&self, sets: &[ChangeSet]) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        for set in sets {
            let _ = self.tx.send(Arc::new(set.clone()));
        }
    }

    /// The whole state was replaced: subscribers must start over.
    pub fn reset(&self) {
        let _ = self.tx.send(Arc::new(ChangeSet::default()));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<ChangeSet>> {
        self.tx.subscribe()
    }
}
