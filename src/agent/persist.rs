//! The agent's data dir: its node id and the services and checks registered
//! through the API (with check status and output), so a restarted agent
//! comes back with them. Definitions from `--config-dir` are not kept here:
//! they are read from the directory at every start. Every sidecar's parent
//! and port are kept (config-dir ones too), so a restarted agent knows
//! which services are sidecars and gives them the ports they had.
//!
//! One JSON file, replaced atomically (write a temporary file, fsync it,
//! rename it over the old one, fsync the directory): a crash leaves either
//! the old state or the new, never a torn file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::structs::{HealthCheck, NodeService};

const FILE: &str = "agent-state.json";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Persisted {
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub services: Vec<NodeService>,
    pub checks: Vec<HealthCheck>,
    /// Sidecar service ID → its parent and port.
    pub sidecars: BTreeMap<String, SidecarRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SidecarRecord {
    pub parent: String,
    pub port: u16,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// What the data dir holds; nothing for a fresh one.
pub fn load(dir: &Path) -> anyhow::Result<Option<Persisted>> {
    let p = path(dir);
    let text = match std::fs::read(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("cannot read {}: {e}", p.display()),
    };
    let state = serde_json::from_slice(&text)
        .map_err(|e| anyhow::anyhow!("{} is not valid agent state: {e}", p.display()))?;
    Ok(Some(state))
}

/// Replaces the stored state with `state`, durably.
pub fn save(dir: &Path, state: &Persisted) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path(dir))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let state = Persisted {
            node_id: "n".into(),
            services: vec![NodeService {
                id: "web".into(),
                service: "web".into(),
                ..Default::default()
            }],
            checks: vec![HealthCheck {
                check_id: "c".into(),
                status: crate::structs::HEALTH_PASSING,
                ..Default::default()
            }],
            sidecars: [(
                "web-sidecar-proxy".to_string(),
                SidecarRecord {
                    parent: "web".into(),
                    port: 21000,
                },
            )]
            .into_iter()
            .collect(),
        };
        save(dir.path(), &state).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(state));
        // A file written before sidecars were kept still loads.
        std::fs::write(dir.path().join(FILE), r#"{"NodeID": "old"}"#).unwrap();
        assert_eq!(load(dir.path()).unwrap().unwrap().node_id, "old");
        std::fs::write(dir.path().join(FILE), "{not json").unwrap();
        assert!(load(dir.path()).is_err());
    }
}
