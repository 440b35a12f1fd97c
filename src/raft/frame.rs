//! How every message between servers travels on a Raft-port connection:
//! `[len u32 BE][bincode]`, at most `MAX_FRAME` bytes, decoded within the
//! bytes received. Below the transport (`network`) and its channels
//! (`channel`), which both speak it.

use std::io;

use serde::Serialize;
use tokio::io::AsyncReadExt;

/// Frames above this are refused (answered `TooLarge`). Everything cairn
/// sends fits: an AppendEntries holds at most `APPEND_BYTES` of entries or
/// one entry (at most `server::MAX_COMMAND_BYTES`), a snapshot chunk
/// `SNAPSHOT_CHUNK`.
pub const MAX_FRAME: usize = 16 << 20;

/// How a refusal for size starts, whoever refuses (the asker answers its
/// caller 413).
pub const TOO_LARGE_PREFIX: &str = "too large: ";

/// A value as a frame: `[len u32 BE][bincode]`.
pub fn encode_frame<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    let len = bincode::serialized_size(v).map_err(io::Error::other)? as usize;
    let mut buf = Vec::with_capacity(len + 4);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    bincode::serialize_into(&mut buf, v).map_err(io::Error::other)?;
    Ok(buf)
}

/// Decodes a frame's body; bincode may use no more than the body's bytes
/// (a length prefix inside cannot make it allocate past them).
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(body.len() as u64)
        .deserialize(body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads a frame's body of `len` bytes, refusing one over `MAX_FRAME`.
pub async fn read_body<R: tokio::io::AsyncRead + Unpin>(
    s: &mut R, len: usize,
) -> io::Result<Vec<u8>> {
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes refused (max {MAX_FRAME})"),
        ));
    }
    // Grown as bytes arrive: a length prefix alone allocates nothing.
    let mut buf = Vec::with_capacity(len.min(64 << 10));
    (&mut *s).take(len as u64).read_to_end(&mut buf).await?;
    if buf.len() < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}
