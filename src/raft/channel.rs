//! Calls multiplexed on one Raft-port connection: how a server's endpoint
//! calls reach this datacenter's leader (`crate::endpoint::route`). One
//! connection per peer carries every call in flight, each tagged with an
//! id and answered in any order, so a follower's thousand parked blocking
//! reads hold one connection at the leader, not a thousand (which the
//! port's per-IP cap would evict).
//!
//! The transport only carries bytes: what a call says is the endpoint
//! layer's (`Calls` answers it, handed in from process assembly). The
//! transport (`network`) turns a connection into a channel (its
//! `Request::Channel` first frame) and hands the stream here; from then on
//! both sides speak `ChannelFrame`s and `ChannelReply`s, framed as every
//! other frame (`super::frame`).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::frame::{MAX_FRAME, TOO_LARGE_PREFIX, decode, encode_frame, read_body};
use super::stream::BoxStream;

/// Calls in flight on one channel at its receiver; past it a call is
/// answered `BUSY` at once (its caller's 429), never queued.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Bytes of calls in flight on one channel at its receiver (each call's
/// body is at most `MAX_FRAME`): past it, `BUSY` too.
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// The refusal a receiver over its budget answers with.
pub const BUSY: &str = "busy: too many calls in flight from this server";

/// What travels from the caller.
#[derive(Debug, Serialize, Deserialize)]
pub enum ChannelFrame {
    Call {
        id: u64,
        #[serde(with = "crate::structs::serde_util::raw_bytes")]
        body: Vec<u8>,
    },
    /// The caller gave up on a call (its own caller went away): the
    /// receiver stops working on it.
    Cancel { id: u64 },
}

/// A call's answer: the endpoint layer's bytes, or why it was not run.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChannelReply {
    pub id: u64,
    pub answer: Result<Vec<u8>, String>,
}

pub type CallFuture = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;

/// Answers the calls of channels opened to this server.
pub trait Calls: Send + Sync + 'static {
    fn call(&self, body: Vec<u8>) -> CallFuture;
}

/// Serves a connection that became a channel until it closes: each call
/// runs as its own task (all aborted when the connection goes), answers
/// are written as they finish; `touch` is told of each whole frame (the
/// port's connection caps keep the busiest connections).
pub async fn serve(
    stream: BoxStream, calls: Arc<dyn Calls>, frame_read: Duration, touch: &(dyn Fn() + Sync),
) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<ChannelReply>(64);
    let writer = async move {
        while let Some(reply) = rx.recv().await {
            let frame = match encode_frame(&reply) {
                Ok(f) if f.len() - 4 <= MAX_FRAME => f,
                Ok(f) => encode_frame(&ChannelReply {
                    id: reply.id,
                    answer: Err(format!(
                        "{TOO_LARGE_PREFIX}answer of {} bytes is over the frame limit of {MAX_FRAME}",
                        f.len() - 4
                    )),
                })?,
                Err(e) => return Err(e),
            };
            wr.write_all(&frame).await?;
        }
        io::Result::Ok(())
    };
    let running: Arc<Mutex<std::collections::BTreeMap<u64, tokio::task::AbortHandle>>> =
        Arc::default();
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let reader = async {
        loop {
            let len = rd.read_u32().await? as usize;
            let body = tokio::time::timeout(frame_read, read_body(&mut rd, len))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "frame not whole"))??;
            touch();
            match decode::<ChannelFrame>(&body)? {
                ChannelFrame::Cancel { id } => {
                    if let Some(h) = running.lock().remove(&id) {
                        h.abort();
                    }
                }
                ChannelFrame::Call { id, body } => {
                    let bytes = body.len() as u64;
                    let count = running.lock().len();
                    if count >= MAX_IN_FLIGHT
                        || in_flight.load(Ordering::Relaxed) + bytes > MAX_IN_FLIGHT_BYTES as u64
                    {
                        let busy = ChannelReply {
                            id,
                            answer: Err(BUSY.into()),
                        };
                        if tx.send(busy).await.is_err() {
                            return Ok(());
                        }
                        continue;
                    }
                    in_flight.fetch_add(bytes, Ordering::Relaxed);
                    let (tx, calls, running2, in_flight) = (
                        tx.clone(),
                        calls.clone(),
                        running.clone(),
                        in_flight.clone(),
                    );
                    let fut = calls.call(body);
                    // Held while spawning: the task's own removal waits
                    // until its handle is in.
                    let mut table = running.lock();
                    let handle = tasks.spawn(async move {
                        let answer = fut.await;
                        in_flight.fetch_sub(bytes, Ordering::Relaxed);
                        running2.lock().remove(&id);
                        let _ = tx
                            .send(ChannelReply {
                                id,
                                answer: Ok(answer),
                            })
                            .await;
                    });
                    table.insert(id, handle);
                    drop(table);
                }
            }
            // Finished tasks leave the set as they go.
            while tasks.try_join_next().is_some() {}
        }
    };
    let ended: io::Result<()> = tokio::select! {
        r = reader => r,
        r = writer => r,
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "raft channel ended");
    }
    tasks.abort_all();
}

/// By id, ordered: when a channel closes its waiters are told in the
/// order they called (a hash order would differ between runs of one
/// simulation seed).
type Pending =
    Arc<Mutex<std::collections::BTreeMap<u64, oneshot::Sender<Result<Vec<u8>, String>>>>>;

/// The calling end of a channel to one peer.
pub struct Channel {
    next_id: AtomicU64,
    pending: Pending,
    out: mpsc::Sender<ChannelFrame>,
    closed: Arc<AtomicBool>,
}

impl Channel {
    /// The calling end over `stream`, a connection the transport made a
    /// channel (`network::open_channel`).
    pub fn over(stream: BoxStream) -> Channel {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let (out, mut queue) = mpsc::channel::<ChannelFrame>(256);
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (p, c) = (pending.clone(), closed.clone());
        tokio::spawn(async move {
            let writer = async {
                while let Some(f) = queue.recv().await {
                    wr.write_all(&encode_frame(&f)?).await?;
                }
                io::Result::Ok(())
            };
            let reader = async {
                loop {
                    let len = rd.read_u32().await? as usize;
                    let body = read_body(&mut rd, len).await?;
                    let reply: ChannelReply = decode(&body)?;
                    if let Some(waiter) = p.lock().remove(&reply.id) {
                        let _ = waiter.send(reply.answer);
                    }
                }
                #[allow(unreachable_code)]
                io::Result::Ok(())
            };
            let ended = tokio::select! { r = writer => r, r = reader => r };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "raft channel closed");
            }
            c.store(true, Ordering::Release);
            // Every call still waiting learns that its channel is gone.
            p.lock().clear();
        });
        Channel {
            next_id: AtomicU64::new(1),
            pending,
            out,
            closed,
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.out.is_closed()
    }

    /// Sends `body` and waits up to `timeout` for its answer. `Err` of the
    /// outer result: the channel failed (the call may or may not have
    /// reached the peer, unless it is `NotConnected`: never sent).
    pub async fn call(
        &self, body: Vec<u8>, timeout: Duration,
    ) -> io::Result<Result<Vec<u8>, String>> {
        if body.len() > MAX_FRAME - 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("call of {} bytes is over the frame limit", body.len()),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        // Cancels the call at the peer when this future is dropped before
        // its answer came (the caller's caller went away, or timed out).
        struct Guard<'a> {
            ch: &'a Channel,
            id: u64,
            done: bool,
        }
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                if !self.done && self.ch.pending.lock().remove(&self.id).is_some() {
                    let _ = self.ch.out.try_send(ChannelFrame::Cancel { id: self.id });
                }
            }
        }
        let mut guard = Guard {
            ch: self,
            id,
            done: false,
        };
        if self
            .out
            .send(ChannelFrame::Call { id, body })
            .await
            .is_err()
        {
            guard.done = true;
            self.pending.lock().remove(&id);
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "raft channel closed",
            ));
        }
        let answer = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "raft channel closed before the answer",
            )),
            Err(_) => {
                // Past a caller's whole wait: the peer may be gone without
                // the connection saying so (a partition drops, never
                // closes). The calls on it go on; new ones get a new one.
                self.closed.store(true, Ordering::Release);
                Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))
            }
        };
        guard.done = answer.is_ok();
        answer
    }
}

/// One open channel per peer, opened on first use and again after it
/// closed. Each peer's opening waits on that peer's lock alone: a peer
/// that does not answer (up to the opening's timeout) holds up no call to
/// another.
#[derive(Default)]
pub struct Channels {
    open: Mutex<HashMap<String, Slot>>,
}

/// One peer's channel, if open, behind the lock its opening holds.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Channel>>>>;

impl Channels {
    /// The open channel to `addr`, else a new one from `open`.
    pub async fn to<F>(&self, addr: &str, open: impl FnOnce() -> F) -> io::Result<Arc<Channel>>
    where
        F: Future<Output = io::Result<Channel>>,
    {
        let slot = self
            .open
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let c = Arc::new(open().await?);
        *slot = Some(c.clone());
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;
    impl Calls for Echo {
        fn call(&self, body: Vec<u8>) -> CallFuture {
            Box::pin(async move {
                // A call saying how long to take: answers come back out of
                // order, each to its own caller.
                let ms = body.first().copied().unwrap_or(0) as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                body
            })
        }
    }

    /// A channel whose other end is served in memory.
    fn served() -> Channel {
        let (near, far) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            serve(
                Box::new(far),
                Arc::new(Echo),
                Duration::from_secs(5),
                &|| {},
            )
            .await
        });
        Channel::over(Box::new(near))
    }

    #[tokio::test]
    async fn calls_share_one_connection_and_are_answered_each_to_its_caller() {
        let channels = Channels::default();
        let ch = channels.to("a", || async { Ok(served()) }).await.unwrap();
        let slow = ch.call(vec![200, 1], Duration::from_secs(5));
        let fast = async {
            let ch2 = channels
                .to("a", || async {
                    panic!("a second channel to the same peer")
                })
                .await
                .unwrap();
            assert!(Arc::ptr_eq(&ch, &ch2), "one channel per peer");
            ch2.call(vec![0, 2], Duration::from_secs(5)).await
        };
        let started = tokio::time::Instant::now();
        let (slow, fast) = tokio::join!(slow, fast);
        assert_eq!(slow.unwrap().unwrap(), vec![200, 1]);
        assert_eq!(fast.unwrap().unwrap(), vec![0, 2]);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// Past `MAX_IN_FLIGHT` calls at once the receiver answers `BUSY`
    /// at once (never queues), and takes calls again once some finish.
    #[tokio::test]
    async fn calls_past_the_budget_are_answered_busy() {
        let ch = served();
        let calls = (0..=MAX_IN_FLIGHT).map(|_| ch.call(vec![250], Duration::from_secs(10)));
        let answers = futures_util::future::join_all(calls).await;
        let busy = answers
            .iter()
            .filter(|a| matches!(a, Ok(Err(e)) if e == BUSY))
            .count();
        assert_eq!(busy, 1, "one call past {MAX_IN_FLIGHT}");
        let answered = answers.iter().filter(|a| matches!(a, Ok(Ok(_)))).count();
        assert_eq!(answered, MAX_IN_FLIGHT);
        assert_eq!(
            ch.call(vec![0, 7], Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap(),
            vec![0, 7]
        );
    }

    #[tokio::test]
    async fn a_peer_slow_to_open_holds_up_no_other() {
        let channels = Arc::new(Channels::default());
        let stuck = {
            let channels = channels.clone();
            tokio::spawn(async move {
                channels
                    .to("stuck", std::future::pending::<io::Result<Channel>>)
                    .await
            })
        };
        tokio::task::yield_now().await;
        let other = tokio::time::timeout(
            Duration::from_secs(2),
            channels.to("b", || async { Ok(served()) }),
        )
        .await
        .expect("b opened while another peer's opening hangs")
        .unwrap();
        assert_eq!(
            other
                .call(vec![0, 3], Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap(),
            vec![0, 3]
        );
        stuck.abort();
    }

    #[tokio::test]
    async fn a_call_past_its_timeout_is_cancelled_and_the_channel_goes_on() {
        let ch = served();
        let late = ch.call(vec![250], Duration::from_millis(20)).await;
        assert_eq!(late.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            ch.call(vec![0, 9], Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap(),
            vec![0, 9]
        );
        assert!(ch.pending.lock().is_empty());
    }
}
