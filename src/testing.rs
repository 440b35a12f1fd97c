//! Helpers shared by tests across modules: the conformance cases and
//! run.py's comparison, and a store with a publisher to apply commands to.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::state::{Command, MemoryBackend, Response, Store, apply_command};
use crate::stream::Publisher;
use crate::structs::config_entry::shape::is_empty;

/// `../shared/conformance`, beside the repository.
pub fn conformance_root() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/conformance"
    ))
}

/// The cases of one conformance directory, by file name. A directory that
/// is absent or holds no case fails the test: a conformance run that plays
/// nothing must not pass.
pub fn conformance_cases(dir: &str) -> Vec<(String, Value)> {
    let path = conformance_root().join(dir);
    let rd = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("conformance cases {}: {e}", path.display()));
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no conformance case in {}",
        path.display()
    );
    files
        .iter()
        .map(|p: &PathBuf| {
            let text = std::fs::read_to_string(p).expect("readable case");
            let name = Path::new(p)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .to_string();
            (name, serde_json::from_str(&text).expect("case is JSON"))
        })
        .collect()
}

/// run.py's normalisation: drop empty members, recursively.
pub fn normalise(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), normalise(x)))
                .filter(|(_, x)| !is_empty(x))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalise).collect()),
        v => v.clone(),
    }
}

pub fn first_diff(e: &Value, a: &Value, path: &str) -> Option<String> {
    match (e, a) {
        (Value::Object(em), Value::Object(am)) => {
            let keys: std::collections::BTreeSet<&String> = em.keys().chain(am.keys()).collect();
            keys.into_iter().find_map(|k| {
                let sub = format!("{path}/{k}");
                match (em.get(k), am.get(k)) {
                    (Some(x), Some(y)) => first_diff(x, y, &sub),
                    (x, y) => Some(format!("at {sub}: expected {x:?}, got {y:?}")),
                }
            })
        }
        (Value::Array(ea), Value::Array(aa)) => ea
            .iter()
            .zip(aa)
            .enumerate()
            .find_map(|(i, (x, y))| first_diff(x, y, &format!("{path}/{i}")))
            .or_else(|| {
                (ea.len() != aa.len())
                    .then(|| format!("at {path}: length {} vs {}", ea.len(), aa.len()))
            }),
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            ((x - y).abs() > 0.01).then(|| format!("at {path}: expected {x}, got {y}"))
        }
        _ => (e != a).then(|| format!("at {path}: expected {e}, got {a}")),
    }
}

/// A store over memory with a publisher: commands applied here are
/// committed and published as the state machine does.
pub struct World {
    pub store: Arc<Store>,
    pub publisher: Arc<Publisher>,
    pub index: u64,
}

impl World {
    pub fn new() -> World {
        World {
            store: Arc::new(Store::open(Box::new(MemoryBackend::default())).unwrap()),
            publisher: Arc::new(Publisher::default()),
            index: 1,
        }
    }

    /// A world with the built-in CA set up, as a leader's first term
    /// leaves it: proxies get leaves and roots.
    pub fn with_ca() -> World {
        let mut w = World::new();
        let ca = crate::connect::ca::initial(&w.store.state().cluster_id).unwrap();
        w.apply(Command::CaSet {
            ca: Box::new(ca),
            cas: None,
        });
        w
    }

    pub fn apply(&mut self, cmd: Command) -> Response {
        self.index += 1;
        let mut st = (*self.store.state()).clone();
        let (resp, set) = apply_command(&mut st, self.index, &cmd);
        self.store
            .commit(st.clone(), std::slice::from_ref(&set), vec![])
            .unwrap();
        self.publisher.publish(vec![(set, Arc::new(st))]);
        resp
    }

    /// Registers `svc` on `node` (at `addr`) with one passing check.
    pub fn register_passing(&mut self, node: &str, addr: &str, svc: crate::structs::NodeService) {
        let check = crate::structs::HealthCheck {
            check_id: format!("{}-check", svc.id),
            name: "check".into(),
            status: "passing".parse().unwrap(),
            service_id: svc.id.clone(),
            ..Default::default()
        };
        self.apply(Command::Register(Box::new(
            crate::structs::RegisterRequest {
                node: node.into(),
                address: addr.into(),
                service: Some(svc),
                checks: vec![check],
                ..Default::default()
            },
        )));
    }
}
