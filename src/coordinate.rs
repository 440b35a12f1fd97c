//! Network coordinates (Vivaldi), as Consul's serf computes them: each node
//! holds a point in an 8-dimensional space plus a height (its access
//! link), and the distance between two points estimates the round-trip
//! time between the nodes. A node moves its own point after every RTT it
//! measures to another node whose coordinate it knows.
//!
//! Pure: no I/O and no state beyond a `Client`. Where RTTs come from and
//! where coordinates are kept is the callers' (`agent::liveness`,
//! `http::coordinate`, `state::coordinate`).
//!
//! Consul's defaults: 8 dimensions, a height, an adjustment window of 20,
//! a 3-sample latency filter per peer, gravity. `Coordinate` is in
//! Consul's JSON, and `check` refuses wrong dimensions and components that
//! are not finite or out of bounds. `Client::update` takes one RTT to a
//! peer; bad input is refused and moves nothing. `distance` counts heights
//! and adjustments, as Consul's `DistanceTo`. `Update` is
//! `{Node, Segment, Coord}`; `Pending` is the leader's next batch: the
//! latest per node, bounded.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Consul's defaults (serf `DefaultConfig`).
pub const DIMENSIONALITY: usize = 8;
pub const ERROR_MAX: f64 = 1.5;
const CE: f64 = 0.25;
const CC: f64 = 0.25;
const ADJUSTMENT_WINDOW: usize = 20;
/// Seconds: 10 µs.
pub const HEIGHT_MIN: f64 = 10.0e-6;
const LATENCY_FILTER: usize = 3;
const GRAVITY_RHO: f64 = 150.0;
/// Below this, a distance or a vector counts as zero.
const ZERO: f64 = 1.0e-6;
/// An RTT of this or more is not a measurement (serf's bound).
const MAX_RTT: f64 = 10.0;
/// The largest value a coordinate's component may hold, in seconds: far
/// beyond any real RTT, small enough that no sum of them overflows.
const MAX_COMPONENT: f64 = 1.0e6;
/// How many peers a client keeps latency samples for: a bound, not a
/// tuning knob (agents measure against the servers only).
const MAX_PEERS: usize = 256;

/// A node's network coordinate, in Consul's JSON (seconds throughout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Coordinate {
    pub vec: Vec<f64>,
    pub error: f64,
    pub adjustment: f64,
    pub height: f64,
}

impl Default for Coordinate {
    /// The origin, with the largest error: where every node starts.
    fn default() -> Self {
        Coordinate {
            vec: vec![0.0; DIMENSIONALITY],
            error: ERROR_MAX,
            adjustment: 0.0,
            height: HEIGHT_MIN,
        }
    }
}

/// A node's coordinate as Consul's `/v1/coordinate` endpoints show it and
/// `PUT /v1/coordinate/update` takes it; also the stored row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Update {
    pub node: String,
    #[serde(default)]
    pub segment: String,
    pub coord: Coordinate,
}

/// Why a coordinate or a measurement was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordError {
    #[error("dimensions aren't compatible: {0} (want {DIMENSIONALITY})")]
    Dimensions(usize),
    #[error("coordinate has an invalid component (not a finite number within bounds)")]
    Invalid,
    #[error(
        "round trip time not in valid range, duration {0:?} is not a positive value less than 10s"
    )]
    Rtt(f64),
}

impl Coordinate {
    /// Whether the coordinate can be stored and computed with: the right
    /// dimensionality, finite components within bounds, no negative error
    /// or height.
    pub fn check(&self) -> Result<(), CoordError> {
        if self.vec.len() != DIMENSIONALITY {
            return Err(CoordError::Dimensions(self.vec.len()));
        }
        let bounded = |v: f64| v.is_finite() && v.abs() <= MAX_COMPONENT;
        if !self.vec.iter().all(|v| bounded(*v))
            || !bounded(self.error)
            || !bounded(self.adjustment)
            || !bounded(self.height)
            || self.error < 0.0
            || self.height < 0.0
        {
            return Err(CoordError::Invalid);
        }
        Ok(())
    }

    /// The distance in the space plus both heights, without adjustments.
    fn raw_distance(&self, other: &Coordinate) -> f64 {
        magnitude(&diff(&self.vec, &other.vec)) + self.height + other.height
    }

    /// Seconds: the estimated RTT, with both adjustments unless they would
    /// make it non-positive (as Consul's `DistanceTo`).
    fn distance_secs(&self, other: &Coordinate) -> f64 {
        let dist = self.raw_distance(other);
        let adjusted = dist + self.adjustment + other.adjustment;
        if adjusted > 0.0 { adjusted } else { dist }
    }

    /// Moves this coordinate by `force` (seconds) away from `other` (towards
    /// it when negative), the height taking its share.
    fn apply_force(&self, force: f64, other: &Coordinate) -> Coordinate {
        let (unit, mag) = unit_vector_at(&self.vec, &other.vec);
        let mut out = self.clone();
        for (v, u) in out.vec.iter_mut().zip(&unit) {
            *v += u * force;
        }
        if mag > ZERO {
            out.height = ((out.height + other.height) * force / mag + out.height).max(HEIGHT_MIN);
        }
        out
    }
}

/// The estimated RTT between two coordinates. Either one unusable (a
/// stored coordinate always is usable): `None`.
pub fn distance(a: &Coordinate, b: &Coordinate) -> Option<Duration> {
    a.check().ok()?;
    b.check().ok()?;
    Some(Duration::from_secs_f64(a.distance_secs(b).max(0.0)))
}

/// How far `b` is from `a` as a point, height and adjustment included, in
/// seconds: no RTT estimate to either differs by more than this.
pub fn moved(a: &Coordinate, b: &Coordinate) -> f64 {
    magnitude(&diff(&a.vec, &b.vec))
        + (a.height - b.height).abs()
        + (a.adjustment - b.adjustment).abs()
}

fn diff(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

fn magnitude(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The unit vector from `b` to `a` and their distance; two points in the
/// same place get a random direction (and distance 0) so they can part.
fn unit_vector_at(a: &[f64], b: &[f64]) -> (Vec<f64>, f64) {
    let d = diff(a, b);
    let mag = magnitude(&d);
    if mag > ZERO {
        return (d.iter().map(|x| x / mag).collect(), mag);
    }
    // The simulation's seeded source, so a run that meets this replays.
    let mut rng = crate::random::rng();
    for _ in 0..8 {
        let r: Vec<f64> = (0..a.len()).map(|_| rng.gen_range(-0.5..0.5)).collect();
        let m = magnitude(&r);
        if m > ZERO {
            return (r.iter().map(|x| x / m).collect(), 0.0);
        }
    }
    (vec![0.0; a.len()], 0.0)
}

/// One node's Vivaldi state: its coordinate, the adjustment window and
/// the latency filter per peer.
#[derive(Debug, Clone)]
pub struct Client {
    coord: Coordinate,
    origin: Coordinate,
    adjustment_samples: [f64; ADJUSTMENT_WINDOW],
    adjustment_next: usize,
    samples: HashMap<String, VecDeque<f64>>,
}

impl Default for Client {
    fn default() -> Self {
        Client {
            coord: Coordinate::default(),
            origin: Coordinate::default(),
            adjustment_samples: [0.0; ADJUSTMENT_WINDOW],
            adjustment_next: 0,
            samples: HashMap::new(),
        }
    }
}

impl Client {
    pub fn new() -> Client {
        Client::default()
    }

    /// This node's coordinate now.
    pub fn coordinate(&self) -> Coordinate {
        self.coord.clone()
    }

    /// Takes in one RTT measured to `node`, whose coordinate is `other`,
    /// and returns this node's new coordinate. A bad measurement or
    /// coordinate changes nothing.
    pub fn update(
        &mut self, node: &str, other: &Coordinate, rtt: Duration,
    ) -> Result<Coordinate, CoordError> {
        other.check()?;
        let secs = rtt.as_secs_f64();
        if !(secs > 0.0 && secs < MAX_RTT) {
            return Err(CoordError::Rtt(secs));
        }
        self.update_secs(node, other, secs)
    }

    /// `update` with the RTT in seconds as a float (what a caller that
    /// computed it may hold: NaN, negative and infinite are refused).
    pub fn update_secs(
        &mut self, node: &str, other: &Coordinate, rtt: f64,
    ) -> Result<Coordinate, CoordError> {
        other.check()?;
        if !(rtt > 0.0 && rtt < MAX_RTT) {
            return Err(CoordError::Rtt(rtt));
        }
        let rtt = self.latency_filter(node, rtt);
        self.update_vivaldi(other, rtt);
        self.update_adjustment(other, rtt);
        self.update_gravity();
        if self.coord.check().is_err() {
            // Numbers went bad despite the checks: start over rather than
            // keep (or hand out) a broken coordinate.
            self.coord = Coordinate::default();
        }
        Ok(self.coord.clone())
    }

    /// The median of the last few samples to `node`: one slow packet does
    /// not move the coordinate.
    fn latency_filter(&mut self, node: &str, rtt: f64) -> f64 {
        if !self.samples.contains_key(node) && self.samples.len() >= MAX_PEERS {
            self.samples.clear();
        }
        let s = self.samples.entry(node.to_string()).or_default();
        s.push_back(rtt);
        if s.len() > LATENCY_FILTER {
            s.pop_front();
        }
        let mut sorted: Vec<f64> = s.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }

    fn update_vivaldi(&mut self, other: &Coordinate, rtt: f64) {
        let rtt = rtt.max(ZERO);
        let dist = self.coord.distance_secs(other);
        let wrongness = (dist - rtt).abs() / rtt;
        let total_error = (self.coord.error + other.error).max(ZERO);
        let weight = self.coord.error / total_error;
        self.coord.error =
            (CE * weight * wrongness + self.coord.error * (1.0 - CE * weight)).min(ERROR_MAX);
        let force = CC * weight * (rtt - dist);
        self.coord = self.coord.apply_force(force, other);
    }

    /// The adjustment: the mean error of the recent samples over the
    /// space's estimate (half of it: both ends add theirs).
    fn update_adjustment(&mut self, other: &Coordinate, rtt: f64) {
        self.adjustment_samples[self.adjustment_next] = rtt - self.coord.raw_distance(other);
        self.adjustment_next = (self.adjustment_next + 1) % ADJUSTMENT_WINDOW;
        let sum: f64 = self.adjustment_samples.iter().sum();
        self.coord.adjustment = sum / (2.0 * ADJUSTMENT_WINDOW as f64);
    }

    /// A pull towards the origin, growing with the distance from it, so
    /// the whole system does not drift away.
    fn update_gravity(&mut self) {
        let dist = self.origin.distance_secs(&self.coord);
        let force = -(dist / GRAVITY_RHO).powi(2);
        self.coord = self.coord.apply_force(force, &self.origin.clone());
    }
}

/// Updates waiting for the leader's next batch: the latest per node, at
/// most `cap` nodes (Consul refuses updates beyond its rate target).
#[derive(Debug)]
pub struct Pending {
    cap: usize,
    waiting: parking_lot::Mutex<std::collections::BTreeMap<String, Update>>,
}

impl Pending {
    pub fn new(cap: usize) -> Pending {
        Pending {
            cap,
            waiting: Default::default(),
        }
    }

    /// Queues `u`, replacing the node's earlier one; `false` when full.
    pub fn push(&self, u: Update) -> bool {
        let mut w = self.waiting.lock();
        if w.len() >= self.cap && !w.contains_key(&u.node) {
            return false;
        }
        w.insert(u.node.clone(), u);
        true
    }

    /// Queues `u` unless the node has one waiting already (which is newer
    /// news than a periodic estimate).
    pub fn offer(&self, u: Update) {
        let mut w = self.waiting.lock();
        if w.len() < self.cap || w.contains_key(&u.node) {
            w.entry(u.node.clone()).or_insert(u);
        }
    }

    /// Everything waiting, emptied.
    pub fn take(&self) -> Vec<Update> {
        std::mem::take(&mut *self.waiting.lock())
            .into_values()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes with known RTTs between them, each updated round after round
    /// from a random peer as real nodes would be.
    fn converge(rtt: &dyn Fn(usize, usize) -> f64, n: usize, rounds: usize) -> Vec<Client> {
        let mut clients: Vec<Client> = (0..n).map(|_| Client::new()).collect();
        for round in 0..rounds {
            for i in 0..n {
                let j = (i + 1 + (round * 7 + i * 13) % (n - 1)) % n;
                let other = clients[j].coordinate();
                clients[i]
                    .update_secs(&format!("n{j}"), &other, rtt(i, j))
                    .unwrap();
            }
        }
        clients
    }

    fn worst_error(clients: &[Client], rtt: &dyn Fn(usize, usize) -> f64) -> f64 {
        let mut worst: f64 = 0.0;
        for i in 0..clients.len() {
            for j in 0..clients.len() {
                if i == j {
                    continue;
                }
                let est = distance(&clients[i].coordinate(), &clients[j].coordinate())
                    .unwrap()
                    .as_secs_f64();
                worst = worst.max((est - rtt(i, j)).abs());
            }
        }
        worst
    }

    #[test]
    fn nodes_on_a_line_converge_to_their_rtts() {
        // Ten nodes 10 ms apart on a line.
        let rtt = |i: usize, j: usize| 0.010 * (i as f64 - j as f64).abs();
        let clients = converge(&rtt, 10, 1000);
        let worst = worst_error(&clients, &rtt);
        assert!(worst < 0.002, "worst error {worst} s on a 90 ms line");
    }

    #[test]
    fn nodes_on_a_grid_converge_to_their_rtts() {
        // A 4x4 grid, 10 ms between neighbours, plus 1 ms of access link.
        let pos = |i: usize| ((i % 4) as f64, (i / 4) as f64);
        let rtt = |i: usize, j: usize| {
            let (a, b) = (pos(i), pos(j));
            0.010 * ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt() + 0.001
        };
        let clients = converge(&rtt, 16, 1000);
        let worst = worst_error(&clients, &rtt);
        assert!(worst < 0.002, "worst error {worst} s on a 43 ms grid");
        // And the order is right: the far corner is further than a neighbour.
        let near = distance(&clients[0].coordinate(), &clients[1].coordinate()).unwrap();
        let far = distance(&clients[0].coordinate(), &clients[15].coordinate()).unwrap();
        assert!(near < far, "{near:?} !< {far:?}");
    }

    #[test]
    fn a_lone_coordinate_is_the_origin() {
        let c = Coordinate::default();
        assert_eq!(c.vec, vec![0.0; 8]);
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"Vec": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "Error": 1.5, "Adjustment": 0.0, "Height": 1.0e-5})
        );
        // Two nodes at the origin: both heights apart.
        let d = distance(&c, &c).unwrap().as_secs_f64();
        assert!((d - 2.0 * HEIGHT_MIN).abs() < 1e-12, "{d}");
    }

    #[test]
    fn distance_counts_heights_and_adjustments() {
        let mut a = Coordinate::default();
        let mut b = Coordinate::default();
        a.vec[0] = 0.003;
        b.vec[1] = 0.004;
        a.height = 0.001;
        b.height = 0.002;
        let d = distance(&a, &b).unwrap().as_secs_f64();
        assert!((d - 0.008).abs() < 1e-9, "{d}");
        a.adjustment = 0.0005;
        b.adjustment = 0.0005;
        let d = distance(&a, &b).unwrap().as_secs_f64();
        assert!((d - 0.009).abs() < 1e-9, "{d}");
        // An adjustment that would make it non-positive is ignored.
        a.adjustment = -1.0;
        let d = distance(&a, &b).unwrap().as_secs_f64();
        assert!((d - 0.008).abs() < 1e-9, "{d}");
    }

    #[test]
    fn moved_bounds_the_change_of_every_estimate() {
        let mut a = Coordinate::default();
        let other = {
            let mut o = Coordinate::default();
            o.vec[2] = 0.02;
            o
        };
        let mut b = a.clone();
        b.vec[0] = 0.003;
        b.vec[1] = 0.004;
        b.height += 0.001;
        assert!((moved(&a, &b) - 0.006).abs() < 1e-12);
        let before = distance(&a, &other).unwrap().as_secs_f64();
        let after = distance(&b, &other).unwrap().as_secs_f64();
        assert!((after - before).abs() <= moved(&a, &b) + 1e-12);
        a.adjustment = 0.002;
        assert!((moved(&a, &b) - 0.008).abs() < 1e-12);
    }

    #[test]
    fn garbage_is_refused_and_changes_nothing() {
        let mut c = Client::new();
        let good = Coordinate::default();
        c.update_secs("a", &good, 0.01).unwrap();
        let before = c.coordinate();
        for rtt in [f64::NAN, f64::INFINITY, -0.001, 0.0, 11.0] {
            assert!(matches!(
                c.update_secs("a", &good, rtt),
                Err(CoordError::Rtt(_))
            ));
        }
        let mut short = good.clone();
        short.vec.pop();
        assert_eq!(
            c.update_secs("a", &short, 0.01),
            Err(CoordError::Dimensions(7))
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
            let mut v = good.clone();
            v.vec[3] = bad;
            assert_eq!(c.update_secs("a", &v, 0.01), Err(CoordError::Invalid));
            let mut h = good.clone();
            h.height = bad;
            assert_eq!(c.update_secs("a", &h, 0.01), Err(CoordError::Invalid));
            assert!(distance(&v, &good).is_none());
        }
        let mut neg = good.clone();
        neg.error = -1.0;
        assert_eq!(neg.check(), Err(CoordError::Invalid));
        assert_eq!(c.coordinate(), before, "nothing moved");
        assert!(c.update("a", &good, Duration::ZERO).is_err());
    }

    #[test]
    fn pending_keeps_the_latest_per_node_and_is_bounded() {
        let p = Pending::new(2);
        let u = |n: &str, x: f64| {
            let mut coord = Coordinate::default();
            coord.vec[0] = x;
            Update {
                node: n.into(),
                segment: String::new(),
                coord,
            }
        };
        assert!(p.push(u("a", 1.0)));
        assert!(p.push(u("a", 2.0)));
        assert!(p.push(u("b", 1.0)));
        assert!(!p.push(u("c", 1.0)), "full");
        assert!(p.push(u("b", 3.0)), "a node already waiting is replaced");
        let got = p.take();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].coord.vec[0], 2.0);
        assert_eq!(got[1].coord.vec[0], 3.0);
        assert!(p.take().is_empty());
        // An offer never replaces what waits, nor overfills.
        assert!(p.push(u("a", 5.0)));
        p.offer(u("a", 6.0));
        p.offer(u("b", 6.0));
        p.offer(u("c", 6.0));
        let got = p.take();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].coord.vec[0], got[1].coord.vec[0]), (5.0, 6.0));
    }

    #[test]
    fn peers_kept_are_bounded() {
        let mut c = Client::new();
        let other = Coordinate::default();
        for i in 0..(MAX_PEERS * 3) {
            c.update_secs(&format!("n{i}"), &other, 0.001).unwrap();
        }
        assert!(c.samples.len() <= MAX_PEERS);
        c.coordinate().check().unwrap();
    }
}
