//! The HTML pages: home (upload, recent snapshots) and a snapshot's share page. Rendered with
//! askama, which escapes every field: text from a snapshot (file names, function names, notes)
//! is never marked safe. Scripts are module files under /static; the page's data comes from
//! the API, the first paint (verdict, remedies) from the stored analysis.

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::extract::Path;
use crate::store::{SnapshotRow, Status};
use crate::units::bytes;

#[derive(Template)]
#[template(path = "home.html")]
struct Home {
    recent: Vec<Recent>,
    /// Uploads need the token: the list is not shown and the form asks for it.
    locked: bool,
    max_upload: String,
}

struct Recent {
    id: String,
    name: String,
    size: String,
    date: String,
    verdict: String,
}

#[derive(Template)]
#[template(path = "snapshot.html")]
struct Snapshot {
    id: String,
    name: String,
    note: String,
    size: String,
    date: String,
    status: String,
    error: String,
    ready: bool,
    devices: Vec<DeviceCard>,
    settings: Vec<(String, String)>,
    annotations: Vec<String>,
}

struct DeviceCard {
    device: i64,
    verdict: String,
    verdict_class: &'static str,
    summary: String,
    figures: Vec<(String, String)>,
    remedies: Vec<RemedyView>,
    events: u64,
    /// The event the page opens on: the first OOM, else the last event.
    start_event: i64,
    warnings: Vec<String>,
    /// The budget the what-if form suggests: the reserved bytes at the first OOM.
    budget: String,
    /// What really happened, beside which simulations are read.
    real: String,
}

struct RemedyView {
    title: &'static str,
    applies: bool,
    code: String,
    why: String,
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    title: String,
    detail: String,
}

/// An error as an HTML page (the API's errors are JSON).
pub struct PageError(pub ApiError);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let (title, detail) = match status {
            StatusCode::NOT_FOUND => {
                ("Not found".to_string(), "There is no snapshot at this link. It may have been deleted.".to_string())
            }
            s => (s.canonical_reason().unwrap_or("Error").to_string(), self.0.detail()),
        };
        if let ApiError::Internal(e) = &self.0 {
            tracing::error!(error = %e, "page error");
        }
        match (ErrorPage { title, detail }).render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => (status, "error").into_response(),
        }
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<crate::store::StoreError> for PageError {
    fn from(e: crate::store::StoreError) -> Self {
        PageError(e.into())
    }
}

fn render(t: impl Template) -> Result<Html<String>, PageError> {
    t.render().map(Html).map_err(|e| PageError(ApiError::Internal(e.to_string())))
}

fn date(unix: i64) -> String {
    // Days since 1970 to a civil date (Howard Hinnant's algorithm), without a date crate.
    let days = unix.div_euclid(86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let secs = unix.rem_euclid(86400);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", secs / 3600, secs % 3600 / 60)
}

pub async fn home(State(app): State<AppState>) -> Result<Html<String>, PageError> {
    let locked = app.config.token.is_some();
    let recent = if locked {
        Vec::new()
    } else {
        app.store
            .meta
            .list(20, 0)
            .await?
            .into_iter()
            .map(|r| Recent {
                size: bytes(r.bytes),
                date: date(r.created_at),
                verdict: match r.status {
                    Status::Ready => r.verdict.clone().unwrap_or_default().replace('_', " "),
                    s => s.as_str().to_string(),
                },
                id: r.id,
                name: r.name,
            })
            .collect()
    };
    render(Home { recent, locked, max_upload: bytes(app.config.max_upload) })
}

pub async fn snapshot(
    State(app): State<AppState>,
    Path(id): Path<String>,
    _headers: HeaderMap,
) -> Result<Html<String>, PageError> {
    let row = app.row(&id).await?;
    let mut page = Snapshot {
        id: row.id.clone(),
        name: row.name.clone(),
        note: row.note.clone(),
        size: bytes(row.bytes),
        date: date(row.created_at),
        status: row.status.as_str().to_string(),
        error: row.error.clone().unwrap_or_default(),
        ready: row.status == Status::Ready,
        devices: Vec::new(),
        settings: Vec::new(),
        annotations: Vec::new(),
    };
    if page.ready {
        fill(&app, &row, &mut page)?;
    }
    render(page)
}

fn fill(app: &AppState, row: &SnapshotRow, page: &mut Snapshot) -> Result<(), PageError> {
    let raw = app.store.results.read(&row.id, "analysis.json").map_err(|e| ApiError::Internal(e.to_string()))?;
    let a: Value = serde_json::from_slice(&raw).map_err(|e| ApiError::Internal(e.to_string()))?;
    for d in a["devices"].as_array().into_iter().flatten() {
        let mut card = device_card(d);
        for w in a["warnings"].as_array().into_iter().flatten().filter_map(|w| w.as_str()) {
            if w.starts_with(&format!("device {}:", card.device)) {
                card.warnings.insert(0, format!("The file contradicts itself: {w}"));
            }
        }
        page.devices.push(card);
    }
    if let Some(s) = a["allocator_settings"].as_object() {
        page.settings = s
            .iter()
            .filter(|(k, _)| *k != "roundup_power2_divisions")
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
    }
    page.annotations = a["annotations"]
        .as_array()
        .into_iter()
        .flatten()
        .take(200)
        .map(|x| {
            format!(
                "{} {} (device {}, {} µs)",
                x["stage"].as_str().unwrap_or(""),
                x["name"].as_str().unwrap_or(""),
                x["device"],
                x["time_us"]
            )
        })
        .collect();
    Ok(())
}

fn device_card(d: &Value) -> DeviceCard {
    let dg = &d["diagnosis"];
    let verdict = dg["verdict"].as_str().unwrap_or("no_oom");
    let n = |v: &Value| bytes(v.as_u64().unwrap_or(0));
    let mut figures = Vec::new();
    if let Some(o) = d["ooms"].as_array().and_then(|o| o.first()) {
        figures.push(("requested".into(), n(&o["requested_bytes"])));
        figures.push(("reserved".into(), n(&o["reserved_bytes"])));
        figures.push(("allocated".into(), n(&o["allocated_bytes"])));
        figures.push(("largest usable free block".into(), n(&o["largest_usable_free_bytes"])));
        figures.push(("pinned free".into(), n(&o["pinned_free_bytes"])));
    } else {
        figures.push(("reserved".into(), n(&d["final"]["reserved_bytes"])));
        figures.push(("allocated".into(), n(&d["final"]["allocated_bytes"])));
        figures.push(("pinned free".into(), n(&d["pinned"]["bytes"])));
        figures.push(("peak reserved".into(), n(&d["peak"]["reserved_bytes"])));
    }
    let events = d["trace"]["events"].as_u64().unwrap_or(0);
    let start_event = d["ooms"][0]["event_index"].as_i64().unwrap_or(events as i64 - 1);
    let remedies = dg["remedies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| RemedyView {
            title: match r["kind"].as_str().unwrap_or("") {
                "expandable_segments" => "Expandable segments",
                "mempool" => "A MemPool around the big allocations",
                "max_split_size" => "max_split_size_mb",
                "reuse_buffer" => "Reuse one buffer",
                _ => "Remedy",
            },
            applies: r["applies"].as_bool().unwrap_or(false),
            code: r["setting_or_code"].as_str().unwrap_or("").to_string(),
            why: match r["predicted"].as_str() {
                Some(p) => format!("{} Predicted: {p}.", r["why"].as_str().unwrap_or("")),
                None => r["why"].as_str().unwrap_or("").to_string(),
            },
        })
        .collect();
    let mut warnings: Vec<String> = d["replay"]["first_warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(String::from))
        .collect();
    warnings.extend(
        d["replay"]["mismatches"].as_array().into_iter().flatten().filter_map(|w| w.as_str().map(String::from)),
    );
    if d["trace"]["complete"] == false {
        warnings.insert(0, "The trace does not reach back to an empty allocator (its oldest events were dropped): the start is reconstructed from the end.".into());
    }
    let budget = d["ooms"][0]["reserved_bytes"].as_u64().map(|b| format!("{}MiB", b >> 20)).unwrap_or_default();
    let real = match d["ooms"][0]["event_index"].as_u64() {
        Some(e) => format!("Really: out of memory at event {e}, with {} reserved.", n(&d["ooms"][0]["reserved_bytes"])),
        None => format!("Really: no OOM, peak {} reserved.", n(&d["peak"]["reserved_bytes"])),
    };
    DeviceCard {
        budget,
        real,
        device: d["device"].as_i64().unwrap_or(0),
        verdict: match verdict {
            "fragmentation" => "Out of memory: fragmentation".into(),
            "capacity" => "Out of memory: capacity".into(),
            _ => "No OOM in this trace".into(),
        },
        verdict_class: match verdict {
            "fragmentation" => "bad",
            "capacity" => "warn",
            _ => "ok",
        },
        summary: dg["summary"].as_str().unwrap_or("").to_string(),
        figures,
        remedies,
        events,
        start_event,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_civil() {
        assert_eq!(super::date(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::date(1795946996), "2026-11-29 10:09 UTC");
    }
}
