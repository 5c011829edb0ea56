//! One error type for the API, rendered once: a status code and `{"error", "detail"}`.
//! Only this layer knows status codes; store failures are logged, not sent.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::service::IngestError;

#[derive(Debug)]
pub(crate) enum ApiError {
    NotFound(&'static str),
    BadRequest(String),
    Unauthorized,
    /// A token was given, but not the server's.
    WrongToken,
    /// A delete without `--token` needs the upload's delete key.
    NeedsKey,
    /// A delete key was given, but not this upload's (or run's).
    WrongKey,
    TooLarge(String),
    /// The client stopped sending.
    Timeout(String),
    UnsupportedMedia(String),
    /// The bytes were read but are not a memory snapshot.
    NotASnapshot(String),
    /// Reading it would pass the analysis memory budget (422).
    OverBudget(String),
    /// The analysis has not finished (or failed): says which.
    NotReady(String),
    Failed(String),
    /// The server's disk is full: writes wait, reads still work.
    DiskFull,
    /// Too many of something heavy at once (simulations): try again shortly.
    Busy(String),
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            ApiError::NotFound(what) => (StatusCode::NOT_FOUND, "not_found", format!("no such {what}")),
            ApiError::BadRequest(d) => (StatusCode::BAD_REQUEST, "bad_request", d.clone()),
            ApiError::Unauthorized => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "this needs `Authorization: Bearer <token>`".into())
            }
            ApiError::WrongToken => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the token given is not this server's (`--token`): check it for typos".into(),
            ),
            ApiError::NeedsKey => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "deleting needs the delete key the upload's answer gave (send it as `X-Fragscope-Key`), \
                 or the server's token"
                    .into(),
            ),
            ApiError::WrongKey => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "the delete key given is not this upload's (a run is deleted with the key of the upload that \
                 started it)"
                    .into(),
            ),
            ApiError::TooLarge(d) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large", d.clone()),
            ApiError::Timeout(d) => (StatusCode::REQUEST_TIMEOUT, "timeout", d.clone()),
            ApiError::UnsupportedMedia(d) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_format", d.clone()),
            ApiError::NotASnapshot(d) => (StatusCode::UNPROCESSABLE_ENTITY, "not_a_snapshot", d.clone()),
            ApiError::OverBudget(d) => (StatusCode::UNPROCESSABLE_ENTITY, "over_memory_budget", d.clone()),
            ApiError::NotReady(d) => (StatusCode::CONFLICT, "not_ready", d.clone()),
            ApiError::Failed(d) => (StatusCode::UNPROCESSABLE_ENTITY, "analysis_failed", d.clone()),
            ApiError::DiskFull => (
                StatusCode::INSUFFICIENT_STORAGE,
                "disk_full",
                "the server's disk is full: nothing can be stored until space is freed (existing links still work)"
                    .into(),
            ),
            ApiError::Busy(d) => (StatusCode::SERVICE_UNAVAILABLE, "busy", d.clone()),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "something went wrong on the server; it is logged".into(),
            ),
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.parts().0
    }

    pub(crate) fn detail(&self) -> String {
        self.parts().2
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = %e, "internal error");
        }
        let (status, code, detail) = self.parts();
        let mut r = (status, Json(json!({"error": code, "detail": detail}))).into_response();
        // A refused or cut-off upload may leave part of its body unread (past the drain's
        // bounds, or a form's last boundary): the connection is closed after the answer, and
        // says so, so that a client does not send its next request on it and see a reset.
        if matches!(status, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT) {
            r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        r
    }
}

impl From<crate::service::StoreError> for ApiError {
    fn from(e: crate::service::StoreError) -> Self {
        if e.is_disk_full() {
            tracing::error!(error = %e, "the disk is full");
            return ApiError::DiskFull;
        }
        ApiError::Internal(e.with_sources())
    }
}

/// An upload that could not be taken in: 413 past the limit, 507 on a full disk.
impl From<crate::service::IntakeError> for ApiError {
    fn from(e: crate::service::IntakeError) -> Self {
        use crate::service::IntakeError;
        match e {
            IntakeError::TooLarge { .. } => ApiError::TooLarge(e.to_string()),
            IntakeError::Empty => ApiError::BadRequest(e.to_string()),
            IntakeError::Io(io) if crate::service::io_disk_full(&io) => ApiError::DiskFull,
            IntakeError::Io(io) => ApiError::Internal(format!("temp file: {io}")),
        }
    }
}

/// What a refused upload answers: the reader's message, with its byte offset.
impl From<crate::service::ServiceError> for ApiError {
    fn from(e: crate::service::ServiceError) -> Self {
        use crate::service::ServiceError;
        match e {
            ServiceError::Ingest(e) => e.into(),
            ServiceError::Store(e) => e.into(),
            ServiceError::Missing(what) => ApiError::NotFound(what),
            ServiceError::Invalid(e) => ApiError::BadRequest(e),
            e @ ServiceError::Internal { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        let msg = e.to_string();
        match &e {
            _ if e.is_over_limit() => ApiError::TooLarge(msg),
            _ if e.is_over_budget() => ApiError::OverBudget(msg),
            IngestError::Read { .. } | IngestError::Empty => ApiError::BadRequest(msg),
            IngestError::Unsupported(_) => ApiError::UnsupportedMedia(msg),
            IngestError::Model { .. } => ApiError::NotASnapshot(msg),
            IngestError::Io(_) => ApiError::Internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_507_and_other_store_failures_500() {
        let full = crate::service::StoreError::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(ApiError::from(full).status(), StatusCode::INSUFFICIENT_STORAGE);
        let other = crate::service::StoreError::Io(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert_eq!(ApiError::from(other).status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
