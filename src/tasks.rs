//! Critical background tasks and their supervisor.
//!
//! A server is several tasks besides its HTTP handlers: the Raft transport,
//! the leader's duties, the event publisher, proxycfg. If one of them dies
//! (panics, or returns while it should run forever) the process would go on
//! answering while broken. Each is spawned through `Tasks`, which reports
//! the first one to end; the run loop then logs its name and exits
//! non-zero, for a supervisor to restart the process.
//!
//! The exit code is `TASK_EXIT`. A leader duty's panic is reported through
//! `Tasks` too, by the leader module. `DutyTerm` says which term's leader
//! duties run. `off_workers` moves CPU work off the async workers, and runs
//! it in place on a one-thread runtime such as a simulated host's.

use std::future::Future;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The exit status of a process stopped because a critical task ended
/// (EX_SOFTWARE).
pub const TASK_EXIT: i32 = 70;

/// How a critical task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It returned, though it should have run as long as the process.
    Returned(&'static str),
    Panicked(&'static str, String),
    /// Aborted from outside (the runtime going down).
    Cancelled(&'static str),
}

impl Ended {
    pub fn name(&self) -> &'static str {
        match self {
            Ended::Returned(n) | Ended::Panicked(n, _) | Ended::Cancelled(n) => n,
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Returned(n) => write!(f, "critical task {n:?} returned"),
            Ended::Panicked(n, why) => write!(f, "critical task {n:?} panicked: {why}"),
            Ended::Cancelled(n) => write!(f, "critical task {n:?} was cancelled"),
        }
    }
}

/// The critical tasks of one process part (a server, an agent).
pub struct Tasks {
    tx: mpsc::UnboundedSender<Ended>,
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Ended>>,
}

impl Default for Tasks {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Tasks {
            tx,
            rx: tokio::sync::Mutex::new(rx),
        }
    }
}

impl Tasks {
    /// Spawns a task that must run as long as the process: returning is a
    /// failure too.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.watch(name, tokio::spawn(fault(name, task)));
    }

    /// Spawns a task that may finish (cluster formation): only a panic is
    /// a failure.
    pub fn spawn_once(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.supervise(name, tokio::spawn(fault(name, task)), false);
    }

    /// Watches a task spawned elsewhere, which must run as long as the
    /// process.
    pub fn watch(&self, name: &'static str, handle: JoinHandle<()>) {
        self.supervise(name, handle, true);
    }

    fn supervise(&self, name: &'static str, handle: JoinHandle<()>, forever: bool) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let ended = match handle.await {
                Ok(()) if forever => Ended::Returned(name),
                Ok(()) => return,
                Err(e) if e.is_panic() => Ended::Panicked(name, panic_text(e.into_panic())),
                Err(_) => Ended::Cancelled(name),
            };
            // Nobody listening (a simulated server being dropped) is fine.
            let _ = tx.send(ended);
        });
    }

    /// Reports a task spawned and joined elsewhere (a leader duty, run in
    /// the leader module's own set so that it can be stopped) that
    /// panicked.
    pub fn report_panic(&self, name: &'static str, e: tokio::task::JoinError) {
        if e.is_panic() {
            let _ = self
                .tx
                .send(Ended::Panicked(name, panic_text(e.into_panic())));
        }
    }

    /// Waits for the first critical task to end.
    pub async fn failed(&self) -> Ended {
        let mut rx = self.rx.lock().await;
        // `self` holds a sender, so the channel never closes.
        rx.recv().await.expect("Tasks holds a sender")
    }
}

/// The term whose leader duties run on this server, if any: written only
/// by the leader module (`crate::leader`) as it establishes and revokes
/// them, read by the simulation's checker.
#[derive(Debug, Default)]
pub struct DutyTerm(std::sync::atomic::AtomicU64);

impl DutyTerm {
    pub fn set(&self, term: Option<u64>) {
        // Terms start at 1 once a leader exists: 0 is "none".
        self.0
            .store(term.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
    }

    pub fn get(&self) -> Option<u64> {
        Some(self.0.load(std::sync::atomic::Ordering::SeqCst)).filter(|t| *t != 0)
    }
}

/// CPU-heavy or blocking work `f` (a key made, a certificate signed) run off
/// the async workers: on tokio's blocking pool in a multi-threaded runtime,
/// in place in a runtime of one thread (the simulation's hosts, a
/// `#[tokio::test]`). There a pool thread would let the runtime's clock
/// (turmoil's simulated one) run on for as long as the work takes in real
/// time, so a seed would replay differently on a loaded machine. A panic
/// in `f` is an error either way.
pub async fn off_workers<F, T>(f: F) -> Result<T, String>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(panic_text);
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(p) => panic_text(p),
            Err(e) => e.to_string(),
        })
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Debug builds only: `CAIRN_FAULT_TASK=<name>` makes the named task panic
/// at start, so tests can see the process stop (release builds ignore it).
/// Tasks spawned elsewhere and `watch`ed wrap themselves in it.
pub async fn fault(name: &'static str, task: impl Future<Output = ()>) {
    #[cfg(debug_assertions)]
    if std::env::var("CAIRN_FAULT_TASK").is_ok_and(|v| v == name) {
        panic!("fault injected into {name} (CAIRN_FAULT_TASK)");
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
    task.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// In a runtime of one thread the work runs in place, on the
    /// runtime's own thread (no pool thread for its clock to run beside).
    #[tokio::test]
    async fn work_off_the_workers_runs_in_place_on_one_thread() {
        let id = std::thread::current().id();
        let ran_on = off_workers(|| std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, id);
        let e = off_workers(|| panic!("boom")).await.unwrap_err();
        assert_eq!(e, "boom");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_off_the_workers_runs_on_the_blocking_pool() {
        let id = std::thread::current().id();
        let ran_on = off_workers(|| std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, id);
        let e = off_workers(|| panic!("boom")).await.unwrap_err();
        assert_eq!(e, "boom");
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported_by_name() {
        let tasks = Tasks::default();
        tasks.spawn("fine", std::future::pending());
        tasks.spawn("doomed", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("boom");
        });
        let ended = tokio::time::timeout(Duration::from_secs(5), tasks.failed())
            .await
            .expect("the panic is reported");
        assert_eq!(ended, Ended::Panicked("doomed", "boom".into()));
        assert!(ended.to_string().contains("doomed"), "{ended}");
    }

    #[tokio::test]
    async fn a_task_that_must_run_forever_fails_when_it_returns() {
        let tasks = Tasks::default();
        tasks.watch("loop", tokio::spawn(async {}));
        let ended = tokio::time::timeout(Duration::from_secs(5), tasks.failed()).await;
        assert_eq!(ended.unwrap(), Ended::Returned("loop"));
    }

    #[tokio::test]
    async fn a_task_that_may_finish_fails_only_when_it_panics() {
        let tasks = Tasks::default();
        tasks.spawn_once("formation", async {});
        let quiet = tokio::time::timeout(Duration::from_millis(200), tasks.failed()).await;
        assert!(quiet.is_err(), "finishing is not a failure: {quiet:?}");
        tasks.spawn_once("formation", async { panic!("lost") });
        let ended = tokio::time::timeout(Duration::from_secs(5), tasks.failed()).await;
        assert_eq!(ended.unwrap().name(), "formation");
    }
}
