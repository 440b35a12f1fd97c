//! The Raft transport under a shared key (`cairn server --encrypt KEY`):
//! a `Connect` and an `Accept` wrapping another's (TCP in a server), as
//! `secure` does for TLS, so the frame code in `network` never changes and
//! never decodes a byte from a peer that did not prove it holds the key.
//!
//! The handshake, before anything else on the connection (`K` the 32-byte
//! key, `nc`/`na` 32 random bytes from the connecting/accepting side):
//!
//! ```text
//! connect → accept:  "CAIRNKY1" nc
//! accept → connect:  na  HMAC-SHA256(K, "cairn raft accept" nc na)
//! connect → accept:  HMAC-SHA256(K, "cairn raft connect" nc na)
//! ```
//!
//! Each side checks the other's tag (constant time, `ring::hmac::verify`)
//! over both nonces, so a recorded handshake proves nothing on another
//! connection, and the two labels keep one side's proof from being
//! reflected as the other's. The connecting side sends nothing but its
//! tag before it has checked the accepting side's; the accepting side
//! reads no frame before it has checked the connecting side's.
//!
//! After it, every byte travels in records `[len u32 BE][ciphertext+tag]`
//! of ChaCha20-Poly1305, at most `RECORD` bytes of plaintext each, with one
//! key per direction (HKDF-SHA256 of K salted with `nc na`) and a counter
//! as the nonce: a man in the middle can neither read, inject, replay,
//! reorder nor reflect a record; any such attempt fails authentication and
//! closes the connection.
//!
//! Bounds: the accepting side does its handshake lazily, on the
//! connection's first read or write, inside the connection task (as
//! `secure` does), so the Raft port's caps admit the connection first and
//! its first-frame timeout bounds the handshake; a handshake is fixed-size,
//! a record's length over `RECORD` is refused before anything is buffered,
//! and a failed proof closes the connection with a warning. The connecting
//! side's handshake runs inside the RPC's own timeout.
//!
//! With TLS too, this layer is the outer one (TCP, then the key, then
//! TLS): a stranger without the key reaches no TLS parser.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use base64::Engine;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::{hkdf, hmac, rand::SecureRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::stream::{Accept, BoxStream, Connect, Connecting};

/// The key's length in bytes (Consul's gossip keys are 32 bytes too).
pub const KEY_LEN: usize = 32;

/// What the connecting side sends first: a cairn transport under a key,
/// handshake version 1 (a server without `--encrypt` greets `CAIRNRPC`).
const MAGIC: &[u8; 8] = b"CAIRNKY1";
const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 32;
const ACCEPT_LABEL: &[u8] = b"cairn raft accept";
const CONNECT_LABEL: &[u8] = b"cairn raft connect";

/// Plaintext bytes per record, at most.
const RECORD: usize = 64 << 10;
const AEAD_TAG: usize = 16;

/// A `--encrypt` key that is not one.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("--encrypt: the key is not base64: {0}")]
    NotBase64(String),
    #[error(
        "--encrypt: the key is {0} bytes, it must be {KEY_LEN} (base64 of 32 bytes: make one with `cairn keygen`)"
    )]
    Length(usize),
}

/// The transport's shared key.
#[derive(Clone)]
pub struct EncryptKey {
    raw: Arc<[u8; KEY_LEN]>,
    mac: hmac::Key,
}

impl std::fmt::Debug for EncryptKey {
    // Never the key itself, in a log or a panic.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncryptKey(..)")
    }
}

impl EncryptKey {
    /// The key from its base64 (standard alphabet, as `cairn keygen` and
    /// `consul keygen` print it).
    pub fn parse(b64: &str) -> Result<Self, KeyError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| KeyError::NotBase64(e.to_string()))?;
        let raw: [u8; KEY_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Length(bytes.len()))?;
        Ok(EncryptKey {
            mac: hmac::Key::new(hmac::HMAC_SHA256, &raw),
            raw: Arc::new(raw),
        })
    }

    /// The key in base64, as it was given (`/v1/operator/keyring` lists it,
    /// as Consul's lists its gossip keys).
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(*self.raw)
    }

    /// A fresh key in base64 (`cairn keygen`).
    pub fn generate() -> io::Result<String> {
        let mut raw = [0u8; KEY_LEN];
        random(&mut raw)?;
        Ok(base64::engine::general_purpose::STANDARD.encode(raw))
    }

    /// The tag one side sends: over its label and both nonces.
    fn tag(&self, label: &[u8], nc: &[u8], na: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.mac);
        ctx.update(label);
        ctx.update(nc);
        ctx.update(na);
        ctx.sign()
    }

    fn verify(&self, label: &[u8], nc: &[u8], na: &[u8], tag: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(label.len() + 2 * NONCE_LEN);
        msg.extend_from_slice(label);
        msg.extend_from_slice(nc);
        msg.extend_from_slice(na);
        hmac::verify(&self.mac, &msg, tag)
            .map_err(|_| refused("the peer did not prove the --encrypt key"))
    }

    /// A key of its own for another use (`label` names it), derived with
    /// HKDF-SHA256: the shared key never leaves this type.
    pub fn subkey(&self, label: &'static [u8]) -> [u8; KEY_LEN] {
        struct Len;
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                KEY_LEN
            }
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, label).extract(&self.raw[..]);
        let info = [label];
        let mut out = [0u8; KEY_LEN];
        prk.expand(&info, Len)
            .and_then(|okm| okm.fill(&mut out))
            .expect("32 bytes is within HKDF-SHA256's output");
        out
    }

    /// The record key of one direction of one connection.
    fn direction(&self, nc: &[u8], na: &[u8], info: &'static [u8]) -> LessSafeKey {
        let mut salt = [0u8; 2 * NONCE_LEN];
        salt[..NONCE_LEN].copy_from_slice(nc);
        salt[NONCE_LEN..].copy_from_slice(na);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(&self.raw[..]);
        let info = [info];
        let okm = prk
            .expand(&info, &aead::CHACHA20_POLY1305)
            .expect("32 bytes is within HKDF-SHA256's output");
        LessSafeKey::new(UnboundKey::from(okm))
    }
}

fn random(buf: &mut [u8]) -> io::Result<()> {
    ring::rand::SystemRandom::new()
        .fill(buf)
        .map_err(|_| io::Error::other("no random bytes from the system"))
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

/// The connecting side's handshake.
async fn handshake_connect(mut s: BoxStream, key: &EncryptKey) -> io::Result<Sealed> {
    let mut hello = [0u8; MAGIC.len() + NONCE_LEN];
    hello[..MAGIC.len()].copy_from_slice(MAGIC);
    random(&mut hello[MAGIC.len()..])?;
    let nc: [u8; NONCE_LEN] = hello[MAGIC.len()..].try_into().expect("32 bytes");
    s.write_all(&hello).await?;
    s.flush().await?;
    let mut answer = [0u8; NONCE_LEN + TAG_LEN];
    s.read_exact(&mut answer).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            refused("the peer closed the key handshake (no --encrypt, or another key?)")
        } else {
            e
        }
    })?;
    let (na, tag) = answer.split_at(NONCE_LEN);
    key.verify(ACCEPT_LABEL, &nc, na, tag)?;
    s.write_all(key.tag(CONNECT_LABEL, &nc, na).as_ref())
        .await?;
    Ok(Sealed::new(s, key, &nc, na, Side::Connect))
}

/// The accepting side's handshake.
async fn handshake_accept(mut s: BoxStream, key: EncryptKey) -> io::Result<Sealed> {
    let mut hello = [0u8; MAGIC.len() + NONCE_LEN];
    s.read_exact(&mut hello).await?;
    if &hello[..MAGIC.len()] != MAGIC {
        return Err(refused(
            "no key handshake (a server without --encrypt, or not a cairn server)",
        ));
    }
    let nc = &hello[MAGIC.len()..];
    let mut answer = [0u8; NONCE_LEN + TAG_LEN];
    random(&mut answer[..NONCE_LEN])?;
    let na: [u8; NONCE_LEN] = answer[..NONCE_LEN].try_into().expect("32 bytes");
    answer[NONCE_LEN..].copy_from_slice(key.tag(ACCEPT_LABEL, nc, &na).as_ref());
    s.write_all(&answer).await?;
    s.flush().await?;
    let mut tag = [0u8; TAG_LEN];
    s.read_exact(&mut tag).await?;
    key.verify(CONNECT_LABEL, nc, &na, &tag)?;
    Ok(Sealed::new(s, &key, nc, &na, Side::Accept))
}

#[derive(Clone, Copy)]
enum Side {
    Connect,
    Accept,
}

/// One direction's key and the counter its next record's nonce is made of.
struct Direction {
    key: LessSafeKey,
    counter: u64,
}

impl Direction {
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut n = [0u8; aead::NONCE_LEN];
        n[4..].copy_from_slice(&self.counter.to_be_bytes());
        // 2^64 records: never; refused rather than a nonce used twice.
        self.counter = self
            .counter
            .checked_add(1)
            .ok_or_else(|| io::Error::other("record counter exhausted"))?;
        Ok(Nonce::assume_unique_for_key(n))
    }
}

/// A stream after the handshake: every byte sealed in records.
struct Sealed {
    inner: BoxStream,
    seal: Direction,
    open: Direction,
    /// Bytes read, not yet a whole record.
    rbuf: Vec<u8>,
    /// The last record's plaintext, and how much of it was read.
    plain: Vec<u8>,
    plain_pos: usize,
    /// Sealed bytes not yet written to `inner`, and how many were.
    wbuf: Vec<u8>,
    wpos: usize,
}

impl Sealed {
    fn new(inner: BoxStream, key: &EncryptKey, nc: &[u8], na: &[u8], side: Side) -> Self {
        let c2a = key.direction(nc, na, b"cairn raft connect to accept");
        let a2c = key.direction(nc, na, b"cairn raft accept to connect");
        let (seal, open) = match side {
            Side::Connect => (c2a, a2c),
            Side::Accept => (a2c, c2a),
        };
        Sealed {
            inner,
            seal: Direction {
                key: seal,
                counter: 0,
            },
            open: Direction {
                key: open,
                counter: 0,
            },
            rbuf: Vec::new(),
            plain: Vec::new(),
            plain_pos: 0,
            wbuf: Vec::new(),
            wpos: 0,
        }
    }

    /// The next whole record's plaintext from `rbuf`, if one is there.
    fn take_record(&mut self) -> io::Result<Option<Vec<u8>>> {
        let Some(head) = self.rbuf.get(..4) else {
            return Ok(None);
        };
        let head: [u8; 4] = head.try_into().expect("4 bytes");
        let len = u32::from_be_bytes(head) as usize;
        if !(AEAD_TAG..=RECORD + AEAD_TAG).contains(&len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("record of {len} bytes refused (max {})", RECORD + AEAD_TAG),
            ));
        }
        if self.rbuf.len() < 4 + len {
            return Ok(None);
        }
        let mut record: Vec<u8> = self.rbuf.drain(..4 + len).skip(4).collect();
        let nonce = self.open.next_nonce()?;
        let n = self
            .open
            .key
            .open_in_place(nonce, Aad::from(head), &mut record)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "record failed authentication (not sealed with the key)",
                )
            })?
            .len();
        record.truncate(n);
        Ok(Some(record))
    }

    /// Writes what is sealed and waiting; `Ready(Ok)` once all of it is.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.wbuf[self.wpos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        self.wbuf.clear();
        self.wpos = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Sealed {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A record sealed by a write and not yet out goes first: a caller
        // writes a request and then reads its answer without a flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        loop {
            if this.plain_pos < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.plain_pos);
                buf.put_slice(&this.plain[this.plain_pos..this.plain_pos + n]);
                this.plain_pos += n;
                return Poll::Ready(Ok(()));
            }
            if let Some(record) = this.take_record()? {
                this.plain = record;
                this.plain_pos = 0;
                continue;
            }
            let have = this.rbuf.len();
            this.rbuf.resize(have + (16 << 10), 0);
            let mut rb = ReadBuf::new(&mut this.rbuf[have..]);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
            let got = rb.filled().len();
            this.rbuf.truncate(have + got);
            ready!(polled)?;
            if got == 0 {
                return Poll::Ready(if have == 0 {
                    Ok(())
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                });
            }
        }
    }
}

impl AsyncWrite for Sealed {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(RECORD);
        let len = ((n + AEAD_TAG) as u32).to_be_bytes();
        this.wbuf.extend_from_slice(&len);
        this.wbuf.extend_from_slice(&buf[..n]);
        let nonce = this.seal.next_nonce()?;
        let tag = this
            .seal
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(len), &mut this.wbuf[4..])
            .map_err(|_| io::Error::other("sealing a record failed"))?;
        this.wbuf.extend_from_slice(tag.as_ref());
        // Taken: sent now if the socket takes it, else by the next call.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Opens keyed streams to peers over another `Connect`.
pub struct KeyConnect {
    inner: Arc<dyn Connect>,
    key: EncryptKey,
}

impl KeyConnect {
    pub fn new(inner: Arc<dyn Connect>, key: EncryptKey) -> Self {
        KeyConnect { inner, key }
    }
}

impl Connect for KeyConnect {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        Box::pin(async move {
            let stream = self.inner.connect(addr).await?;
            let sealed = handshake_connect(stream, &self.key).await.inspect_err(
                |e| tracing::warn!(%addr, error = %e, "raft key handshake with peer failed"),
            )?;
            Ok(Box::new(sealed) as BoxStream)
        })
    }
}

/// Accepts keyed streams over another `Accept`.
pub struct KeyAccept<A> {
    inner: A,
    key: EncryptKey,
}

impl<A: Accept> KeyAccept<A> {
    pub fn new(inner: A, key: EncryptKey) -> Self {
        KeyAccept { inner, key }
    }
}

impl<A: Accept> Accept for KeyAccept<A> {
    async fn accept(&mut self) -> io::Result<(BoxStream, IpAddr)> {
        let (stream, ip) = self.inner.accept().await?;
        let handshake = Box::pin(handshake_accept(stream, self.key.clone()));
        Ok((
            Box::new(Accepting {
                state: State::Handshaking(handshake),
                ip,
            }),
            ip,
        ))
    }
}

type Handshake = Pin<Box<dyn Future<Output = io::Result<Sealed>> + Send + Sync>>;

enum State {
    Handshaking(Handshake),
    Ready(Box<Sealed>),
    Failed,
}

/// An accepted stream whose handshake is done on its first use; a failed
/// handshake fails every read and write.
struct Accepting {
    state: State,
    ip: IpAddr,
}

impl Accepting {
    /// Drives the handshake; `Ready(Ok)` once the stream is usable.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut Sealed>> {
        if let State::Handshaking(h) = &mut self.state {
            match ready!(h.as_mut().poll(cx)) {
                Ok(s) => self.state = State::Ready(Box::new(s)),
                Err(e) => {
                    self.state = State::Failed;
                    crate::metrics::RAFT_FRAMES_REFUSED.inc();
                    tracing::warn!(ip = %self.ip, error = %e, "raft connection refused: key handshake failed");
                    return Poll::Ready(Err(e));
                }
            }
        }
        match &mut self.state {
            State::Ready(s) => Poll::Ready(Ok(s)),
            _ => Poll::Ready(Err(refused("key handshake failed"))),
        }
    }
}

impl AsyncRead for Accepting {
    fn poll_read(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let s = ready!(self.poll_handshake(cx))?;
        Pin::new(s).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepting {
    fn poll_write(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s = ready!(self.poll_handshake(cx))?;
        Pin::new(s).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let s = ready!(self.poll_handshake(cx))?;
        Pin::new(s).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Ready(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            // Nothing was ever sent: nothing to close politely.
            _ => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(b: u8) -> EncryptKey {
        EncryptKey::parse(&base64::engine::general_purpose::STANDARD.encode([b; KEY_LEN])).unwrap()
    }

    /// Both handshakes over an in-memory pipe.
    async fn pair(ck: EncryptKey, ak: EncryptKey) -> (io::Result<Sealed>, io::Result<Sealed>) {
        let (c, a) = tokio::io::duplex(1 << 16);
        let accept = tokio::spawn(handshake_accept(Box::new(a), ak));
        let connect = handshake_connect(Box::new(c), &ck).await;
        // A connecting side that failed drops its end: the accept side
        // ends too.
        (connect, accept.await.unwrap())
    }

    #[test]
    fn keys_are_base64_of_32_bytes() {
        assert!(EncryptKey::parse(&EncryptKey::generate().unwrap()).is_ok());
        assert_ne!(
            EncryptKey::generate().unwrap(),
            EncryptKey::generate().unwrap()
        );
        let e = EncryptKey::parse("not base64!").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--encrypt: the key is not base64"),
            "{e}"
        );
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        let e = EncryptKey::parse(&short).unwrap_err();
        assert!(e.to_string().contains("is 16 bytes, it must be 32"), "{e}");
        assert_eq!(format!("{:?}", key(1)), "EncryptKey(..)");
    }

    #[tokio::test]
    async fn the_same_key_passes_and_carries_bytes_both_ways() {
        let (c, a) = pair(key(1), key(1)).await;
        let (mut c, mut a) = (c.unwrap(), a.unwrap());
        // Larger than a record, and than the pipe: split and reassembled.
        let big: Vec<u8> = (0..(300 << 10)).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            c.write_all(&sent).await.unwrap();
            c.flush().await.unwrap();
            let mut back = [0u8; 5];
            c.read_exact(&mut back).await.unwrap();
            back
        });
        let mut got = vec![0u8; big.len()];
        a.read_exact(&mut got).await.unwrap();
        assert!(got == big);
        a.write_all(b"hello").await.unwrap();
        a.flush().await.unwrap();
        assert_eq!(&writer.await.unwrap(), b"hello");
    }

    #[tokio::test]
    async fn another_key_fails_on_both_sides() {
        let (c, a) = pair(key(1), key(2)).await;
        let e = c.err().expect("the connecting side refuses");
        assert!(
            e.to_string().contains("did not prove the --encrypt key"),
            "{e}"
        );
        assert!(a.is_err());
    }

    #[tokio::test]
    async fn garbage_and_a_plain_greeting_are_refused() {
        // A server without --encrypt greets first, then a frame: refused
        // on the magic, nothing decoded.
        let (mut c, a) = tokio::io::duplex(1 << 16);
        let accept = tokio::spawn(handshake_accept(Box::new(a), key(1)));
        c.write_all(&crate::raft::network::greeting())
            .await
            .unwrap();
        c.write_all(&[0xffu8; 64]).await.unwrap();
        let e = accept.await.unwrap().err().unwrap();
        assert!(e.to_string().contains("no key handshake"), "{e}");

        // The magic and a wrong proof.
        let (mut c, a) = tokio::io::duplex(1 << 16);
        let accept = tokio::spawn(handshake_accept(Box::new(a), key(1)));
        c.write_all(MAGIC).await.unwrap();
        c.write_all(&[7u8; NONCE_LEN + TAG_LEN]).await.unwrap();
        let e = accept.await.unwrap().err().unwrap();
        assert!(e.to_string().contains("did not prove"), "{e}");
    }

    #[tokio::test]
    async fn an_oversized_or_forged_record_is_refused() {
        for bad in [
            // A length far over a record: refused before it is buffered.
            vec![0xff, 0xff, 0xff, 0xff],
            // A record's worth of bytes nobody sealed with the key.
            {
                let mut r = 40u32.to_be_bytes().to_vec();
                r.extend_from_slice(&[9u8; 40]);
                r
            },
        ] {
            let (c, a) = pair(key(1), key(1)).await;
            let (mut c, mut a) = (c.unwrap(), a.unwrap());
            c.inner.write_all(&bad).await.unwrap();
            let mut buf = [0u8; 8];
            let e = a.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
    }

    #[tokio::test]
    async fn a_record_replayed_or_reflected_is_refused() {
        let (c, a) = pair(key(1), key(1)).await;
        let (mut c, mut a) = (c.unwrap(), a.unwrap());
        let record = 4 + 3 + AEAD_TAG;
        // A record sent once and replayed: the second fails (the counter
        // moved on).
        c.write_all(b"one").await.unwrap();
        c.flush().await.unwrap();
        let mut raw = vec![0u8; record];
        a.inner.read_exact(&mut raw).await.unwrap();
        a.rbuf.extend_from_slice(&raw);
        a.rbuf.extend_from_slice(&raw);
        assert_eq!(a.take_record().unwrap().unwrap(), b"one");
        assert!(a.take_record().is_err());

        // A record of the accepting side sent back to it (a reflection):
        // sealed with the other direction's key.
        let (c2, a2) = pair(key(1), key(1)).await;
        let (mut c2, mut a2) = (c2.unwrap(), a2.unwrap());
        a2.write_all(b"two").await.unwrap();
        a2.flush().await.unwrap();
        let mut raw = vec![0u8; record];
        c2.inner.read_exact(&mut raw).await.unwrap();
        a2.rbuf.extend_from_slice(&raw);
        assert!(a2.take_record().is_err());
        drop(c);
    }

    /// A peer that stops halfway through the handshake leaves the stream
    /// unusable: the port's first-frame timeout closes it.
    #[tokio::test]
    async fn a_truncated_handshake_times_out() {
        let (mut c, a) = tokio::io::duplex(1 << 16);
        let mut accepted = Accepting {
            state: State::Handshaking(Box::pin(handshake_accept(Box::new(a), key(1)))),
            ip: IpAddr::from([127, 0, 0, 1]),
        };
        c.write_all(&MAGIC[..5]).await.unwrap();
        let mut buf = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_millis(200), accepted.read(&mut buf)).await;
        assert!(read.is_err(), "the handshake must not complete");
        // Closed: the handshake fails, and so does every later use.
        drop(c);
        assert!(accepted.read(&mut buf).await.is_err());
        assert!(accepted.write(b"x").await.is_err());
    }
}
