//! The discovery chain: compiling config entries into the graph proxies use
//! for an upstream, and refusing config entry writes that would break one.
//!
//! # API
//!
//! - [`compile`]`(&CompileRequest, &impl EntryLookup) -> Result<CompiledDiscoveryChain, ChainError>`
//!   for `GET /v1/discovery-chain/:service?compile-dc=` and the `POST` form
//!   (overrides from the body via [`CompileOverrides::from_json`]). Answer
//!   `{"Chain": chain}`. A pure, deterministic function: no I/O, no panics.
//! - [`validate_write`]`(&impl EntryLookup, &EntryChange) -> Result<(), ConfigEntryError>`
//!   after `crate::config_check::decode_and_validate` on every upsert, and on
//!   every delete: recompiles only the chains the change can reach and
//!   refuses it (400) if one of them would no longer compile.
//! - [`EntryLookup`]: read access to the stored entries. The state store
//!   implements it; [`ReverseIndex`] keeps "who references service X" so that
//!   finding the affected chains does not scan unrelated entries.
//!   [`MemoryEntries`] is a ready-made in-memory implementation.
//!
//! Besides chains that no longer compile, `validate_write` refuses what
//! only other entries can show: L7 intention `Permissions` on a service
//! whose resolved protocol is not http, http2 or grpc (on intentions and
//! on defaults writes); an ingress listener whose services' chain protocol
//! is not its own (on gateway, defaults and chain writes); an ingress and
//! a terminating gateway of one name; and a `MutualTLSMode` turned
//! permissive without the mesh entry's `AllowEnablingPermissiveMutualTLS`.

mod compile;
pub(crate) mod graph;
mod types;

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod tests;

pub use compile::{service_protocol, service_sni};
pub use graph::{EntryChange, ReverseIndex, references, validate_write};
pub use types::*;

use crate::structs::config_entry::{ConfigEntry, Duration, Kind, MeshGatewayConfig};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Read access to the stored config entries (default namespace/partition).
pub trait EntryLookup {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry>;

    /// All entries of one kind.
    fn list(&self, kind: Kind) -> Vec<&ConfigEntry>;

    /// Names of the services whose router, splitter or resolver entry refers
    /// to `service` (see [`references`]). The default scans every such
    /// entry; stores should answer from a [`ReverseIndex`] instead.
    fn referrers(&self, service: &str) -> Vec<String> {
        let mut out: Vec<String> = Kind::ALL
            .into_iter()
            .filter(|k| k.is_chain_graph())
            .flat_map(|k| self.list(k))
            .filter(|e| references(e).iter().any(|r| r == service))
            .map(|e| e.name().to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Why a chain does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// The entries do not form a valid chain (Consul's ConfigEntryGraphError).
    #[error("{0}")]
    Graph(String),
    /// The request itself is incomplete.
    #[error("{0}")]
    InvalidRequest(String),
}

/// What to compile, and where it is evaluated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompileRequest {
    pub service_name: String,
    /// `compile-dc`, or the server's own datacenter.
    pub evaluate_in_datacenter: String,
    /// The datacenter of the answering server (informational).
    pub server_datacenter: String,
    /// Empty means "default"; only "default" is served.
    pub evaluate_in_namespace: String,
    pub evaluate_in_partition: String,
    /// `<cluster-id>.consul`, used in SNI.
    pub trust_domain: String,
    pub override_protocol: String,
    pub override_connect_timeout: Duration,
    pub override_mesh_gateway: MeshGatewayConfig,
    /// The service's virtual IPs, copied into the chain (the compiler
    /// reads no catalog: the caller looks them up).
    pub auto_virtual_ips: Vec<String>,
    pub manual_virtual_ips: Vec<String>,
}

impl CompileRequest {
    pub fn new(service: &str, datacenter: &str, trust_domain: &str) -> Self {
        CompileRequest {
            service_name: service.into(),
            evaluate_in_datacenter: datacenter.into(),
            server_datacenter: datacenter.into(),
            trust_domain: trust_domain.into(),
            ..Default::default()
        }
    }

    pub fn with_overrides(mut self, o: CompileOverrides) -> Self {
        self.override_protocol = o.override_protocol.to_lowercase();
        self.override_connect_timeout = o.override_connect_timeout;
        self.override_mesh_gateway = o.override_mesh_gateway;
        self
    }
}

/// The body of `POST /v1/discovery-chain/:service`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CompileOverrides {
    #[serde(alias = "override_protocol")]
    pub override_protocol: String,
    #[serde(alias = "override_connect_timeout")]
    pub override_connect_timeout: Duration,
    #[serde(alias = "override_mesh_gateway")]
    pub override_mesh_gateway: MeshGatewayConfig,
}

impl CompileOverrides {
    pub fn from_json(body: &serde_json::Value) -> Result<Self, ChainError> {
        if body.is_null() {
            return Ok(Self::default());
        }
        let o: Self = serde_json::from_value(body.clone())
            .map_err(|e| ChainError::InvalidRequest(format!("Request decoding failed: {e}")))?;
        // Consul's check and words: a mode it does not know compiles no chain.
        if !matches!(
            o.override_mesh_gateway.mode.as_str(),
            "" | "none" | "local" | "remote"
        ) {
            return Err(ChainError::InvalidRequest(
                "Invalid OverrideMeshGateway.Mode parameter".into(),
            ));
        }
        Ok(o)
    }
}

/// Compiles the discovery chain of `req.service_name` from `entries`.
pub fn compile<L: EntryLookup + ?Sized>(
    req: &CompileRequest, entries: &L,
) -> Result<CompiledDiscoveryChain, ChainError> {
    compile::Compiler::new(req, entries).compile()
}

/// Config entries in memory, with a reverse index: for tests, tools and as
/// a model for the state store.
#[derive(Debug, Clone, Default)]
pub struct MemoryEntries {
    entries: BTreeMap<(Kind, String), ConfigEntry>,
    index: ReverseIndex,
}

impl MemoryEntries {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `entry`, replacing one of the same kind and name.
    pub fn upsert(&mut self, entry: ConfigEntry) {
        let key = (entry.kind(), entry.name().to_string());
        if let Some(old) = self.entries.get(&key) {
            self.index.remove(old);
        }
        self.index.add(&entry);
        self.entries.insert(key, entry);
    }

    pub fn delete(&mut self, kind: Kind, name: &str) -> Option<ConfigEntry> {
        let old = self.entries.remove(&(kind, name.to_string()))?;
        self.index.remove(&old);
        Some(old)
    }

    /// Applies a change that [`validate_write`] accepted.
    pub fn apply(&mut self, change: EntryChange) {
        match change {
            EntryChange::Upsert(e) => self.upsert(e),
            EntryChange::Delete { kind, name } => {
                self.delete(kind, &name);
            }
        }
    }
}

impl EntryLookup for MemoryEntries {
    fn get(&self, kind: Kind, name: &str) -> Option<&ConfigEntry> {
        self.entries.get(&(kind, name.to_string()))
    }

    fn list(&self, kind: Kind) -> Vec<&ConfigEntry> {
        self.entries
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .map(|(_, e)| e)
            .collect()
    }

    fn referrers(&self, service: &str) -> Vec<String> {
        self.index.referrers(service)
    }
}
