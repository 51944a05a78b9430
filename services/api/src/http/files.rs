//! The web UI's files: a directory of the built UI (`ui/dist`), or with the `embed-ui` feature
//! the copy built into the binary; any path that is not a file is the UI's `index.html` (it
//! routes itself).

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
    /// The UI built into the binary (the `embed-ui` feature).
    #[cfg(feature = "embed-ui")]
    Embedded,
    /// None: a page says how to build them.
    Missing,
}

impl Files {
    /// The UI in `dir`, when it holds a built UI; without a directory, the embedded UI when the
    /// binary has one, else [`Files::Missing`].
    pub fn find(dir: Option<PathBuf>) -> Files {
        match dir {
            Some(dir) if dir.join("index.html").is_file() => Files::Dir(dir),
            Some(dir) => {
                tracing::warn!(dir = %dir.display(), "no index.html in the UI's directory: the web UI is not served");
                Files::Missing
            }
            #[cfg(feature = "embed-ui")]
            None => Files::Embedded,
            #[cfg(not(feature = "embed-ui"))]
            None => Files::Missing,
        }
    }

    pub(super) fn service(&self) -> MethodRouter {
        match self {
            Files::Dir(dir) => get_service(ServeDir::new(dir).fallback(ServeFile::new(dir.join("index.html")))),
            #[cfg(feature = "embed-ui")]
            Files::Embedded => get(embedded::serve),
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

#[cfg(feature = "embed-ui")]
mod embedded {
    use axum::http::{Uri, header};
    use axum::response::{IntoResponse, Response};

    /// ui/dist as it was when the binary was built.
    static UI: include_dir::Dir<'static> = include_dir::include_dir!("$CARGO_MANIFEST_DIR/../../ui/dist");

    pub(super) async fn serve(uri: Uri) -> Response {
        let path = uri.path().trim_start_matches('/');
        let file = UI
            .get_file(path)
            .or_else(|| UI.get_file("index.html"))
            .expect("the embedded UI has an index.html");
        let mime = mime_guess::from_path(file.path()).first_or_octet_stream();
        (
            [(header::CONTENT_TYPE, mime.essence_str().to_string())],
            file.contents(),
        )
            .into_response()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[tokio::test]
        async fn the_embedded_ui_serves_its_files_and_its_index_for_routes() {
            let index = serve(Uri::from_static("/runs/abc")).await;
            assert_eq!(index.headers()[header::CONTENT_TYPE], "text/html");
            let body = axum::body::to_bytes(index.into_body(), 1 << 20).await.unwrap();
            assert_eq!(&body[..], UI.get_file("index.html").unwrap().contents());
            let script = UI
                .get_dir("assets")
                .and_then(|assets| assets.files().find(|f| f.path().extension().is_some_and(|e| e == "js")))
                .expect("the built UI has a script under assets/");
            let served = serve(format!("/{}", script.path().display()).parse().unwrap()).await;
            assert_eq!(served.headers()[header::CONTENT_TYPE], "text/javascript");
        }
    }
}
