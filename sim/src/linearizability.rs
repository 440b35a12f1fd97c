//! A linearizability checker for single-key register histories with
//! compare-and-set, in the Wing–Gong style with Lowe's memoization (the
//! approach Porcupine takes), written for cairn's KV model.
//!
//! The model of one key is its current value: `None` (absent) or a value id.
//! Every write in the simulation stores a value id used nowhere else, so a
//! CAS on a `ModifyIndex` the client read is the same as a CAS on the value
//! it read: the entry carrying that index is the one that write created.
//!
//! The search walks the history's call and return events in time order,
//! tries to linearize each operation whose call it meets, and backtracks when
//! it meets the return of an operation it has not linearized. A set of
//! (operations linearized, model state) pairs already explored prunes the
//! search. Operations whose outcome the client never learned (timeouts,
//! errors) have no return event before the end: they may take effect at any
//! point after their call, or never.

use std::collections::HashSet;

/// What a client asked of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    Put(u64),
    Delete,
    /// Set `new` if the key holds `expected` (`None`: if it is absent).
    Cas {
        expected: Option<u64>,
        new: u64,
    },
    Get,
}

/// What it was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    Done,
    Cas(bool),
    Value(Option<u64>),
}

/// One operation. `ret == None`: the client never learned the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub client: u64,
    pub input: Input,
    pub output: Option<Output>,
    pub call: u64,
    pub ret: Option<u64>,
}

impl Op {
    /// Whether the operation can change the key.
    pub fn is_write(&self) -> bool {
        !matches!(self.input, Input::Get)
    }
}

/// The verdict on one key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order fits; the operations linearized at the deepest point of the
    /// search, then the operation that could not follow them.
    Violation {
        deepest: Vec<usize>,
        stuck_on: Option<usize>,
    },
    /// The search gave up after `budget` states.
    Inconclusive,
}

/// Applies `input` to `state`; `None` if `output` cannot be its answer.
fn step(state: Option<u64>, input: Input, output: Option<Output>) -> Option<Option<u64>> {
    match (input, output) {
        (Input::Put(v), None | Some(Output::Done)) => Some(Some(v)),
        (Input::Delete, None | Some(Output::Done)) => Some(None),
        (Input::Cas { expected, new }, None) => {
            Some(if state == expected { Some(new) } else { state })
        }
        (Input::Cas { expected, new }, Some(Output::Cas(ok))) => {
            if (state == expected) != ok {
                None
            } else if ok {
                Some(Some(new))
            } else {
                Some(state)
            }
        }
        (Input::Get, Some(Output::Value(v))) => (v == state).then_some(state),
        // A read without an answer tells nothing; it is dropped before.
        (Input::Get, None) => Some(state),
        _ => None,
    }
}

/// One event of the history, in a doubly linked list (so an operation's
/// two events can be lifted out and put back in O(1)).
struct Event {
    op: usize,
    is_call: bool,
    /// For a call: the index of its return event.
    pair: usize,
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// Checks one key's history, starting from `init`. Reads whose answer never
/// came are ignored. `budget` bounds the states explored.
pub fn check(init: Option<u64>, history: &[Op], budget: usize) -> Verdict {
    let ops: Vec<&Op> = history
        .iter()
        .filter(|o| o.is_write() || o.ret.is_some())
        .collect();
    let index_of: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_write() || o.ret.is_some())
        .map(|(i, _)| i)
        .collect();
    if ops.is_empty() {
        return Verdict::Linearizable;
    }
    // Events sorted by time; at equal times calls first, so operations
    // that touch in time count as concurrent. Unanswered ones return last.
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, o) in ops.iter().enumerate() {
        order.push((o.call, true, i));
        order.push((o.ret.unwrap_or(u64::MAX), false, i));
    }
    order.sort_by_key(|&(t, is_call, i)| (t, !is_call, i));
    // Node 0 is the head sentinel; events are 1..=2n.
    let mut ev: Vec<Event> = vec![Event {
        op: NIL,
        is_call: false,
        pair: NIL,
        prev: NIL,
        next: 1,
    }];
    let mut call_pos = vec![0usize; ops.len()];
    let mut ret_pos = vec![0usize; ops.len()];
    for (k, &(_, is_call, i)) in order.iter().enumerate() {
        let pos = k + 1;
        if is_call {
            call_pos[i] = pos;
        } else {
            ret_pos[i] = pos;
        }
        ev.push(Event {
            op: i,
            is_call,
            pair: NIL,
            prev: pos - 1,
            next: if k + 1 < order.len() { pos + 1 } else { NIL },
        });
    }
    for i in 0..ops.len() {
        ev[call_pos[i]].pair = ret_pos[i];
    }

    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, Option<u64>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<u64>)> = Vec::new();
    let mut state = init;
    let mut entry = ev[0].next;
    let mut deepest: Vec<usize> = Vec::new();
    let mut stuck_on = None;

    let unlink = |ev: &mut Vec<Event>, p: usize| {
        let (prev, next) = (ev[p].prev, ev[p].next);
        ev[prev].next = next;
        if next != NIL {
            ev[next].prev = prev;
        }
    };
    let relink = |ev: &mut Vec<Event>, p: usize| {
        let (prev, next) = (ev[p].prev, ev[p].next);
        ev[prev].next = p;
        if next != NIL {
            ev[next].prev = p;
        }
    };

    loop {
        if ev[0].next == NIL {
            return Verdict::Linearizable;
        }
        if entry == NIL {
            // Only reachable if a return was never met; treat as stuck.
            return Verdict::Violation {
                deepest: deepest.iter().map(|&i| index_of[i]).collect(),
                stuck_on: stuck_on.map(|i: usize| index_of[i]),
            };
        }
        let e = &ev[entry];
        if e.is_call {
            let op = e.op;
            let o = ops[op];
            if let Some(next_state) = step(state, o.input, o.output) {
                let mut bits = linearized.clone();
                bits[op / 64] |= 1 << (op % 64);
                if seen.insert((bits.clone(), next_state)) {
                    if seen.len() > budget {
                        return Verdict::Inconclusive;
                    }
                    stack.push((entry, state));
                    state = next_state;
                    linearized = bits;
                    let ret = ev[entry].pair;
                    unlink(&mut ev, entry);
                    unlink(&mut ev, ret);
                    entry = ev[0].next;
                    continue;
                }
            }
            entry = ev[entry].next;
        } else {
            if stack.len() >= deepest.len() {
                deepest = stack.iter().map(|&(p, _)| ev[p].op).collect();
                stuck_on = Some(ev[entry].op);
            }
            let Some((p, prev_state)) = stack.pop() else {
                return Verdict::Violation {
                    deepest: deepest.iter().map(|&i| index_of[i]).collect(),
                    stuck_on: stuck_on.map(|i| index_of[i]),
                };
            };
            state = prev_state;
            let op = ev[p].op;
            linearized[op / 64] &= !(1 << (op % 64));
            let ret = ev[p].pair;
            relink(&mut ev, ret);
            relink(&mut ev, p);
            entry = ev[p].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(input: Input, output: Option<Output>, call: u64, ret: Option<u64>) -> Op {
        Op {
            client: 0,
            input,
            output,
            call,
            ret,
        }
    }

    const BUDGET: usize = 1_000_000;

    #[test]
    fn sequential_history_is_linearizable() {
        let h = vec![
            op(Input::Put(1), Some(Output::Done), 0, Some(1)),
            op(Input::Get, Some(Output::Value(Some(1))), 2, Some(3)),
            op(
                Input::Cas {
                    expected: Some(1),
                    new: 2,
                },
                Some(Output::Cas(true)),
                4,
                Some(5),
            ),
            op(Input::Get, Some(Output::Value(Some(2))), 6, Some(7)),
            op(Input::Delete, Some(Output::Done), 8, Some(9)),
            op(Input::Get, Some(Output::Value(None)), 10, Some(11)),
        ];
        assert_eq!(check(None, &h, BUDGET), Verdict::Linearizable);
    }

    #[test]
    fn stale_read_after_acknowledged_write_is_caught() {
        // put(1) completes, put(2) completes, then a read sees 1: the read
        // cannot be placed anywhere.
        let h = vec![
            op(Input::Put(1), Some(Output::Done), 0, Some(1)),
            op(Input::Put(2), Some(Output::Done), 2, Some(3)),
            op(Input::Get, Some(Output::Value(Some(1))), 4, Some(5)),
        ];
        assert!(matches!(check(None, &h, BUDGET), Verdict::Violation { .. }));
    }

    #[test]
    fn lost_acknowledged_write_is_caught() {
        // put(1) acknowledged, then a read long after sees the key absent.
        let h = vec![
            op(Input::Put(1), Some(Output::Done), 0, Some(1)),
            op(Input::Get, Some(Output::Value(None)), 5, Some(6)),
        ];
        assert!(matches!(check(None, &h, BUDGET), Verdict::Violation { .. }));
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        // put(1) and put(2) overlap; readers after both disagree with each
        // other only if they are themselves ordered.
        let h = vec![
            op(Input::Put(1), Some(Output::Done), 0, Some(10)),
            op(Input::Put(2), Some(Output::Done), 1, Some(9)),
            op(Input::Get, Some(Output::Value(Some(1))), 11, Some(12)),
        ];
        assert_eq!(check(None, &h, BUDGET), Verdict::Linearizable);
        let h2 = vec![
            op(Input::Put(1), Some(Output::Done), 0, Some(10)),
            op(Input::Put(2), Some(Output::Done), 1, Some(9)),
            op(Input::Get, Some(Output::Value(Some(1))), 11, Some(12)),
            op(Input::Get, Some(Output::Value(Some(2))), 13, Some(14)),
        ];
        assert!(matches!(
            check(None, &h2, BUDGET),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn unanswered_write_may_or_may_not_take_effect() {
        let took = vec![
            op(Input::Put(1), None, 0, None),
            op(Input::Get, Some(Output::Value(Some(1))), 5, Some(6)),
        ];
        assert_eq!(check(None, &took, BUDGET), Verdict::Linearizable);
        let did_not = vec![
            op(Input::Put(1), None, 0, None),
            op(Input::Get, Some(Output::Value(None)), 5, Some(6)),
        ];
        assert_eq!(check(None, &did_not, BUDGET), Verdict::Linearizable);
        // ...but not before it was called.
        let too_early = vec![
            op(Input::Get, Some(Output::Value(Some(1))), 0, Some(1)),
            op(Input::Put(1), None, 5, None),
        ];
        assert!(matches!(
            check(None, &too_early, BUDGET),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn cas_success_must_match_the_state() {
        // Both CAS from absent cannot succeed.
        let h = vec![
            op(
                Input::Cas {
                    expected: None,
                    new: 1,
                },
                Some(Output::Cas(true)),
                0,
                Some(5),
            ),
            op(
                Input::Cas {
                    expected: None,
                    new: 2,
                },
                Some(Output::Cas(true)),
                1,
                Some(6),
            ),
        ];
        assert!(matches!(check(None, &h, BUDGET), Verdict::Violation { .. }));
    }
}
