//! In-process HTTP tests: the whole router, on a temp data directory, driven with
//! `tower::ServiceExt::oneshot` (no socket, no server process). The integration tests drive a
//! real server over loopback; these check routing, extractors and error shapes quickly.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

/// The application on a fresh temp directory (kept alive with the router).
pub(crate) async fn app() -> (Router, tempfile::TempDir) {
    let (app, _, dir) = app_and_state().await;
    (app, dir)
}

/// The application and its state, for tests that hold the service's resources.
pub(crate) async fn app_and_state() -> (Router, super::AppState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let state = super::state(crate::config::Config::for_tests(dir.path().to_path_buf())).await.unwrap();
    (super::router(state.clone()), state, dir)
}

/// Sends one request; the status and the body as text.
pub(crate) async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 64 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    send(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

pub(crate) async fn post(app: &Router, uri: &str, body: Vec<u8>) -> (StatusCode, String) {
    send(app, Request::post(uri).body(Body::from(body)).unwrap()).await
}

#[tokio::test]
async fn unknown_routes_and_bad_ids_answer_in_our_error_format() {
    let (app, _dir) = app().await;
    let (status, body) = get(&app, "/api/v1/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains(r#""error":"not_found""#), "{body}");
    let (status, body) = get(&app, "/api/v1/snapshots/not-an-id/devices/x/state").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains(r#""error":"bad_request""#), "our Path extractor, not axum's text: {body}");
    assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_small_upload_is_checked_in_the_request_and_analysed_in_the_background() {
    use crate::testkit::{MIB, SnapshotBuilder, USER};
    let (app, state, _dir) = app_and_state().await;
    let (status, body) = post(&app, "/api/v1/snapshots", b"not a pickle at all".to_vec()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    let bytes = SnapshotBuilder::new()
        .segment(0x7f00_0000_0000, 20 * MIB, &[(4 * MIB, "active_allocated", &[USER]), (16 * MIB, "inactive", &[])])
        .alloc_in_new_segment(0x7f00_0000_0000, 20 * MIB, 4 * MIB, &[USER])
        .bytes();
    let (status, body) = post(&app, "/api/v1/snapshots?name=built", bytes).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    #[derive(serde::Deserialize)]
    struct Created {
        id: String,
    }
    let id = serde_json::from_str::<Created>(&body).unwrap().id;
    for _ in 0..200 {
        let (_, s) = get(&app, &format!("/api/v1/snapshots/{id}")).await;
        if s.contains(r#""status":"ready""#) {
            let (status, a) = get(&app, &format!("/api/v1/snapshots/{id}/analysis")).await;
            assert_eq!(status, StatusCode::OK);
            // The document the API serves reads back as the typed contract.
            let a: crate::analysis::Analysis = serde_json::from_str(&a).unwrap();
            assert_eq!(a.devices[0].final_state.allocated_bytes, 4 * MIB);
            // Two simulations at once, and a third is told to come back rather than queued.
            let held = (state.service.simulation_slot().unwrap(), state.service.simulation_slot().unwrap());
            let (status, body) = get(&app, &format!("/api/v1/snapshots/{id}/devices/0/simulate?conf=")).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert!(body.contains(r#""error":"busy""#), "{body}");
            drop(held);
            let (status, body) = get(&app, &format!("/api/v1/snapshots/{id}/devices/0/simulate?conf=")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("never ready");
}
