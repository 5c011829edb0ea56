//! The web layer: the router, its state, errors, and the API and pages. Handlers extract,
//! make one call into the store, the loaded cache or the analysis, and shape the response;
//! nothing here parses bytes or computes a metric.

pub mod api;
mod assets;
mod bundle;
pub(crate) mod error;
pub(crate) mod extract;
mod fills;
mod listen;
mod pages;
#[cfg(test)]
mod testing;
mod upload;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use tower_http::compression::CompressionLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;

use crate::config::Config;
use crate::service::Service;
use crate::service::{SnapshotRow, Status, valid_id};
use error::ApiError;

#[derive(Clone)]
pub(crate) struct AppState(Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) service: Service,
    /// Uploads arriving at once: at most half the connections, so that slow uploads can never
    /// take every connection from health checks and links.
    pub(crate) uploads: Arc<tokio::sync::Semaphore>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// With `--token`, the request must carry it (compared in constant time).
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.config.token else { return Ok(()) };
        let given =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let Some(given) = given else { return Err(ApiError::Unauthorized) };
        if crate::service::same_secret(given, token) { Ok(()) } else { Err(ApiError::WrongToken) }
    }

    /// Whether the request may delete what `owns` checks a delete key against: with `--token`,
    /// the token does; the delete key the upload's answer gave (`X-Fragscope-Key`) does in any
    /// mode. Without `--token` that key is the only way: a link or a job id is not enough.
    pub(crate) async fn may_delete<F, Fut>(&self, headers: &HeaderMap, owns: F) -> Result<(), ApiError>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<bool, crate::service::ServiceError>>,
    {
        let key = headers.get("x-fragscope-key").and_then(|v| v.to_str().ok()).map(str::trim).unwrap_or("");
        if !key.is_empty() && owns(key.to_string()).await? {
            return Ok(());
        }
        match (&self.config.token, key.is_empty()) {
            (Some(_), _) => self.authorize(headers),
            (None, true) => Err(ApiError::NeedsKey),
            (None, false) => Err(ApiError::WrongKey),
        }
    }

    /// The snapshot of a link, or 404 (the same for a malformed id as for an unknown one).
    pub(crate) async fn row(&self, id: &str) -> Result<SnapshotRow, ApiError> {
        if !valid_id(id) {
            return Err(ApiError::NotFound("snapshot"));
        }
        self.service.snapshot(id).await?.ok_or(ApiError::NotFound("snapshot"))
    }

    /// The run of a link, or 404 (the same for a malformed id as for an unknown one).
    pub(crate) async fn run(&self, id: &str) -> Result<crate::service::RunRow, ApiError> {
        if !valid_id(id) {
            return Err(ApiError::NotFound("run"));
        }
        self.service.run_row(id).await?.ok_or(ApiError::NotFound("run"))
    }

    /// The snapshot, if its analysis is done.
    pub(crate) async fn ready(&self, id: &str) -> Result<SnapshotRow, ApiError> {
        let row = self.row(id).await?;
        match row.status {
            Status::Ready => {
                // With an object store, this replica may not have the results on its disk yet.
                self.service.ensure_results(&row.sha256).await?;
                Ok(row)
            }
            Status::Failed => Err(ApiError::Failed(row.error.unwrap_or_default())),
            s => Err(ApiError::NotReady(format!("the analysis is {}", s.as_str()))),
        }
    }
}

/// The whole application, for tests in process and for `serve`.
pub(crate) fn router(state: AppState) -> Router {
    let headers = [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    ];
    let mut app = api::routes()
        .route("/", axum::routing::get(pages::home))
        .route("/s/{id}", axum::routing::get(pages::snapshot))
        .route("/r/{id}", axum::routing::get(pages::runs::run))
        .route("/compare/{a}/{b}", axum::routing::get(pages::runs::compare))
        .route("/static/{*path}", axum::routing::get(assets::serve))
        .route("/favicon.ico", axum::routing::get(assets::favicon))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(readyz))
        .route("/metrics", axum::routing::get(metrics))
        .fallback(not_found)
        .with_state(state);
    for (name, value) in headers {
        app = app.layer(SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value)));
    }
    app.layer(CompressionLayer::new()).layer(TraceLayer::new_for_http())
}

/// 200 when the database and the blob store answer, else 503 naming which does not: what a
/// load balancer asks before it sends this replica traffic.
async fn readyz(State(app): State<AppState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match app.service.ready().await {
        Ok(()) => "ready".into_response(),
        Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why.to_string()).into_response(),
    }
}

/// The Prometheus text exposition.
async fn metrics(State(app): State<AppState>) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let text = app.service.metrics().await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// Unknown paths: JSON under /api, a page elsewhere.
async fn not_found(uri: axum::http::Uri) -> axum::response::Response {
    use axum::response::IntoResponse;
    if uri.path().starts_with("/api/") {
        ApiError::NotFound("route").into_response()
    } else {
        pages::PageError(ApiError::NotFound("page")).into_response()
    }
}

/// Opens the store (cleaning what a crash left), starts the service (restarting unfinished
/// analyses) and makes the application's state: what `serve` runs, and tests in process.
pub(crate) async fn state(config: Config) -> Result<AppState, Box<dyn std::error::Error>> {
    let service = Service::open(&config).await?;
    let budget = config.memory_budget();
    tracing::info!(budget_mib = budget >> 20, "memory budget");
    let database =
        config.database_url.as_deref().map(crate::service::redact).unwrap_or_else(|| "sqlite (data folder)".into());
    let blobs = config.blob_store.clone().unwrap_or_else(|| "data folder".into());
    tracing::info!(database, blobs, "store");
    let uploads = Arc::new(tokio::sync::Semaphore::new((config.max_connections / 2).max(1)));
    Ok(AppState(Arc::new(Inner { config, service, uploads })))
}

/// Opens the store, restarts unfinished analyses, and serves until Ctrl-C or SIGTERM; then
/// waits at most 10 s for open connections (see `listen`).
pub(crate) async fn serve(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let state = state(config).await?;
    if let Some(days) = state.config.retain_days {
        state.service.start_retention(days);
    }
    let wanted = state.config.addr;
    let listener = match tokio::net::TcpListener::bind(wanted).await {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let msg = format!(
                "{wanted} is already in use (another fragscope, or another server): choose a free port with --addr, e.g. --addr 127.0.0.1:0"
            );
            return Err(msg.into());
        }
        Err(e) => return Err(format!("cannot listen on {wanted}: {e}").into()),
    };
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to find the port: a URL a browser on this machine opens.
    if addr.ip().is_unspecified() {
        println!("fragscope listening on http://127.0.0.1:{} (and on every address of this machine)", addr.port());
    } else {
        println!("fragscope listening on http://{addr}");
    }
    let header_timeout = listen::HEADER_TIMEOUT.min(Duration::from_secs(state.config.request_timeout_secs.max(1)));
    let max_connections = state.config.max_connections;
    let service = state.service.clone();
    listen::serve(listener, router(state), max_connections, header_timeout, shutdown_signal()).await;
    service.stop().await;
    service.close().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
