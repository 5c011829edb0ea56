//! Read-only views of an analysed snapshot: the analysis and its parts, the timeline, the
//! segment map at an event, the events, pinners and stacks. What was stored at analysis time
//! is served from disk; what needs the trace itself is computed on the parsed snapshot.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::service::{
    ActiveBy, ActiveQuery as Active, Analysis, Breakdown, DeviceAnalysis, Downsampled, Flame, SERIES,
};
use crate::service::{PinnersAt, SnapshotRow};
use crate::web::AppState;
use crate::web::error::ApiError;
use crate::web::extract::{Path, Query};

/// The ETag of data `tag` of a snapshot.
fn etag(row: &SnapshotRow, tag: &str) -> String {
    format!("\"{}-{tag}\"", row.id)
}

/// 304 when the request names the ETag `immutable` gives data `tag` of this snapshot.
fn unchanged(headers: &HeaderMap, row: &SnapshotRow, tag: &str) -> Option<Response> {
    let etag = etag(row, tag);
    (headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()))
        .then(|| (axum::http::StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response())
}

/// A response for data that never changes once a snapshot is ready.
fn immutable(headers: &HeaderMap, row: &SnapshotRow, tag: &str, content_type: &'static str, body: Vec<u8>) -> Response {
    unchanged(headers, row, tag).unwrap_or_else(|| cacheable(row, tag, content_type, body))
}

/// `body` as data `tag` of this snapshot, with its ETag and a max-age.
fn cacheable(row: &SnapshotRow, tag: &str, content_type: &'static str, body: Vec<u8>) -> Response {
    let etag = etag(row, tag);
    let mut r = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=3600"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    r
}

fn json_bytes<T: Serialize>(v: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::Internal(e.to_string()))
}

/// The stored analysis of a ready snapshot, typed.
async fn stored(app: &AppState, id: &str) -> Result<Analysis, ApiError> {
    let row = app.ready(id).await?;
    Ok(app.service.analysis(&row).await?)
}

/// The analysis document as stored, passed through untouched.
pub(crate) async fn analysis(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let row = app.ready(&id).await?;
    let bytes = app.service.analysis_bytes(&row.sha256)?;
    Ok(immutable(&headers, &row, "analysis", "application/json", bytes))
}

/// One part of every device, as `[{"device": d, KEY: ...}]`.
async fn per_device<T: Serialize>(
    app: &AppState,
    id: &str,
    key: &str,
    part: impl Fn(&DeviceAnalysis) -> &T,
) -> Result<Json<Vec<serde_json::Map<String, Value>>>, ApiError> {
    let a = stored(app, id).await?;
    let one = |d: &DeviceAnalysis| -> Result<_, ApiError> {
        let mut m = serde_json::Map::new();
        m.insert("device".into(), json!(d.device));
        m.insert(key.into(), serde_json::to_value(part(d)).map_err(|e| ApiError::Internal(e.to_string()))?);
        Ok(m)
    };
    Ok(Json(a.devices.iter().map(one).collect::<Result<_, _>>()?))
}

pub(crate) async fn diagnosis(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<serde_json::Map<String, Value>>>, ApiError> {
    per_device(&app, &id, "diagnosis", |d| &d.diagnosis).await
}

pub(crate) async fn ooms(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<serde_json::Map<String, Value>>>, ApiError> {
    per_device(&app, &id, "ooms", |d| &d.ooms).await
}

pub(crate) async fn settings(State(app): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let a = stored(&app, &id).await?;
    Ok(Json(json!({"allocator_settings": a.allocator_settings, "annotations": a.annotations})))
}

#[derive(Deserialize)]
pub(crate) struct TimelineQuery {
    start: Option<usize>,
    end: Option<usize>,
    points: Option<usize>,
    format: Option<String>,
}

/// The series over events `start..end` in at most `points` buckets (min and max per bucket).
/// `format=bin` (or `Accept: application/octet-stream`) gives little-endian f64 columns.
pub(crate) async fn timeline(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<TimelineQuery>,
) -> Result<Response, ApiError> {
    let row = app.ready(&id).await?;
    let points = q.points.unwrap_or(1000).clamp(1, 20_000);
    let d = app.service.timeline(&row, device, q.start, q.end, points).await?;
    let binary = q.format.as_deref() == Some("bin")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.starts_with("application/octet-stream"));
    let tag = format!("t{device}-{}-{}-{points}-{}", d.start, d.end, if binary { "b" } else { "j" });
    if binary {
        return Ok(immutable(&headers, &row, &tag, "application/octet-stream", d.to_f64_bytes()));
    }
    Ok(immutable(&headers, &row, &tag, "application/json", json_bytes(&timeline_json(device, &d))?))
}

/// The buckets as JSON: per series, the min and the max of each.
fn timeline_json(device: i64, d: &Downsampled) -> Value {
    let series: serde_json::Map<String, Value> = SERIES
        .iter()
        .enumerate()
        .map(|(s, name)| (name.to_string(), json!({"min": d.min[s], "max": d.max[s]})))
        .collect();
    json!({"device": device, "start": d.start, "end": d.end, "events": t_len(d), "event": d.event, "time_us": d.time_us, "series": series})
}

fn t_len(d: &Downsampled) -> u64 {
    d.end - d.start
}

#[derive(Deserialize)]
pub(crate) struct EventQuery {
    /// An event index, or `final` (the default).
    event: Option<String>,
}

/// Which moment a query names: None is the end.
fn parse_event(q: &EventQuery) -> Result<Option<u64>, ApiError> {
    match q.event.as_deref() {
        None | Some("final") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| ApiError::BadRequest(format!("event must be an index or `final`, got {s:?}"))),
    }
}

/// The segments and blocks right after an event.
pub(crate) async fn state(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<EventQuery>,
) -> Result<Response, ApiError> {
    let row = app.ready(&id).await?;
    let event = parse_event(&q)?;
    let tag = format!("m{device}-{}", event.map(|e| e.to_string()).unwrap_or_else(|| "final".into()));
    if let Some(not_modified) = unchanged(&headers, &row, &tag) {
        return Ok(not_modified);
    }
    let body = app.service.segment_map(&row, device, event).await?;
    Ok(immutable(&headers, &row, &tag, "application/json", body))
}

/// What fills memory right after an event (default: the end): bytes by category and the top
/// call sites, as the analysis's `breakdown` entries.
pub(crate) async fn breakdown(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<EventQuery>,
) -> Result<Json<Breakdown>, ApiError> {
    let row = app.ready(&id).await?;
    let event = parse_event(&q)?;
    Ok(Json(app.service.breakdown(&row, device, event).await?))
}

/// The memory alive at an event (default: the end) by the stacks that made it: an icicle.
pub(crate) async fn flame(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<EventQuery>,
) -> Result<Json<Flame>, ApiError> {
    let row = app.ready(&id).await?;
    let event = parse_event(&q)?;
    Ok(Json(app.service.flame(&row, device, event).await?))
}

/// Who pins free memory: at the end from the stored analysis, at an event by replaying.
pub(crate) async fn pinners(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<EventQuery>,
) -> Result<Json<Value>, ApiError> {
    let Some(event) = parse_event(&q)? else {
        let a = stored(&app, &id).await?;
        let d = a.devices.iter().find(|d| d.device == device).ok_or(ApiError::NotFound("device"))?;
        return Ok(Json(
            json!({"device": device, "event": null, "pinned": d.pinned, "pinners": d.pinners, "gaps": d.gaps}),
        ));
    };
    let row = app.ready(&id).await?;
    let at: PinnersAt = app.service.pinners_at(&row, device, event).await?;
    Ok(Json(serde_json::to_value(at).map_err(|e| ApiError::Internal(e.to_string()))?))
}

#[derive(Deserialize)]
pub(crate) struct EventsQuery {
    start: Option<u64>,
    limit: Option<u64>,
}

/// The trace's events from `start`, at most `limit` (1000) at a time.
pub(crate) async fn events(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<EventsQuery>,
) -> Result<Json<Value>, ApiError> {
    let row = app.ready(&id).await?;
    let (start, limit) = (q.start.unwrap_or(0), q.limit.unwrap_or(100).clamp(1, 1000));
    let page = app.service.events(&row, device, start, limit).await?;
    Ok(Json(serde_json::to_value(page).map_err(|e| ApiError::Internal(e.to_string()))?))
}

/// The frames of a stack (ids come from segment maps and events).
pub(crate) async fn stack(
    State(app): State<AppState>,
    Path((id, stack)): Path<(String, u32)>,
) -> Result<Json<Value>, ApiError> {
    let row = app.ready(&id).await?;
    let frames = app.service.stack(&row, stack).await?;
    Ok(Json(serde_json::to_value(frames).map_err(|e| ApiError::Internal(e.to_string()))?))
}

#[derive(Deserialize)]
pub(crate) struct ActiveQuery {
    start: Option<usize>,
    end: Option<usize>,
    points: Option<usize>,
    top: Option<usize>,
    /// `site` (the default) or `category`.
    by: Option<String>,
}

/// Live bytes by call site (or `by=category`) over events `start..end`, in at most `points`
/// buckets. The slowest of the page's requests, asked again on every load of a link: its
/// answer never changes, so the browser keeps it like the timeline (an ETag of the query; a
/// request that names it is answered 304 without computing).
pub(crate) async fn active(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<ActiveQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let row = app.ready(&id).await?;
    let (points, top) = (q.points.unwrap_or(500).clamp(1, 4000), q.top.unwrap_or(8).clamp(1, 32));
    let (by, name) = match q.by.as_deref() {
        None | Some("site") => (ActiveBy::Site, "site"),
        Some("category") => (ActiveBy::Category, "category"),
        Some(other) => return Err(ApiError::BadRequest(format!("by must be site or category, got {other:?}"))),
    };
    // The query as asked (an absent end is "to the last event"), so that a request the
    // browser revalidates needs no parsed snapshot.
    let shown = |v: Option<usize>| v.map_or("-".to_string(), |v| v.to_string());
    let tag = format!("active-{device}-{}-{}-{points}-{top}-{name}", shown(q.start), shown(q.end));
    if let Some(not_modified) = unchanged(&headers, &row, &tag) {
        return Ok(not_modified);
    }
    let asked = Active { start: q.start, end: q.end, points, top, by };
    let body = app.service.active(&row, device, asked).await?;
    // Asked with its ETag, it was answered 304 above.
    Ok(cacheable(&row, &tag, "application/json", body))
}

#[derive(Deserialize)]
pub(crate) struct SimulateQuery {
    conf: Option<String>,
    mempool: Option<String>,
    reuse: Option<String>,
    capacity: Option<String>,
}

/// The trace replayed through the allocator model under other settings (see `simulate`); where
/// the replay gets past the trace's own OOM, with what the step still needed (`step_need`), which
/// the replay cannot show: the trace ends at the OOM.
pub(crate) async fn simulate(
    State(app): State<AppState>,
    Path((id, device)): Path<(String, i64)>,
    Query(q): Query<SimulateQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let row = app.ready(&id).await?;
    let capacity = match q.capacity.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => Some(crate::config::parse_size(c).map_err(|e| ApiError::BadRequest(e.to_string()))?),
        None => None,
    };
    let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let settings = crate::service::SimulateSettings {
        conf: q.conf,
        capacity,
        mempool: nonempty(q.mempool),
        reuse: nonempty(q.reuse),
        shrink: None,
    };
    // As heavy as an analysis, and open to anyone with a link: two at once, not queued.
    let _slot = app.service.simulation_slot().ok_or_else(|| {
        ApiError::Busy("two simulations are running on this server: try again in a few seconds".into())
    })?;
    let outcome = app.service.simulate(&row, device, settings).await?;
    let mut body = serde_json::to_value(&outcome).map_err(|e| ApiError::Internal(e.to_string()))?;
    if outcome.oom.is_none() && outcome.trace_oom_event.is_some() {
        let analysis = app.service.analysis(&row).await?;
        if let Some(need) = analysis.devices.iter().find(|x| x.device == device).map(|x| &x.diagnosis.need) {
            let need = match capacity {
                Some(c) => need.with_budget(c),
                None => need.clone(),
            };
            body["step_need"] = serde_json::to_value(need).map_err(|e| ApiError::Internal(e.to_string()))?;
        }
    }
    Ok(Json(body))
}
