//! The OpenAPI 3.1 description of Sluice's HTTP endpoints, served at
//! `GET /openapi.json` by `sluice serve`'s HTTP port and by the proxy's
//! admin port. One document, `openapi.json` beside this file, describes
//! `serve`; a listener that answers only some of those endpoints serves it
//! narrowed to its own paths, so that each endpoint is described once.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The description of `sluice serve`'s HTTP port, as served.
///
/// ```
/// let doc: serde_json::Value = serde_json::from_str(sluice_server::openapi::SERVE)?;
/// assert_eq!(doc["openapi"], "3.1.0");
/// assert!(doc["paths"]["/v1/limit"]["post"].is_object());
/// # Ok::<_, serde_json::Error>(())
/// ```
pub const SERVE: &str = include_str!("openapi.json");

/// [`SERVE`] with only the paths in `paths`, and `title` and `description`
/// in its `info`. The components stay whole: a schema no path refers to
/// any more describes nothing, and harms nothing.
///
/// ```
/// let doc = sluice_server::openapi::narrowed(&["/healthz"], "Health", "Only health.")?;
/// let doc: serde_json::Value = serde_json::from_str(&doc)?;
/// assert_eq!(doc["info"]["title"], "Health");
/// let paths: Vec<_> = doc["paths"].as_object().unwrap().keys().collect();
/// assert_eq!(paths, ["/healthz"]);
/// # Ok::<_, serde_json::Error>(())
/// ```
pub fn narrowed(paths: &[&str], title: &str, description: &str) -> serde_json::Result<String> {
    let mut doc: serde_json::Value = serde_json::from_str(SERVE)?;
    if let Some(described) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        described.retain(|path, _| paths.contains(&path.as_str()));
    }
    if let Some(info) = doc.get_mut("info").and_then(|i| i.as_object_mut()) {
        info.insert("title".into(), title.into());
        info.insert("description".into(), description.into());
    }
    serde_json::to_string_pretty(&doc)
}

/// A description as the answer to `GET /openapi.json`.
pub(crate) fn response(doc: impl Into<Body>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        doc.into(),
    )
        .into_response()
}
