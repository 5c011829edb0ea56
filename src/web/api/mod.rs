//! The REST API under `/api/v1`, one file per resource. The routes are fixed: scripts rely on
//! them (see `static/openapi.json`, served at `/api/v1/openapi.json`).

pub(crate) mod runs;
pub(crate) mod snapshots;
pub(crate) mod views;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use super::AppState;

/// Every route, as the OpenAPI document names it (a test holds the two together).
pub const PATHS: &[&str] = &[
    "/api/v1/snapshots",
    "/api/v1/snapshots/{id}",
    "/api/v1/snapshots/{id}/blob",
    "/api/v1/snapshots/{id}/retry",
    "/api/v1/snapshots/{id}/analysis",
    "/api/v1/snapshots/{id}/diagnosis",
    "/api/v1/snapshots/{id}/ooms",
    "/api/v1/snapshots/{id}/settings",
    "/api/v1/snapshots/{id}/stacks/{stack}",
    "/api/v1/snapshots/{id}/devices/{device}/timeline",
    "/api/v1/snapshots/{id}/devices/{device}/state",
    "/api/v1/snapshots/{id}/devices/{device}/events",
    "/api/v1/snapshots/{id}/devices/{device}/pinners",
    "/api/v1/snapshots/{id}/devices/{device}/active",
    "/api/v1/snapshots/{id}/devices/{device}/breakdown",
    "/api/v1/snapshots/{id}/devices/{device}/flame",
    "/api/v1/snapshots/{id}/devices/{device}/simulate",
    "/api/v1/runs",
    "/api/v1/runs/{id}",
    "/api/v1/compare",
    "/api/v1/curves",
    "/api/v1/openapi.json",
];

pub(crate) fn routes() -> Router<AppState> {
    let one = "/api/v1/snapshots/{id}";
    let device = "/api/v1/snapshots/{id}/devices/{device}";
    Router::new()
        // Uploads are capped by `--max-upload` while they stream, not by axum's 2 MB default.
        .route("/api/v1/snapshots", post(snapshots::create).layer(DefaultBodyLimit::disable()).get(snapshots::list))
        .route(one, get(snapshots::get).delete(snapshots::delete))
        .route(&format!("{one}/blob"), get(snapshots::blob))
        .route(&format!("{one}/retry"), post(snapshots::retry))
        .route(&format!("{one}/analysis"), get(views::analysis))
        .route(&format!("{one}/diagnosis"), get(views::diagnosis))
        .route(&format!("{one}/ooms"), get(views::ooms))
        .route(&format!("{one}/settings"), get(views::settings))
        .route(&format!("{one}/stacks/{{stack}}"), get(views::stack))
        .route(&format!("{device}/timeline"), get(views::timeline))
        .route(&format!("{device}/state"), get(views::state))
        .route(&format!("{device}/events"), get(views::events))
        .route(&format!("{device}/pinners"), get(views::pinners))
        .route(&format!("{device}/active"), get(views::active))
        .route(&format!("{device}/breakdown"), get(views::breakdown))
        .route(&format!("{device}/flame"), get(views::flame))
        .route(&format!("{device}/simulate"), get(views::simulate))
        .route("/api/v1/runs", get(runs::list))
        .route("/api/v1/runs/{id}", get(runs::get).delete(runs::delete))
        .route("/api/v1/compare", get(runs::compare))
        .route("/api/v1/curves", get(runs::curves))
        .route("/api/v1/openapi.json", get(openapi))
}

/// The OpenAPI document, written by hand beside the routes it describes (a test checks that
/// every route above is in it).
pub(crate) const OPENAPI: &str = include_str!("../../../static/openapi.json");

async fn openapi() -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI)
}
