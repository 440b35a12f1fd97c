//! What servers of different datacenters say to each other over the Raft
//! port (WAN federation): the frames' shapes and the trait that answers
//! them. The transport carries them like any frame (the same greeting,
//! TLS or `--encrypt`, frame caps); `crate::federation` answers them,
//! handed in from process assembly (this layer knows no HTTP).

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

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
    /// The datacenter it comes from (refused unless known).
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
