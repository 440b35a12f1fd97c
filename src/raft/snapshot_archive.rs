//! `/v1/snapshot`'s envelope, as Consul's docs describe it: a gzipped tar
//! holding `meta.json` (the snapshot's index, term and Raft
//! configuration, in Consul's `SnapshotMeta` shape), `state.bin` and
//! `SHA256SUMS` (`sha256sum -c` checks the other two). The state inside is
//! cairn's own framed snapshot (`snapshot_file`), so `tar tzf`, checksum
//! tools and backup scripts open it, while only cairn reads `state.bin`.
//!
//! Reading takes the envelope or a bare framed snapshot (what cairn saved
//! before it), and is bounded: at most `limit` bytes are ever inflated
//! (a gzip bomb is refused, not held), only the three names are taken, and
//! every file's checksum must match before `state.bin` is used.

use std::io::{Read, Write};

use ring::digest::{SHA256, digest};
use serde_json::json;

use super::SnapshotMeta as Meta;

/// The most a snapshot's state may inflate to (what `PUT /v1/snapshot`
/// takes, too).
pub const MAX_STATE: usize = 512 << 20;

const META: &str = "meta.json";
const STATE: &str = "state.bin";
const SUMS: &str = "SHA256SUMS";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Why an archive is refused, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArchiveError(String);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Consul's `meta.json` for a snapshot with `meta` of `size` bytes.
fn meta_json(meta: &Meta, size: usize) -> Vec<u8> {
    let (index, term) = meta
        .last_log_id
        .map_or((0, 0), |l| (l.index, l.leader_id.term));
    let membership = meta.last_membership.membership();
    let voters: Vec<_> = membership.voter_ids().collect();
    let servers: Vec<_> = membership
        .nodes()
        .map(|(id, n)| {
            // Consul's raft.ServerSuffrage: 0 voter, 1 nonvoter.
            let suffrage = if voters.contains(id) { 0 } else { 1 };
            json!({"Suffrage": suffrage, "ID": n.name, "Address": n.raft_addr})
        })
        .collect();
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let doc = json!({
        "Version": 1,
        "ID": format!("{term}-{index}-{at_ms}"),
        "Index": index,
        "Term": term,
        "Configuration": {"Servers": servers},
        "ConfigurationIndex": meta.last_membership.log_id().map_or(0, |l| l.index),
        "Size": size,
    });
    serde_json::to_vec(&doc).expect("JSON encodes")
}

/// The envelope around a framed snapshot (`state`, whose meta is `meta`).
pub fn wrap(meta: &Meta, state: &[u8]) -> std::io::Result<Vec<u8>> {
    let meta = meta_json(meta, state.len());
    let sums = format!(
        "{}  {META}\n{}  {STATE}\n",
        hex(digest(&SHA256, &meta).as_ref()),
        hex(digest(&SHA256, state).as_ref())
    );
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, data) in [(META, &meta[..]), (STATE, state), (SUMS, sums.as_bytes())] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        tar.append_data(&mut h, name, data)?;
    }
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}

/// The framed snapshot in `bytes`: an envelope's `state.bin`, checked
/// against its `SHA256SUMS`, or `bytes` themselves when they are no gzip
/// (a bare framed snapshot, checked by its reader). Nothing beyond `limit`
/// bytes is inflated.
pub fn unwrap(bytes: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>, ArchiveError> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    let bad = |why: String| ArchiveError(format!("Invalid snapshot archive: {why}"));
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(limit as u64 + 1)
        .read_to_end(&mut inflated)
        .map_err(|e| bad(format!("not a gzip stream: {e}")))?;
    if inflated.len() > limit {
        return Err(bad(format!("larger than {limit} bytes once inflated")));
    }
    let (mut meta, mut state, mut sums) = (None, None, None);
    let mut archive = tar::Archive::new(&inflated[..]);
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("not a tar: {e}")))?;
        let name = entry
            .path()
            .map_err(|e| bad(format!("an entry's name: {e}")))?
            .to_string_lossy()
            .into_owned();
        let slot = match name.as_str() {
            META => &mut meta,
            STATE => &mut state,
            SUMS => &mut sums,
            _ => continue,
        };
        // The inflated whole is within `limit`: so is each entry.
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| bad(format!("{name}: {e}")))?;
        if slot.replace(data).is_some() {
            return Err(bad(format!("{name} twice")));
        }
    }
    let (Some(meta), Some(state), Some(sums)) = (meta, state, sums) else {
        return Err(bad(format!("it needs {META}, {STATE} and {SUMS}")));
    };
    let sums = String::from_utf8(sums).map_err(|_| bad(format!("{SUMS} is not text")))?;
    for (name, data) in [(META, &meta), (STATE, &state)] {
        let want = sums
            .lines()
            .find_map(|l| l.strip_suffix(name)?.strip_suffix("  "))
            .ok_or_else(|| bad(format!("{SUMS} has no line for {name}")))?;
        if want != hex(digest(&SHA256, data).as_ref()) {
            return Err(bad(format!("{name} does not match its SHA-256")));
        }
    }
    Ok(std::borrow::Cow::Owned(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, *data).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn the_envelope_holds_the_state_and_its_checksums() {
        let state = b"cairn framed snapshot bytes".to_vec();
        let bytes = wrap(&Meta::default(), &state).unwrap();
        assert_eq!(&bytes[..2], &GZIP_MAGIC);
        assert_eq!(unwrap(&bytes, 1 << 20).unwrap().as_ref(), &state[..]);
        // A bare framed snapshot passes through.
        assert_eq!(unwrap(&state, 1 << 20).unwrap().as_ref(), &state[..]);
    }

    #[test]
    fn a_bad_envelope_is_refused() {
        let sums = |m: &[u8], s: &[u8]| {
            format!(
                "{}  meta.json\n{}  state.bin\n",
                hex(digest(&SHA256, m).as_ref()),
                hex(digest(&SHA256, s).as_ref())
            )
        };
        let good = sums(b"{}", b"state");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0x1f, 0x8b, 0, 1, 2], "not a gzip stream"),
            (
                archive(&[("meta.json", b"{}"), ("state.bin", b"state")]),
                "needs",
            ),
            (
                archive(&[
                    ("meta.json", b"{}"),
                    ("state.bin", b"other"),
                    ("SHA256SUMS", good.as_bytes()),
                ]),
                "state.bin does not match",
            ),
            (
                archive(&[
                    ("meta.json", b"{}"),
                    ("state.bin", b"state"),
                    ("state.bin", b"state"),
                    ("SHA256SUMS", good.as_bytes()),
                ]),
                "state.bin twice",
            ),
        ];
        for (bytes, want) in cases {
            let e = unwrap(&bytes, 1 << 20).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        // A bomb: a few KiB that inflate past the limit are refused.
        let zeros = vec![0u8; 4 << 20];
        let bomb = archive(&[("state.bin", &zeros)]);
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let e = unwrap(&bomb, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
