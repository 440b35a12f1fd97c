//! What servers of different datacenters say to each other over the Raft
//! port (WAN federation): the frames' shapes and the trait that answers
//! them. The transport carries them like any frame (the same greeting,
//! TLS or `--encrypt`, frame caps); `crate::federation` answers them,
//! handed in from process assembly (this layer knows no HTTP). Greetings
//! are frames of their own; forwarded requests travel on a channel
//! (`super::channel`) per remote server, so that a thousand of them in
//! flight hold one connection at the other side, not a thousand.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::channel::{CallFuture, Calls};

pub use crate::structs::federation::WanServer;

/// The servers of one datacenter, as the sender knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WanDatacenter {
    pub datacenter: String,
    pub servers: Vec<WanServer>,
}

/// A server's greeting to a server of another datacenter, and the answer:
/// who it is, its datacenter's primary, and every datacenter it knows
/// (its own first), so that both sides learn the whole federation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WanHello {
    pub datacenter: String,
    pub primary: String,
    pub server: WanServer,
    pub known: Vec<WanDatacenter>,
}

/// An HTTP request asked of another datacenter (`?dc=`): answered there by
/// a server's own router as if asked there. Never forwarded again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WanRequest {
    /// The datacenter it comes from (refused unless known); the receiver
    /// takes it from the channel, which the transport authenticated.
    pub from: String,
    pub method: String,
    pub path_and_query: String,
    pub headers: Vec<(String, String)>,
    #[serde(with = "crate::structs::serde_util::raw_bytes")]
    pub body: Vec<u8>,
}

/// Its answer: status, headers, body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WanResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(with = "crate::structs::serde_util::raw_bytes")]
    pub body: Vec<u8>,
}

pub type WanFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// Answers the WAN frames on this server's Raft port; `Err` is a refusal
/// (the frame's sender is told why).
pub trait Wan: Send + Sync + 'static {
    fn hello(&self, from: WanHello) -> WanFuture<'_, WanHello>;
    fn request(&self, req: WanRequest) -> WanFuture<'_, WanResponse>;
}

/// The calls of a WAN channel (`Request::WanChannel`): each a `WanRequest`,
/// answered with `Result<WanResponse, String>`, as from `from`, the
/// datacenter the channel was opened for (whatever the request says).
pub struct WanCalls {
    pub wan: Arc<dyn Wan>,
    pub from: String,
}

impl Calls for WanCalls {
    fn call(&self, body: Vec<u8>) -> CallFuture {
        let (wan, from) = (self.wan.clone(), self.from.clone());
        Box::pin(async move {
            let decoded = super::frame::decode::<WanRequest>(&body);
            drop(body);
            let answer = match decoded {
                // An answer over the frame limit is refused by the channel.
                Ok(mut req) => {
                    req.from = from;
                    wan.request(req).await
                }
                Err(e) => Err(format!("undecodable forwarded request: {e}")),
            };
            bincode::serialize(&answer).unwrap_or_default()
        })
    }
}
