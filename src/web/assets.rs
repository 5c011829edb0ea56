//! Static files (JS, CSS), built into the binary so it runs from any directory and the page
//! works with no internet. Served with an ETag from their content and answered 304 when the
//! browser has them.

use std::sync::OnceLock;

use super::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

macro_rules! assets {
    ($($path:literal => $ty:literal),* $(,)?) => {
        &[$(($path, $ty, include_bytes!(concat!("../../static/", $path)) as &[u8])),*]
    };
}

/// (path under /static/, content type, bytes)
pub(crate) const ASSETS: &[(&str, &str, &[u8])] = assets! {
    "css/app.css" => "text/css; charset=utf-8",
    "js/home.js" => "text/javascript; charset=utf-8",
    "js/snapshot.js" => "text/javascript; charset=utf-8",
    "js/run.js" => "text/javascript; charset=utf-8",
    "js/compare.js" => "text/javascript; charset=utf-8",
    "js/data/curves.js" => "text/javascript; charset=utf-8",
    "js/draw/curves.js" => "text/javascript; charset=utf-8",
    "js/data/columns.js" => "text/javascript; charset=utf-8",
    "js/data/format.js" => "text/javascript; charset=utf-8",
    "js/data/fragment.js" => "text/javascript; charset=utf-8",
    "js/data/layout.js" => "text/javascript; charset=utf-8",
    "js/data/colors.js" => "text/javascript; charset=utf-8",
    "js/data/requests.js" => "text/javascript; charset=utf-8",
    "js/draw/canvas.js" => "text/javascript; charset=utf-8",
    "js/draw/segmap.js" => "text/javascript; charset=utf-8",
    "js/draw/timeline.js" => "text/javascript; charset=utf-8",
    "js/draw/active.js" => "text/javascript; charset=utf-8",
    "js/data/flame.js" => "text/javascript; charset=utf-8",
    "js/draw/flame.js" => "text/javascript; charset=utf-8",
    "js/page/pending.js" => "text/javascript; charset=utf-8",
    "js/page/controls.js" => "text/javascript; charset=utf-8",
    "js/page/pinners.js" => "text/javascript; charset=utf-8",
    "js/page/early.js" => "text/javascript; charset=utf-8",
    "openapi.json" => "application/json",
    "favicon.svg" => "image/svg+xml",
};

fn etags() -> &'static Vec<String> {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| ASSETS.iter().map(|(_, _, bytes)| tag(bytes)).collect())
}

/// An ETag from the content.
fn tag(bytes: &[u8]) -> String {
    format!("\"{}\"", Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect::<String>())
}

pub(crate) async fn serve(Path(path): Path<String>, headers: HeaderMap) -> Response {
    asset(&path, &headers)
}

/// Browsers ask for `/favicon.ico` whatever the page links: the same icon.
pub(crate) async fn favicon(headers: HeaderMap) -> Response {
    asset("favicon.svg", &headers)
}

fn asset(path: &str, headers: &HeaderMap) -> Response {
    let (content_type, bytes, etag) = if path == super::bundle::PATH {
        static TAG: OnceLock<String> = OnceLock::new();
        let bytes = super::bundle::snapshot_bundle();
        ("text/javascript; charset=utf-8", bytes, TAG.get_or_init(|| tag(bytes)))
    } else {
        let Some(i) = ASSETS.iter().position(|(p, _, _)| *p == path) else {
            return (StatusCode::NOT_FOUND, "no such file").into_response();
        };
        (ASSETS[i].1, ASSETS[i].2, &etags()[i])
    };
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag.clone())]).into_response();
    }
    let mut r = ([(header::CONTENT_TYPE, content_type)], bytes).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=600, must-revalidate"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

#[cfg(test)]
mod tests {
    /// A file added under `static/` but not listed above is a 404 that only a browser's console
    /// shows: every file there is served (but npm's `package.json` and `node_modules`).
    #[test]
    fn every_file_under_static_is_served() {
        fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    if p.file_name().is_some_and(|n| n != "node_modules") {
                        walk(&p, base, out);
                    }
                } else {
                    out.push(p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
        let mut files = Vec::new();
        walk(&base, &base, &mut files);
        assert!(files.len() > 10, "{files:?}");
        let missing: Vec<&String> = files
            .iter()
            .filter(|f| !f.ends_with("package.json") && !super::ASSETS.iter().any(|(p, _, _)| p == f))
            .collect();
        assert!(missing.is_empty(), "not served: {missing:?}");
    }
}
