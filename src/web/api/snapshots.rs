//! `/api/v1/snapshots`: upload, list, status, delete, and the original file.

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::service::Label;
use crate::service::runs::MAX_RANK;
use crate::service::{SnapshotRow, Status};
use crate::web::error::ApiError;
use crate::web::extract::{Path, Query};
use crate::web::{AppState, upload};

#[derive(Deserialize)]
pub(crate) struct CreateQuery {
    name: Option<String>,
    note: Option<String>,
    run: Option<String>,
    rank: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct Created {
    id: String,
    status_url: String,
    page_url: String,
    /// True when the same bytes were uploaded before: they are analysed once, and this upload
    /// has its own id, name and note all the same.
    duplicate: bool,
    /// The same bytes had failed before and were queued again.
    retried: bool,
    /// Deletes this upload (`X-Fragscope-Key`), and its run when this upload started it. Given
    /// only here; the server keeps a hash.
    delete_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<RunLink>,
}

#[derive(Serialize)]
pub(crate) struct RunLink {
    id: String,
    page_url: String,
    /// This upload started the run: its delete key deletes the run too.
    started: bool,
}

/// Characters that reorder text on screen (U+202E shows `gpj.exe` as `exe.jpg`).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// What a name, a note or a run key may be: printable, in display order, bounded.
pub(crate) fn clean(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control() && !is_bidi_control(*c)).take(max).collect::<String>().trim().to_string()
}

/// The upload's name, note, run and rank: from the query, else the form.
fn label(q: CreateQuery, form: upload::Form) -> Result<Label, ApiError> {
    let name = q.name.or(form.name).or(form.filename).unwrap_or_else(|| "snapshot".into());
    let note = q.note.or(form.note).unwrap_or_default();
    let run_key = q.run.or(form.run).map(|r| clean(&r, 200)).filter(|r| !r.is_empty());
    let rank = match q.rank.or(form.rank).map(|r| r.trim().to_string()).filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => Some(r.parse::<i64>().ok().filter(|r| (0..=MAX_RANK).contains(r)).ok_or_else(|| {
            ApiError::BadRequest(format!("rank must be a whole number from 0 to {MAX_RANK}, got {:?}", clean(&r, 40)))
        })?),
    };
    Ok(Label { name: clean(&name, 200), note: clean(&note, 4000), run_key, rank })
}

pub(crate) async fn create(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<CreateQuery>,
    request: Request,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    app.authorize(&headers)?;
    let _arriving = app.uploads.clone().try_acquire_owned().map_err(|_| {
        ApiError::Busy(format!(
            "{} uploads are arriving at once, this server's most (half of --max-connections): try again shortly",
            (app.config.max_connections / 2).max(1)
        ))
    })?;
    let idle = std::time::Duration::from_secs(app.config.request_timeout_secs);
    // Parsed while it arrives when the budget allows now, so the link is ready soon after.
    let announced =
        upload::announced(&headers).filter(|b| *b <= app.config.max_upload && app.config.parse_while_arriving);
    let intake = app.service.intake(app.config.max_upload, announced).await?;
    let (arrived, form) = upload::receive(request, (&app.service, intake), app.config.max_upload, idle).await?;
    // A refused label drops what arrived: its temp file and staged copy go.
    let up = arrived.labelled(label(q, form)?);
    let admitted = app.service.admit(up).await?;
    Ok((StatusCode::ACCEPTED, Json(created(admitted))))
}

fn created(a: crate::service::Admitted) -> Created {
    let row = &a.row;
    Created {
        id: row.id.clone(),
        status_url: format!("/api/v1/snapshots/{}", row.id),
        page_url: format!("/s/{}", row.id),
        duplicate: a.duplicate,
        retried: a.retried,
        run: row.run_id.as_ref().map(|r| RunLink { id: r.clone(), page_url: format!("/r/{r}"), started: a.made_run }),
        delete_key: a.delete_key,
    }
}

#[derive(Serialize)]
pub(crate) struct StatusView {
    id: String,
    name: String,
    note: String,
    bytes: u64,
    sha256: String,
    status: Status,
    /// 0 to 1: the share of the upload parsed so far (1 once ready).
    progress: f64,
    error: Option<String>,
    verdict: Option<String>,
    created_at: i64,
    page_url: String,
    analysis_url: String,
}

pub(crate) fn status_view(app: &AppState, row: SnapshotRow) -> StatusView {
    let progress = match row.status {
        Status::Ready => 1.0,
        Status::Analyzing => {
            app.service.progress(&row.sha256).map(|read| read as f64 / row.bytes.max(1) as f64).unwrap_or(0.0).min(0.99)
        }
        Status::Queued | Status::Failed => 0.0,
    };
    StatusView {
        page_url: format!("/s/{}", row.id),
        analysis_url: format!("/api/v1/snapshots/{}/analysis", row.id),
        id: row.id,
        name: row.name,
        note: row.note,
        bytes: row.bytes,
        sha256: row.sha256,
        status: row.status,
        progress,
        error: row.error,
        verdict: row.verdict,
        created_at: row.created_at,
    }
}

pub(crate) async fn get(State(app): State<AppState>, Path(id): Path<String>) -> Result<Json<StatusView>, ApiError> {
    let row = app.row(&id).await?;
    Ok(Json(status_view(&app, row)))
}

/// A page of a list: `limit` items from `offset` (each list caps `limit`).
#[derive(Deserialize)]
pub(crate) struct ListQuery {
    pub(crate) limit: Option<u32>,
    pub(crate) offset: Option<u32>,
}

pub(crate) async fn list(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<StatusView>>, ApiError> {
    app.authorize(&headers)?;
    let rows = app.service.list(q.limit.unwrap_or(50).min(500), q.offset.unwrap_or(0)).await?;
    Ok(Json(rows.into_iter().map(|r| status_view(&app, r)).collect()))
}

pub(crate) async fn delete(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.row(&id).await?;
    let (service, of) = (app.service.clone(), id.clone());
    app.may_delete(&headers, |key| async move { service.owns(&of, &key).await }).await?;
    app.service.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Queues a failed analysis again (after a crash, or on a newer server): 202 with the status,
/// 409 when it had not failed.
pub(crate) async fn retry(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<StatusView>), ApiError> {
    app.authorize(&headers)?;
    let row = app.row(&id).await?;
    if !app.service.retry(&row.sha256).await? {
        return Err(ApiError::NotReady(format!(
            "only a failed analysis is retried; this one is {}",
            row.status.as_str()
        )));
    }
    let row = app.row(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(status_view(&app, row))))
}

/// The original upload, as an attachment (never rendered by the browser).
pub(crate) async fn blob(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let row = app.row(&id).await?;
    let (file, filename) = app.service.download(&row).await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{filename}\"")),
            (header::CONTENT_LENGTH, row.bytes.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
