//! `/api/v1/runs`: one job's ranks; `/api/v1/compare`: two snapshots side by side;
//! `/api/v1/curves`: several snapshots' memory over their events, for the overlays.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::service::Comparison;
use crate::service::runs::{MAX_CURVES, RunView};
use crate::web::AppState;
use crate::web::api::snapshots::ListQuery;
use crate::web::error::ApiError;
use crate::web::extract::{Path, Query};

/// A run by its page id, with each rank's numbers.
async fn run_of(app: &AppState, id: &str) -> Result<RunView, ApiError> {
    Ok(app.service.run(app.run(id).await?).await?)
}

pub(crate) async fn get(State(app): State<AppState>, Path(id): Path<String>) -> Result<Json<RunView>, ApiError> {
    Ok(Json(run_of(&app, &id).await?))
}

pub(crate) async fn list(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<RunView>>, ApiError> {
    app.authorize(&headers)?;
    Ok(Json(app.service.runs(q.limit.unwrap_or(20).min(100), q.offset.unwrap_or(0)).await?))
}

/// Deletes a run and every snapshot in it: with the token, or the delete key of the upload
/// that started the run.
pub(crate) async fn delete(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.run(&id).await?;
    let (service, of) = (app.service.clone(), id.clone());
    app.may_delete(&headers, |key| async move { service.owns_run(&of, &key).await }).await?;
    app.service.delete_run(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(crate) struct CompareQuery {
    a: String,
    b: String,
}

/// Two ready snapshots side by side: `a` before, `b` after.
pub(crate) async fn compare(
    State(app): State<AppState>,
    Query(q): Query<CompareQuery>,
) -> Result<Json<Comparison>, ApiError> {
    let (a, b) = (app.ready(&q.a).await?, app.ready(&q.b).await?);
    Ok(Json(app.service.compare(&a, &b).await?))
}

#[derive(Deserialize)]
pub(crate) struct CurvesQuery {
    /// Snapshot ids, comma-separated.
    ids: String,
    points: Option<usize>,
    /// `step`: the x axis by step where every snapshot has steps; `share` (the default): the
    /// share of each one's events.
    x: Option<String>,
}

/// Reserved and allocated bytes of several snapshots over their steps or the share of their
/// events gone by (`X-Fragscope-Axis` says which), as little-endian f32 columns (see `service::runs::Curves::to_bytes`).
pub(crate) async fn curves(State(app): State<AppState>, Query(q): Query<CurvesQuery>) -> Result<Response, ApiError> {
    let ids: Vec<&str> = q.ids.split(',').filter(|s| !s.is_empty()).collect();
    if ids.is_empty() || ids.len() > MAX_CURVES {
        return Err(ApiError::BadRequest(format!("ids: from 1 to {MAX_CURVES} snapshot ids, comma-separated")));
    }
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        rows.push(app.row(id).await?);
    }
    let points = q.points.unwrap_or(400).clamp(2, 2000);
    let by_step = match q.x.as_deref() {
        None | Some("share") => false,
        Some("step") => true,
        Some(_) => return Err(ApiError::BadRequest("x: `step` or `share`".into())),
    };
    let curves = app.service.curves(&rows, points, by_step).await?;
    // The axis the curves were put on: `steps=N` when by step, else `share`.
    let axis = curves.steps.map(|n| format!("steps={n}")).unwrap_or_else(|| "share".into());
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::HeaderName::from_static("x-fragscope-axis"), axis),
        ],
        curves.to_bytes(),
    )
        .into_response())
}
