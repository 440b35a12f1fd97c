//! Deterministic simulation of cairn clusters on turmoil: the real server
//! code (Raft, state store, request path) on simulated hosts, faults chosen
//! by a seed, and checkers that fail when an acknowledged write is lost or
//! a history is not linearizable.
//!
//! - `node`: a server built as every server is (`process::assemble`: its
//!   core and the leader module, every leader duty) from the in-memory log
//!   store (`mem_log`), `MemoryBackend` state and in-memory snapshots, on
//!   turmoil TCP; plus the small client API that mirrors the HTTP path.
//! - `workload`: clients doing KV put/get/`?consistent` get/CAS/delete and
//!   catalog register/deregister, recording call and return times.
//! - `run`: one run of a scenario: formation, faults (partitions, one-way
//!   partitions, an isolated leader, crash and restart with the stored
//!   state, message loss, delay, several at once), heal, convergence.
//! - `checks` and `linearizability`: the history checkers; `report`: what
//!   a run found (the run and the checkers add to it), and the fault kinds.
//! - `locks`: checker (e), lock clients (sessions, acquire, release,
//!   destroy while holding) checked for mutual exclusion and lock-delay.
//! - `acl`: on a quarter of the seeds ACLs are on (default deny); the
//!   admin client creates the clients' tokens through Raft and deletes one
//!   mid-run; checker (f): no server accepts it past its apply of the
//!   delete.
//! - `stream_check`: checker (d), a KV event-stream subscriber moving
//!   between servers against what every server committed (recorded by a
//!   tap on each server's publisher); on ACL seeds its token reads only
//!   some keys, and no event may carry another.
//! - `dns`: checker (g), on ACL seeds: the servers' DNS token reads only
//!   some services and nodes (narrowed mid-run); a client asks random
//!   servers' DNS resolvers (`cairn::dns::answer` on the server's own
//!   state) and no answer may name a service or node the token could not
//!   read at the server's applied index; readable names must be answered
//!   and unreadable ones NXDOMAIN.
//! - `mesh`: checker (j), on ACL seeds: a terminating gateway and a
//!   sidecar follow Delta ADS (tonic, the real gRPC port on simulated TCP)
//!   on random servers with tokens narrowed mid-run; no push may carry a
//!   leaf the token may not `service:write` or endpoints it may not
//!   `service:read`, under the rules its server had applied, and streams
//!   open at the end hold the narrowed view.
//! - `duties`: checker (h), the leader module's duties run on one server
//!   per term during the run, and on the leader alone once settled.
//! - `rejoin`: checker (i), on a third of the seeds after the workload: a
//!   follower stopped past autopilot's dead bound is removed, and once
//!   restarted from its disk is a voter again without deposing the leader.
//!
//! - `federation`: the federation scenario, two or three datacenters of
//!   three servers (`process::assemble_federated`: WAN federation over the
//!   Raft transport, replication from the primary as a leader duty) under
//!   WAN partitions, a secondary's leader's crash and a primary server's
//!   restart; checked per datacenter as above (another datacenter's `?dc=`
//!   reads of its keys in its history), for the replicated ACLs and config
//!   entries of every secondary server after the heal, with checker (f) on
//!   each secondary for the token deleted in the primary, and with checker
//!   5 (`federation::query`): a prepared query failing over between the
//!   datacenters never answers an instance whose check was not passing at
//!   its datacenter's index the answer reflects.
//!
//! Commands:
//! - `cargo test -p sim --release`: 50 seeds each of 3 and 5 servers,
//!   6 of the federation scenario (the first 2 also with three
//!   datacenters), determinism of a seed, the checker's own tests
//!   (`SIM_SEEDS=N`, `SIM_FED_SEEDS=N`, `SIM_FED3_SEEDS=N` to change; a
//!   debug build runs 6, 2 and 1 seeds).
//! - `cargo run -p sim --release -- --federation --seeds N`: N seeds of the
//!   federation scenario, with two and with three datacenters
//!   (`--datacenters N` for one; `--seed X` replays one).
//! - `cargo run -p sim --release -- --seeds N` (`make sim SEEDS=N`): N
//!   seeds of both scenarios; a failing seed prints the command replaying it
//!   (`--servers S --seed X`; `SIM_TRACE=1` prints leaders and operations).
//! - `cargo test -p sim --release --features bug-ack-before-commit` (or
//!   `bug-stale-read`, `bug-stream-back-in-time`, `bug-follower-reads`,
//!   `bug-forwarded-token`, `bug-xds-acl-unchanged`; `make sim-bugs` runs
//!   them all): builds cairn with a deliberate bug and expects the
//!   simulation to catch it within 40 seeds; `--features bug-failover-ignores-health`:
//!   checker 5 within 4 seeds of the federation scenario.
//!
//! Determinism needs `--cfg tokio_unstable` (set in `.cargo/config.toml`):
//! with it turmoil seeds each host's tokio runtime, whose RNG decides which
//! ready branch an unbiased `tokio::select!` takes (openraft has some). And
//! openraft draws random numbers of its own (the first tick's phase):
//! `run` seeds them from the run's seed (`cairn::raft::runtime::seed_rng`).

pub mod acl;
pub mod checks;
pub mod dns;
pub mod duties;
pub mod federation;
pub mod linearizability;
pub mod locks;
pub mod mem_log;
pub mod mesh;
pub mod node;
pub mod rejoin;
pub mod report;
pub mod run;
pub mod stream_check;
pub mod workload;
