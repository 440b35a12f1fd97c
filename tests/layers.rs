//! The crate's layers hold: a module of `src/` imports only modules on
//! lower layers (ARCHITECTURE.md draws them). Read from the code's own
//! `crate::` paths, test modules left out; fails naming every import that
//! runs sideways or up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each module's layer, from the ground up.
const LAYERS: &[&[&str]] = &[
    &[
        "acl",
        "filter",
        "metrics",
        "signal",
        "definition",
        "leases",
        "disk",
        "tls",
        "tasks",
        "monitor",
        "random",
        "shares",
    ],
    &["error", "config_file", "coordinate"],
    &["structs"],
    &["config_check", "request", "login"],
    &["discovery_chain", "cli"],
    &["state"],
    &["stream", "merge", "session_ttl", "dns", "connect"],
    &["proxycfg", "raft", "agent", "testing"],
    &["server", "xds"],
    &["federation"],
    &["endpoint"],
    &["leader"],
    &["http", "grpc"],
    &["process", "flags"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its test module and comments.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim_start();
        if t == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod "))
        {
            break;
        }
        if !t.starts_with("//") {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// The modules a piece of code names through `crate::`.
fn rooms_named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

#[test]
fn rooms_import_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = 0;
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        let name = f.file_name().unwrap().to_string_lossy();
        if ["lib", "main", "bin"].contains(&module.as_str())
            || name == "tests.rs"
            || name == "conformance_tests.rs"
        {
            continue;
        }
        let layer = layer_of(&module).unwrap_or_else(|| {
            panic!(
                "module {module} ({}) is on no layer: add it to LAYERS",
                rel.display()
            )
        });
        checked += 1;
        for to in rooms_named(&code_of(&std::fs::read_to_string(f).unwrap())) {
            if to == module {
                continue;
            }
            match layer_of(&to) {
                Some(l) if l < layer => {}
                _ => wrong
                    .entry(rel.display().to_string())
                    .or_default()
                    .push(format!("{module} -> {to}")),
            }
        }
    }
    assert!(checked > 50, "only {checked} files read");
    assert!(
        wrong.is_empty(),
        "imports that do not run down a layer:\n{}",
        wrong
            .iter()
            .map(|(f, w)| format!("  {f}: {}", w.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_reader_sees_imports() {
    let code = "use crate::state::{Store, keys};\nuse crate::{error::Error, structs};\nlet x = crate::http::serve;";
    assert_eq!(rooms_named(code), ["state", "error", "structs", "http"]);
    let code =
        code_of("use crate::a;\n// crate::b\n#[cfg(test)]\nmod tests {\n use crate::c;\n}\n");
    assert_eq!(rooms_named(&code), ["a"]);
}
