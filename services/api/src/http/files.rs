//! The web UI's files: a directory of the built UI (`ui/dist`), where any path that is not a
//! file is the UI's `index.html` (it routes itself).

use std::path::PathBuf;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get, get_service};
use tower_http::services::{ServeDir, ServeFile};

/// Where the UI's files come from.
#[derive(Debug, Clone)]
pub enum Files {
    /// A directory holding the built UI.
    Dir(PathBuf),
    /// None: a page says how to build them.
    Missing,
}

impl Files {
    /// The UI in `dir`, when it holds a built UI; else [`Files::Missing`] (with a warning).
    pub fn find(dir: Option<PathBuf>) -> Files {
        match dir {
            Some(dir) if dir.join("index.html").is_file() => Files::Dir(dir),
            Some(dir) => {
                tracing::warn!(dir = %dir.display(), "no index.html in the UI's directory: the web UI is not served");
                Files::Missing
            }
            None => Files::Missing,
        }
    }

    pub(super) fn service(&self) -> MethodRouter {
        match self {
            Files::Dir(dir) => get_service(ServeDir::new(dir).fallback(ServeFile::new(dir.join("index.html")))),
            Files::Missing => get(missing),
        }
    }
}

async fn missing() -> impl IntoResponse {
    (
        axum::http::StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        "<!doctype html><title>kiln</title><h1>kiln's web UI is not built here</h1>\
         <p>Build it with <code>scripts/ui.sh build</code> (Node.js) and start kiln with \
         <code>--ui-dir ui/dist</code> (<code>[http] ui-dir</code>); the HTTP API is at \
         <code>/api/v1/</code> either way.</p>",
    )
}
