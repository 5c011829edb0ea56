//! Receiving an upload: streamed to a temp file while hashed and counted, never held whole in
//! memory, and cut off with 413 the moment it passes the cap (the store then removes the temp
//! file).
//! Accepts a raw body (`curl --data-binary @f`, `requests.post(url, data=f)`) or a multipart
//! form with a file field (`curl -F file=@f`, the browser's form).

use std::path::PathBuf;

use axum::extract::{FromRequest, Multipart, Request};
use bytes::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::error::ApiError;

pub(crate) struct Received {
    pub(crate) temp: PathBuf,
    pub sha256: String,
    pub(crate) bytes: u64,
    /// The first bytes, to sniff the format without reading the file again.
    pub(crate) head: Vec<u8>,
    /// From a multipart form: the file's name and the text fields.
    pub(crate) form: Form,
    /// The copy sent to the object store as it arrived, if there is one.
    pub(crate) staged: Option<crate::service::Staged>,
}

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

/// A failed write of the temp file: 507 when the disk is full.
fn temp_error(e: std::io::Error) -> ApiError {
    if crate::service::io_disk_full(&e) { ApiError::DiskFull } else { ApiError::Internal(format!("temp file: {e}")) }
}

/// Slowest average an upload may keep after its grace period (`--request-timeout`).
const MIN_BYTES_PER_SEC: u64 = 64 << 10;

/// Bytes between starts of writeback while an upload arrives.
const WRITEBACK: u64 = 16 << 20;

/// Starts writing `len` bytes at `offset` to disk without waiting for it, so that the sync
/// once the upload is whole has only the tail left to write (on Linux; elsewhere that sync
/// writes it all). On a blocking thread, with a descriptor of its own: the call can block while
/// the disk's queue is full.
async fn start_writeback(file: &tokio::fs::File, offset: u64, len: u64) {
    if let Ok(own) = file.try_clone().await {
        let own = own.into_std().await;
        tokio::task::spawn_blocking(move || crate::service::start_writeback(&own, offset, len));
    }
}

/// Writes chunks to the temp file, hashing, counting and capping.
struct Spool {
    started: std::time::Instant,
    grace: std::time::Duration,
    file: tokio::fs::File,
    path: PathBuf,
    hasher: Sha256,
    bytes: u64,
    head: Vec<u8>,
    max: u64,
    /// Bytes whose writeback has been started.
    written_back: u64,
    /// Also sends the bytes to the object store as they arrive, so that the blob is there
    /// when the last byte is (dropped on a failed write: the file is then sent once whole).
    staging: Option<crate::service::Staging>,
    /// And to the parse while it arrives, if one runs (dropped when it wants no more).
    feed: Option<crate::service::early::Feed>,
}

impl Spool {
    fn new(
        path: PathBuf,
        file: std::fs::File,
        max: u64,
        grace: std::time::Duration,
        (staging, feed): (Option<crate::service::Staging>, Option<crate::service::early::Feed>),
    ) -> Spool {
        let file = tokio::fs::File::from_std(file);
        Spool {
            started: std::time::Instant::now(),
            grace,
            file,
            path,
            hasher: Sha256::new(),
            bytes: 0,
            head: Vec::new(),
            max,
            written_back: 0,
            staging,
            feed,
        }
    }

    async fn write(&mut self, chunk: Bytes) -> Result<(), ApiError> {
        self.bytes += chunk.len() as u64;
        let elapsed = self.started.elapsed();
        if elapsed > self.grace && self.bytes < MIN_BYTES_PER_SEC * elapsed.as_secs() {
            return Err(ApiError::Timeout(format!(
                "the upload is arriving slower than {} KiB/s",
                MIN_BYTES_PER_SEC >> 10
            )));
        }
        if self.bytes > self.max {
            return Err(ApiError::TooLarge(format!(
                "the upload is larger than the server's limit of {} bytes",
                self.max
            )));
        }
        if self.head.len() < 64 {
            self.head.extend_from_slice(&chunk[..chunk.len().min(64 - self.head.len())]);
        }
        self.hasher.update(&chunk);
        if let Some(staging) = self.staging.as_mut()
            && let Err(e) = staging.write(&chunk).await
        {
            tracing::warn!(error = %e, "streaming the upload to the object store failed; it is sent once complete");
            self.abort_staging();
        }
        if let Some(feed) = self.feed.as_mut()
            && !feed.send(chunk.clone(), &self.head).await
        {
            self.feed = None;
        }
        self.file.write_all(&chunk).await.map_err(temp_error)?;
        let flushed = self.bytes / WRITEBACK * WRITEBACK;
        if flushed > self.written_back {
            self.file.flush().await.map_err(temp_error)?;
            start_writeback(&self.file, self.written_back, flushed - self.written_back).await;
            self.written_back = flushed;
        }
        Ok(())
    }

    /// Gives up the object-store copy (in the background: the caller answers at once).
    fn abort_staging(&mut self) {
        if let Some(staging) = self.staging.take() {
            tokio::spawn(staging.abort());
        }
    }

    async fn finish(&mut self, form: Form) -> Result<Received, ApiError> {
        // The parse sees the end of the upload.
        self.feed = None;
        tracing::debug!(bytes = self.bytes, "upload received");
        self.file.flush().await.map_err(temp_error)?;
        if self.bytes == 0 {
            return Err(ApiError::BadRequest("the upload is empty".into()));
        }
        let staged = match self.staging.take() {
            None => None,
            Some(staging) => match staging.finish().await {
                Ok(staged) => Some(staged),
                Err(e) => {
                    tracing::warn!(error = %e, "finishing the upload in the object store failed; it is sent again whole");
                    None
                }
            },
        };
        let sha256 = std::mem::take(&mut self.hasher).finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(Received {
            staged,
            temp: self.path.clone(),
            sha256,
            bytes: self.bytes,
            head: std::mem::take(&mut self.head),
            form,
        })
    }
}

/// Receives the upload into `temp` (a file the store made; on an error the caller has the
/// store discard it). A client that
/// sends nothing for `idle`, or averages under 64 KiB/s once `idle` has passed, is cut off
/// (408): a slow sender holds a connection, never an analysis slot (those are taken only once
/// the whole upload is here).
fn too_slow(idle: std::time::Duration) -> ApiError {
    ApiError::Timeout(format!("the upload sent nothing for {} s", idle.as_secs()))
}

pub(crate) async fn receive(
    request: Request,
    temp: (PathBuf, std::fs::File),
    also: (Option<crate::service::Staging>, Option<crate::service::early::Feed>),
    max: u64,
    idle: std::time::Duration,
) -> Result<Received, ApiError> {
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
    let mut spool = Spool::new(temp.0, temp.1, max, idle, also);
    let got = match receive_into(request, &mut spool, idle).await {
        Ok(form) => spool.finish(form).await,
        Err(e) => Err(e),
    };
    if got.is_err() {
        spool.abort_staging();
    }
    got
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Writeback is started a 16 MiB stretch at a time as the upload arrives, and the file
    /// holds every byte in order, hashed as sent.
    #[tokio::test]
    async fn a_spooled_upload_is_written_back_as_it_arrives_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upload");
        let file = std::fs::File::create(&path).unwrap();
        let mut spool = Spool::new(path.clone(), file, u64::MAX, std::time::Duration::from_secs(60), (None, None));
        let mut sent = Vec::new();
        for k in 0..41u32 {
            // Chunks of an odd size, so that stretch ends fall inside them.
            let chunk: Vec<u8> = (0..(1 << 20) + 7).map(|i: u32| (i.wrapping_mul(31) ^ k) as u8).collect();
            sent.extend_from_slice(&chunk);
            spool.write(Bytes::from(chunk)).await.unwrap();
        }
        assert_eq!(spool.written_back, 2 * WRITEBACK, "two whole stretches of {} bytes", sent.len());
        let got = spool.finish(Form::default()).await.unwrap();
        assert_eq!(got.bytes, sent.len() as u64);
        let hex: String = Sha256::digest(&sent).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got.sha256, hex);
        assert!(std::fs::read(&path).unwrap() == sent, "the file differs from what was sent");
    }
}
