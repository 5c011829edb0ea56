//! Receiving an upload over HTTP: a raw body or a form, `Expect: 100-continue`, a body drained
//! on refusal, bounded form fields, a pace to keep. The bytes go into the service's intake
//! (`service/intake.rs`), never held whole in memory, and are cut off with 413 the moment they
//! pass the cap.
//! Accepts a raw body (`curl --data-binary @f`, `requests.post(url, data=f)`) or a multipart
//! form with a file field (`curl -F file=@f`, the browser's form).

use axum::extract::{FromRequest, Multipart, Request};
use bytes::Bytes;
use futures_util::StreamExt;

use super::error::ApiError;
use crate::service::{Arrived, Intake, Service};

/// The text fields of an upload form, each bounded in size (413 past it) and in time.
#[derive(Default)]
pub(crate) struct Form {
    pub(crate) filename: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) note: Option<String>,
    pub(crate) run: Option<String>,
    pub(crate) rank: Option<String>,
}

/// The most bytes a form's text field may hold, by field name (others: [`OTHER_FIELD`]).
fn field_limit(name: &str) -> usize {
    match name {
        "note" => 16 << 10,
        "name" | "run" => 1 << 10,
        "rank" => 32,
        _ => OTHER_FIELD,
    }
}

/// Most a form may hold beside its file: the text fields and the parts' headers, a generous
/// bound (an announced form longer than the upload limit and this is refused unread).
const FORM_FIELDS: u64 = 1 << 20;

/// Fields the server does not read are skipped, up to this size each.
const OTHER_FIELD: usize = 16 << 10;

/// Slowest average an upload may keep after its grace period (`--request-timeout`).
const MIN_BYTES_PER_SEC: u64 = 64 << 10;

/// The intake, and the pace an upload must keep.
struct Spool {
    started: std::time::Instant,
    grace: std::time::Duration,
    intake: Intake,
}

impl Spool {
    async fn write(&mut self, chunk: Bytes) -> Result<(), ApiError> {
        let bytes = self.intake.bytes() + chunk.len() as u64;
        let elapsed = self.started.elapsed();
        if elapsed > self.grace && bytes < MIN_BYTES_PER_SEC * elapsed.as_secs() {
            return Err(ApiError::Timeout(format!(
                "the upload is arriving slower than {} KiB/s",
                MIN_BYTES_PER_SEC >> 10
            )));
        }
        Ok(self.intake.write(chunk).await?)
    }
}

/// Receives the upload into `intake` (dropped on an error: its temp file goes). A client that
/// sends nothing for `idle`, or averages under 64 KiB/s once `idle` has passed, is cut off
/// (408): a slow sender holds a connection, never an analysis slot (those are taken only once
/// the whole upload is here).
fn too_slow(idle: std::time::Duration) -> ApiError {
    ApiError::Timeout(format!("the upload sent nothing for {} s", idle.as_secs()))
}

pub(crate) async fn receive(
    request: Request,
    (service, intake): (&Service, Intake),
    max: u64,
    idle: std::time::Duration,
) -> Result<(Arrived, Form), ApiError> {
    let headers = request.headers();
    // A form holds the file and a few bounded text fields.
    let room = if is_form(headers) { max.saturating_add(FORM_FIELDS) } else { max };
    if let Some(announced) = announced(headers).filter(|&a| a > room) {
        let refused = ApiError::TooLarge(format!(
            "the upload is {announced} bytes, larger than the server's limit of {max} bytes"
        ));
        // A client that waits for "100 Continue" (curl does for big files) sends nothing more.
        let waits =
            headers.get(axum::http::header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if !waits {
            drain_body(&mut request.into_body().into_data_stream()).await;
        }
        return Err(refused);
    }
    let mut spool = Spool { started: std::time::Instant::now(), grace: idle, intake };
    let form = receive_into(request, &mut spool, idle).await?;
    Ok((spool.intake.finish(service).await?, form))
}

/// The size the client announced (`Content-Length`), if any.
pub(crate) fn announced(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse().ok())
}

fn is_form(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"))
}

/// Writes the body (or the form's file field) to `spool`; returns the form's text fields.
async fn receive_into(request: Request, spool: &mut Spool, idle: std::time::Duration) -> Result<Form, ApiError> {
    if !is_form(request.headers()) {
        let mut body = request.into_body().into_data_stream();
        while let Some(chunk) = tokio::time::timeout(idle, body.next()).await.map_err(|_| too_slow(idle))? {
            let chunk: Bytes = chunk.map_err(|e| ApiError::BadRequest(format!("the upload was cut off: {e}")))?;
            if let Err(e) = spool.write(chunk).await {
                if matches!(e, ApiError::TooLarge(_)) {
                    drain_body(&mut body).await;
                }
                return Err(e);
            }
        }
        return Ok(Form::default());
    }
    let mut form = Multipart::from_request(request, &()).await.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let got = read_form(&mut form, spool, idle).await;
    if let Err(ApiError::TooLarge(_)) = got {
        drain_form(&mut form).await;
    }
    got
}

/// What a form may spend, in all, on everything but its file: the parts' headers and the text
/// fields (a few KiB). Each read waiting at most `idle` does not bound them: one byte every
/// 2 s inside a note never stalls a read, and held its connection for good.
struct Rest {
    left: std::time::Duration,
    idle: std::time::Duration,
}

impl Rest {
    /// Runs `read`, charging its time; 408 once the form's whole allowance is spent.
    async fn within<T>(&mut self, read: impl std::future::Future<Output = T>) -> Result<T, ApiError> {
        let started = tokio::time::Instant::now();
        let got = tokio::time::timeout(self.left, read).await.map_err(|_| {
            ApiError::Timeout(format!(
                "the form's fields other than the file took more than {} s to arrive",
                self.idle.as_secs()
            ))
        });
        self.left = self.left.saturating_sub(started.elapsed());
        got
    }
}

/// Writes the form's file field to `spool`; returns its text fields.
async fn read_form(form: &mut Multipart, spool: &mut Spool, idle: std::time::Duration) -> Result<Form, ApiError> {
    let (mut form_fields, mut got_file) = (Form::default(), false);
    let mut rest = Rest { left: idle, idle };
    while let Some(mut field) = rest
        .within(tokio::time::timeout(idle, form.next_field()))
        .await?
        .map_err(|_| too_slow(idle))?
        .map_err(|e| ApiError::BadRequest(e.body_text()))?
    {
        let field_name = field.name().unwrap_or("").to_string();
        if field.file_name().is_some() || field_name == "file" {
            if got_file {
                return Err(ApiError::BadRequest("one snapshot per upload: the form has several files".into()));
            }
            got_file = true;
            form_fields.filename = field.file_name().map(|s| s.chars().take(1024).collect());
            while let Some(chunk) = next_chunk(&mut field, idle).await? {
                spool.write(chunk).await?;
            }
            continue;
        }
        let text = rest.within(text_field(&mut field, &field_name, idle)).await??;
        match field_name.as_str() {
            "name" => form_fields.name = Some(text),
            "note" => form_fields.note = Some(text),
            "run" => form_fields.run = Some(text),
            "rank" => form_fields.rank = Some(text),
            _ => {}
        }
    }
    if !got_file {
        return Err(ApiError::BadRequest("the form has no file field".into()));
    }
    Ok(form_fields)
}

const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);
const DRAIN_BYTES: u64 = 1 << 30;

/// A refused upload is read on and thrown away, for at most `DRAIN_TIME` and `DRAIN_BYTES`,
/// before the 413 goes out: a server that answers and closes while the client is still
/// sending makes the client's side see a reset, and curl or requests then report "connection
/// reset" instead of the answer that names the limit (nginx's "lingering close" is the same).
/// Past the bounds the connection is closed as before. Every read of a drain waits only until
/// its deadline.
struct Drain {
    until: tokio::time::Instant,
    left: u64,
}

impl Drain {
    fn new() -> Drain {
        Drain { until: tokio::time::Instant::now() + DRAIN_TIME, left: DRAIN_BYTES }
    }

    /// Waits for `next` within the deadline; None when it ends, fails or is too late.
    async fn read<T, E>(&self, next: impl std::future::Future<Output = Option<Result<T, E>>>) -> Option<T> {
        tokio::time::timeout_at(self.until, next).await.ok()??.ok()
    }

    /// Counts a chunk thrown away; false once the byte bound is reached.
    fn take(&mut self, chunk: Bytes) -> bool {
        self.left = self.left.saturating_sub(chunk.len() as u64);
        self.left > 0
    }
}

/// Reads what is left of a refused raw body.
async fn drain_body(body: &mut axum::body::BodyDataStream) {
    let mut drain = Drain::new();
    while let Some(chunk) = drain.read(body.next()).await {
        if !drain.take(chunk) {
            return;
        }
    }
}

/// Reads what is left of a refused form: the rest of the field that was being read (multer
/// skips it when asked for the next), then the others.
async fn drain_form(form: &mut Multipart) {
    let mut drain = Drain::new();
    while let Some(mut field) = drain.read(async { form.next_field().await.transpose() }).await {
        while let Some(chunk) = drain.read(async { field.chunk().await.transpose() }).await {
            if !drain.take(chunk) {
                return;
            }
        }
    }
}

async fn next_chunk(
    field: &mut axum::extract::multipart::Field<'_>,
    idle: std::time::Duration,
) -> Result<Option<Bytes>, ApiError> {
    tokio::time::timeout(idle, field.chunk())
        .await
        .map_err(|_| too_slow(idle))?
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

/// Reads a text field chunk by chunk under the same stall timeout as the file, refusing it
/// (413) the moment it passes its limit.
async fn text_field(
    field: &mut axum::extract::multipart::Field<'_>,
    field_name: &str,
    idle: std::time::Duration,
) -> Result<String, ApiError> {
    let max = field_limit(field_name);
    let mut bytes = Vec::new();
    while let Some(chunk) = next_chunk(field, idle).await? {
        if bytes.len() + chunk.len() > max {
            let shown: String = field_name.chars().filter(|c| c.is_ascii_graphic()).take(40).collect();
            return Err(ApiError::TooLarge(format!(
                "the form field `{shown}` is longer than its limit of {max} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
