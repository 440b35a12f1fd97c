//! openraft's async runtime: tokio, with a random source the simulation can
//! seed.
//!
//! openraft draws random numbers from its runtime's `thread_rng()` (election
//! timeouts, the first tick's phase). A server draws them from the operating
//! system as usual. The deterministic simulation runs every simulated host on
//! one thread and calls [`seed_rng`] at the start of a run: from then on the
//! draws on that thread are a pure function of the seed and of the (seeded)
//! order in which tasks run, so a seed replays the same run.

use std::future::Future;
use std::io;
use std::time::Duration;

use openraft::rt::{AsyncRuntime, OptionalSend, Select2, Select3, Select4};
use openraft_rt_tokio::TokioRuntime;
use rand010::SeedableRng;
use rand010::rngs::SmallRng;

/// Makes openraft's random draws on this thread follow `seed`
/// (`crate::random::seed`, which the other seeded draws follow too).
pub fn seed_rng(seed: u64) {
    crate::random::seed(seed);
}

/// tokio, with [`seed_rng`]'s random source.
#[derive(Debug)]
pub struct Runtime(TokioRuntime);

impl AsyncRuntime for Runtime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F>(duration: Duration, future: F) -> Self::Timeout<R, F>
    where
        F: Future<Output = R> + OptionalSend,
    {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F>
    where
        F: Future<Output = R> + OptionalSend,
    {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn select2<A, B>(
        a: A, b: B,
    ) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        TokioRuntime::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A, b: B, c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        TokioRuntime::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A, b: B, c: C, d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        TokioRuntime::select4(a, b, c, d)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SmallRng::seed_from_u64(crate::random::next_seed())
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        Runtime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }
}
