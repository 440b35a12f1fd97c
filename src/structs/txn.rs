//! `PUT /v1/txn`'s operations and results beyond KV: Consul's `Node`,
//! `Service` and `Check` operations with their verbs, and one result of
//! any kind, shaped as Consul's `TxnResult` (`{"KV": ...}`, `{"Node": ...}`).

use serde::{Deserialize, Serialize, Serializer};

use super::serde_util::as_json;
use super::{HealthCheck, KvEntry, KvOp, Node, NodeService};

/// The verbs of a node, service or check operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatalogVerb {
    Set,
    Cas,
    Get,
    Delete,
    DeleteCas,
}

impl CatalogVerb {
    /// Consul's wire names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "set" => Self::Set,
            "cas" => Self::Cas,
            "get" => Self::Get,
            "delete" => Self::Delete,
            "delete-cas" => Self::DeleteCas,
            _ => return None,
        })
    }

    pub fn is_read(self) -> bool {
        self == Self::Get
    }
}

/// One operation of a transaction. Catalog payloads travel as JSON inside
/// the bincode entry (`as_json`), as in `Command::Register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TxnOp {
    Kv(KvOp),
    Node {
        verb: CatalogVerb,
        #[serde(with = "as_json")]
        node: Node,
    },
    Service {
        verb: CatalogVerb,
        node: String,
        #[serde(with = "as_json")]
        service: NodeService,
    },
    Check {
        verb: CatalogVerb,
        #[serde(with = "as_json")]
        check: HealthCheck,
    },
}

impl TxnOp {
    /// Whether the operation only reads (a txn of reads needs no Raft).
    pub fn is_read(&self) -> bool {
        match self {
            TxnOp::Kv(op) => op.verb.is_read(),
            TxnOp::Node { verb, .. } | TxnOp::Service { verb, .. } | TxnOp::Check { verb, .. } => {
                verb.is_read()
            }
        }
    }
}

/// One result of a transaction, as Consul shows it: an object with one
/// key naming its kind.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum TxnResult {
    #[serde(rename = "KV")]
    Kv(KvEntry),
    Node(Node),
    Service(NodeService),
    Check(HealthCheck),
}

impl Serialize for TxnResult {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        match self {
            TxnResult::Kv(e) => m.serialize_entry("KV", e)?,
            TxnResult::Node(n) => m.serialize_entry("Node", n)?,
            TxnResult::Service(x) => m.serialize_entry("Service", x)?,
            TxnResult::Check(c) => m.serialize_entry("Check", c)?,
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_consul_shaped() {
        let n = Node {
            node: "n1".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(TxnResult::Node(n)).unwrap();
        assert_eq!(v["Node"]["Node"], "n1");
        assert_eq!(v.as_object().unwrap().len(), 1);
    }

    #[test]
    fn catalog_ops_survive_the_log_encoding() {
        let op = TxnOp::Service {
            verb: CatalogVerb::Cas,
            node: "n1".into(),
            service: NodeService {
                id: "web-1".into(),
                service: "web".into(),
                modify_index: 7,
                ..Default::default()
            },
        };
        let bytes = bincode::serialize(&op).unwrap();
        assert_eq!(bincode::deserialize::<TxnOp>(&bytes).unwrap(), op);
    }
}
