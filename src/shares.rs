//! Bounded shares of a resource per holder (a client IP, a caller): how
//! many units each holds, so that none takes more than its share of
//! connections or waiting places. A unit is given back when its `Share`
//! drops.
//!
//! Used for the HTTP, gRPC and DNS ports' connections per client IP, the
//! blocking places per caller, and forwarded requests per caller and
//! datacenter.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// How many units each holder has taken.
pub struct Shares<K> {
    held: parking_lot::Mutex<HashMap<K, usize>>,
}

impl<K> Default for Shares<K> {
    fn default() -> Self {
        Shares {
            held: Default::default(),
        }
    }
}

impl<K> std::fmt::Debug for Shares<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shares({} holders)", self.held.lock().len())
    }
}

/// One unit of a holder's share, given back when dropped.
pub struct Share<K: Hash + Eq> {
    shares: Arc<Shares<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone> Shares<K> {
    /// One more unit for `key`, unless it holds `max` already.
    pub fn take(self: &Arc<Self>, key: K, max: usize) -> Option<Share<K>> {
        let mut held = self.held.lock();
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Share {
            shares: self.clone(),
            key,
        })
    }
}

impl<K: Hash + Eq> Drop for Share<K> {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_takes_at_most_its_share_and_gets_it_back() {
        let shares: Arc<Shares<&str>> = Arc::default();
        let a: Vec<_> = (0..3).filter_map(|_| shares.take("a", 2)).collect();
        assert_eq!(a.len(), 2);
        assert!(
            shares.take("b", 2).is_some(),
            "another holder is not held back"
        );
        drop(a);
        let again: Vec<_> = (0..3).filter_map(|_| shares.take("a", 2)).collect();
        assert_eq!(again.len(), 2, "a dropped unit is given back");
        assert!(shares.held.lock().get("a") == Some(&2));
    }
}
