//! The web UI's static files at `/ui/` (and `/` sent there), for both
//! routers: a server's and a client agent's. The files of `ui/` at the
//! repository's root are compiled into the binary (no build step, nothing
//! fetched at run time); `--ui-dir` (Consul's `ui_config.dir`) serves a
//! directory instead, never a file outside it.

use std::path::{Component, Path, PathBuf};

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// Whether and what to serve (`--ui`, `--ui-dir`; `ui_config`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UiConfig {
    pub enabled: bool,
    /// Serve this directory rather than the embedded files.
    pub dir: Option<PathBuf>,
}

impl UiConfig {
    /// A directory given means a UI wanted, as in Consul.
    pub fn serves(&self) -> bool {
        self.enabled || self.dir.is_some()
    }
}

macro_rules! assets {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!("../../ui/", $name)) as &[u8])),*]
    };
}

/// The embedded UI, by path under `/ui/`.
pub const ASSETS: &[(&str, &[u8])] = assets![
    "index.html",
    "style.css",
    "js/api.js",
    "js/app.js",
    "js/dom.js",
    "js/services.js",
    "js/nodes.js",
    "js/kv.js",
    "js/intentions.js",
    "js/config.js",
    "js/acl.js",
    "js/routing.js",
];

/// The Content-Type of a file by its extension.
pub fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, e)| e) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The routes of the UI when `config` asks for one (none otherwise).
pub fn routes<S: Clone + Send + Sync + 'static>(config: &UiConfig) -> Router<S> {
    if !config.serves() {
        return Router::new();
    }
    let dir = config.dir.clone();
    let serve = move |req: Request| {
        let dir = dir.clone();
        async move {
            let path = req.uri().path().strip_prefix("/ui/").unwrap_or("");
            file(dir.as_deref(), path).await
        }
    };
    Router::new()
        // 302: `/` may serve something else another day; `/ui` never will.
        .route(
            "/",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/ui/")]) }),
        )
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(serve.clone()))
        .route("/ui/{*path}", get(serve))
}

/// One file: `index.html` for the root; a 404 for what is not there, and
/// for any path that could leave the directory.
async fn file(dir: Option<&Path>, path: &str) -> Response {
    let path = if path.is_empty() { "index.html" } else { path };
    let body = match dir {
        None => ASSETS
            .iter()
            .find(|(name, _)| *name == path)
            .map(|(_, bytes)| bytes.to_vec()),
        Some(dir) => match inside(dir, path) {
            Some(p) => tokio::fs::read(p).await.ok(),
            None => None,
        },
    };
    match body {
        Some(bytes) => {
            let mut resp = bytes.into_response();
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(path)),
            );
            // Small and changing with the binary: always asked again.
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            h.insert(
                "x-content-type-options",
                HeaderValue::from_static("nosniff"),
            );
            resp
        }
        None => (StatusCode::NOT_FOUND, "UI file not found").into_response(),
    }
}

/// `path` (as the URL gave it, already decoded by the router) as a file
/// inside `dir`: only plain names, and the file found must still be
/// inside once symbolic links are followed.
pub fn inside(dir: &Path, path: &str) -> Option<PathBuf> {
    if path.contains('\\') || path.contains('\0') {
        return None;
    }
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let root = dir.canonicalize().ok()?;
    let full = root.join(rel).canonicalize().ok()?;
    (full.starts_with(&root) && full.is_file()).then_some(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_ui_is_small_and_typed() {
        let total: usize = ASSETS.iter().map(|(_, b)| b.len()).sum();
        assert!(total < 300 * 1024, "the UI is {total} bytes");
        for (name, _) in ASSETS {
            assert_ne!(content_type(name), "application/octet-stream", "{name}");
        }
    }

    #[test]
    fn refuses_paths_out_of_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ui");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.js"), "x").unwrap();
        std::fs::write(root.path().join("secret"), "s").unwrap();
        assert!(inside(&dir, "a.js").is_some());
        for bad in [
            "../secret",
            "/etc/passwd",
            "x/../../secret",
            "..",
            "a\\..\\b",
        ] {
            assert!(inside(&dir, bad).is_none(), "{bad}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.path().join("secret"), dir.join("link")).unwrap();
            assert!(inside(&dir, "link").is_none());
        }
    }
}
