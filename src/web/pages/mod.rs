//! The HTML pages: home (upload, recent snapshots) and a snapshot's share page. Rendered with
//! askama, which escapes every field: text from a snapshot (file names, function names, notes)
//! is never marked safe. Scripts are module files under /static; the page's data comes from
//! the API, the first paint (verdict, remedies) from the stored analysis.

pub(super) mod runs;

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use crate::service::{DeviceAnalysis, DiagnosisVerdict, Standing, verdict};
use crate::service::{SnapshotRow, Status};
use crate::units::bytes;
use crate::web::AppState;
use crate::web::error::ApiError;
use crate::web::extract::Path;

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
    /// `fragmentation`, `capacity`, `no-oom`, or the status while not ready: a class name.
    verdict_class: String,
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
    /// The run it belongs to (page id), if any.
    run: Option<String>,
    /// Snapshots to compare it with: (id, label), the other ranks of its run first.
    compare_with: Vec<(String, String)>,
    /// The page's scripts in one file (`web/bundle.rs`), under `/static/`.
    bundle: &'static str,
}

struct DeviceCard {
    device: i64,
    verdict: String,
    verdict_class: &'static str,
    summary: String,
    figures: Vec<(String, String)>,
    remedies: Vec<RemedyView>,
    /// Remedies that do not apply here: one line, each reason behind a disclosure.
    not_applying: Vec<RemedyView>,
    events: u64,
    /// The event the page opens on: the first OOM, else the last event.
    start_event: i64,
    warnings: Vec<String>,
    /// The budget the what-if form suggests: the reserved bytes at the first OOM.
    budget: String,
    /// What really happened, beside which simulations are read.
    real: String,
    /// What fills memory; None for analyses stored before categories existed.
    fills: Option<crate::web::fills::Fills>,
}

struct RemedyView {
    title: &'static str,
    /// The badge follows the prediction: fixes it, helps (not enough), does not help, does not
    /// apply; a remedy the model could not run says only that it applies.
    badge: &'static str,
    /// `fixes`, `helps`, `applies`, `nohelp` or `no`: the card's style.
    effect_class: &'static str,
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
pub(crate) struct PageError(pub ApiError);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let (title, detail) = match (&self.0, status) {
            (ApiError::NotFound(what), _) => {
                ("Not found".to_string(), format!("There is no {what} at this link. It may have been deleted."))
            }
            (_, StatusCode::NOT_FOUND) => {
                ("Not found".to_string(), "There is no snapshot at this link. It may have been deleted.".to_string())
            }
            (_, s) => (s.canonical_reason().unwrap_or("Error").to_string(), self.0.detail()),
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

impl From<crate::service::StoreError> for PageError {
    fn from(e: crate::service::StoreError) -> Self {
        PageError(e.into())
    }
}

pub(super) fn render(t: impl Template) -> Result<Html<String>, PageError> {
    t.render().map(Html).map_err(|e| PageError(ApiError::Internal(e.to_string())))
}

pub(super) fn date(unix: i64) -> String {
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

pub(crate) async fn home(State(app): State<AppState>) -> Result<Html<String>, PageError> {
    let locked = app.config.token.is_some();
    let recent = if locked {
        Vec::new()
    } else {
        app.service
            .list(20, 0)
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|r| {
                let (verdict, verdict_class) =
                    match (r.status, r.verdict.as_deref().and_then(DiagnosisVerdict::from_name)) {
                        (Status::Ready, Some(v)) => (v.words(), v.class()),
                        (s, _) => (s.as_str(), s.as_str()),
                    };
                Recent {
                    size: bytes(r.bytes),
                    date: date(r.created_at),
                    verdict: verdict.to_string(),
                    verdict_class: verdict_class.to_string(),
                    id: r.id,
                    name: r.name,
                }
            })
            .collect()
    };
    render(Home { recent, locked, max_upload: bytes(app.config.max_upload) })
}

pub(crate) async fn snapshot(
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
        run: row.run_id.clone(),
        compare_with: Vec::new(),
        bundle: super::bundle::PATH,
    };
    if page.ready {
        fill(&app, &row, &mut page).await?;
        page.compare_with = compare_with(&app, &row).await?;
    }
    render(page)
}

/// What a ready snapshot can be compared with: the other ranks of its run, then (unless the
/// server wants a token, which keeps its list private) the most recent snapshots.
async fn compare_with(app: &AppState, row: &SnapshotRow) -> Result<Vec<(String, String)>, PageError> {
    let service = &app.service;
    let mut out: Vec<(String, String)> = Vec::new();
    if let Some(run) = &row.run_id {
        for r in service.run_snapshots(run).await.map_err(ApiError::from)? {
            let rank = r.rank.map(|k| format!("rank {k}: ")).unwrap_or_default();
            out.push((r.id, format!("{rank}{}", r.name)));
        }
    }
    if app.config.token.is_none() {
        for r in service.list(20, 0).await.map_err(ApiError::from)? {
            out.push((r.id, format!("{} ({})", r.name, date(r.created_at))));
        }
    }
    let mut seen = std::collections::HashSet::from([row.id.clone()]);
    out.retain(|(id, _)| seen.insert(id.clone()));
    Ok(out)
}

async fn fill(app: &AppState, row: &SnapshotRow, page: &mut Snapshot) -> Result<(), PageError> {
    let a = app.service.analysis(row).await.map_err(ApiError::from)?;
    for d in &a.devices {
        let mut card = device_card(d);
        let prefix = format!("device {}:", d.device);
        for w in a.warnings.iter().filter(|w| w.starts_with(&prefix)) {
            card.warnings.insert(0, format!("The file contradicts itself: {w}"));
        }
        page.devices.push(card);
    }
    if let Some(s) = a.allocator_settings.as_ref().and_then(|s| s.as_object()) {
        page.settings = s
            .iter()
            .filter(|(k, _)| *k != "roundup_power2_divisions")
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
    }
    page.annotations = a
        .annotations
        .iter()
        .take(200)
        .map(|x| format!("{} {} (device {}, {} µs)", x.stage, x.name, x.device, x.time_us))
        .collect();
    Ok(())
}

fn device_card(d: &DeviceAnalysis) -> DeviceCard {
    let dg = &d.diagnosis;
    let oom = d.ooms.first();
    let need = &dg.need;
    let mut figures = match oom {
        Some(o) => vec![
            ("requested".into(), bytes(o.requested_bytes)),
            ("reserved".into(), bytes(o.reserved_bytes)),
            ("allocated".into(), bytes(o.allocated_bytes)),
            ("largest usable free block".into(), bytes(o.largest_usable_free_bytes)),
            ("pinned free".into(), bytes(o.pinned_free_bytes)),
        ],
        None => vec![
            ("reserved".into(), bytes(d.final_state.reserved_bytes)),
            ("allocated".into(), bytes(d.final_state.allocated_bytes)),
            ("pinned free".into(), bytes(d.pinned.bytes)),
            ("peak reserved".into(), bytes(d.peak.reserved_bytes)),
        ],
    };
    if oom.is_some()
        && let Some(n) = need.peak_reserved_bytes
    {
        figures.push(("the step needs (reserved)".into(), bytes(n)));
    }
    if let Some(b) = need.budget_bytes {
        let budget = match need.budget_upper_bytes {
            Some(u) => format!("{} to {}", bytes(b), bytes(u)),
            None => bytes(b),
        };
        figures.push(("budget".into(), budget));
    }
    if let Some(out) = dg.outside.as_ref().and_then(|o| o.outside_bytes) {
        figures.push(("held outside PyTorch".into(), bytes(out)));
    }
    let events = d.trace.events;
    // In the analysis's order (`verdict::Standing`); those that do not apply fold into one
    // line under the cards.
    let (not_applying, remedies): (Vec<RemedyView>, Vec<RemedyView>) = dg
        .remedies
        .iter()
        .map(|r| RemedyView {
            title: r.kind.title(),
            badge: r.standing().label(),
            effect_class: r.standing().class(),
            code: r.setting_or_code.clone(),
            why: match &r.predicted {
                Some(p) => format!("{} Predicted: {p}.", r.why),
                None => r.why.clone(),
            },
        })
        .partition(|r| r.effect_class == Standing::DoesNotApply.class());
    let mut warnings: Vec<String> = d.replay.first_warnings.clone();
    warnings.extend(d.replay.mismatches.iter().cloned());
    if !d.trace.complete {
        warnings.insert(0, "The trace does not reach back to an empty allocator (its oldest events were dropped): the start is reconstructed from the end.".into());
    }
    let real = match oom {
        Some(o) => {
            format!("Really: out of memory at event {}, with {} reserved.", o.event_index, bytes(o.reserved_bytes))
        }
        None => format!("Really: no OOM, peak {} reserved.", bytes(d.peak.reserved_bytes)),
    };
    let headline = verdict::headline(d);
    DeviceCard {
        budget: oom.map(|o| format!("{}MiB", o.reserved_bytes >> 20)).unwrap_or_default(),
        real,
        device: d.device,
        verdict: headline.words,
        verdict_class: headline.tone.class(),
        summary: dg.summary.clone(),
        figures,
        remedies,
        not_applying,
        events,
        start_event: oom.map(|o| o.event_index as i64).unwrap_or(events as i64 - 1),
        warnings,
        fills: (!d.memory.breakdown.is_empty()).then(|| crate::web::fills::fills(d)),
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
