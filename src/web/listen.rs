//! The accept loop. axum's own `serve` sets no header-read or idle timeout and logs every
//! failed accept, so a few thousand idle or half-sent connections could hold every file
//! descriptor. Here: a cap on connections served at once, a header-read timeout that also
//! closes connections idle between requests (hyper starts it whenever it waits for a request
//! head), a log line at most once a minute while accepting fails (descriptors exhausted), and
//! a graceful stop that waits at most 10 s for open connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Failed accepts are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// How long a connection may take to send a request head, or sit idle between requests.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `stop` resolves.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    max_connections: usize,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    // Failed accepts come in bursts (each freed descriptor is taken again at once): one line
    // a minute at most, with how many failed.
    let mut logged: Option<std::time::Instant> = None;
    let mut failed = 0u64;
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !is_connection_error(&e) {
                        failed += 1;
                        if logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                            tracing::error!(error = %e, failed, "cannot accept connections (file descriptors exhausted?); retrying");
                            (logged, failed) = (Some(std::time::Instant::now()), 0);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = app.clone().map_request(|r: axum::http::Request<Incoming>| r.map(Body::new));
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!("stopping: finishing open requests");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => {
            tracing::warn!("connections still open after 10 s: closing them");
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}
