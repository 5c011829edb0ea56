//! An upload arriving: its temp file, its hash and size, the copy streamed to the object store
//! as it comes, and the feed of the parse that runs while it arrives. The web layer pushes
//! chunks in and knows only HTTP; the bytes are handled here. A temp file that is not handed
//! to the queue is removed when its intake is dropped (an error, a refusal, a client gone).

use std::path::PathBuf;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::early::{Early, Feed};
use super::{Service, ServiceError, Upload};
use crate::store::{Label, Staged, Staging};

/// Why an upload could not be taken in.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// It passed the server's limit.
    #[error("the upload is larger than the server's limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// Nothing arrived.
    #[error("the upload is empty")]
    Empty,
    /// The temp file could not be written (a full disk among them).
    #[error("temp file: {0}")]
    Io(#[from] std::io::Error),
}

/// Bytes between starts of writeback while an upload arrives.
const WRITEBACK: u64 = 16 << 20;

/// An upload on its way in.
pub struct Intake {
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
    staging: Option<Staging>,
    /// And to the parse while it arrives, if one runs (dropped when it wants no more).
    feed: Option<Feed>,
    early: Option<Early>,
    /// The temp file was handed on: not removed on drop.
    kept: bool,
}

/// An upload taken in whole, waiting for its label: dropped, its temp file and staged copy go.
pub struct Arrived {
    intake: Intake,
    staged: Option<Staged>,
    sha256: String,
    service: Service,
}

impl Service {
    /// Starts taking in an upload of at most `max` bytes; `announced` (its Content-Length)
    /// lets the parse start while it arrives, where the budget allows.
    pub async fn intake(&self, max: u64, announced: Option<u64>) -> Result<Intake, ServiceError> {
        let (path, file) = self.store.create_temp().map_err(crate::store::StoreError::from)?;
        let staging = self.store.stage().await;
        let mut early = self.start_early(announced);
        let feed = early.as_mut().and_then(|e| e.feed());
        let mut intake = Intake::new(path, file, max, staging, feed);
        intake.early = early;
        Ok(intake)
    }
}

impl Intake {
    /// An intake into a temp file already made (the store makes them: [`Service::intake`]).
    pub fn new(path: PathBuf, file: std::fs::File, max: u64, staging: Option<Staging>, feed: Option<Feed>) -> Intake {
        Intake {
            file: tokio::fs::File::from_std(file),
            path,
            hasher: Sha256::new(),
            bytes: 0,
            head: Vec::new(),
            max,
            written_back: 0,
            staging,
            feed,
            early: None,
            kept: false,
        }
    }

    /// Bytes taken in so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes the next chunk: hashed, counted, capped, written, and passed on to the object
    /// store and the early parse.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), IntakeError> {
        self.bytes += chunk.len() as u64;
        if self.bytes > self.max {
            return Err(IntakeError::TooLarge { limit: self.max });
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
        self.file.write_all(&chunk).await?;
        let flushed = self.bytes / WRITEBACK * WRITEBACK;
        if flushed > self.written_back {
            self.file.flush().await?;
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

    /// The upload is whole: its hash, and its object-store copy finished.
    pub async fn finish(mut self, service: &Service) -> Result<Arrived, IntakeError> {
        // The parse sees the end of the upload.
        self.feed = None;
        tracing::debug!(bytes = self.bytes, "upload received");
        self.file.flush().await?;
        if self.bytes == 0 {
            return Err(IntakeError::Empty);
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
        let sha256 = crate::units::hex(&std::mem::take(&mut self.hasher).finalize());
        Ok(Arrived { intake: self, staged, sha256, service: service.clone() })
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
            self.abort_staging();
        }
    }
}

impl Arrived {
    /// The upload, named, for [`Service::admit`] (which consumes its temp file either way).
    pub fn labelled(mut self, label: Label) -> Upload {
        self.intake.kept = true;
        Upload {
            temp: self.intake.path.clone(),
            sha256: std::mem::take(&mut self.sha256),
            bytes: self.intake.bytes,
            head: std::mem::take(&mut self.intake.head),
            label,
            staged: self.staged.take(),
            early: self.intake.early.take(),
        }
    }
}

impl Drop for Arrived {
    fn drop(&mut self) {
        if let Some(staged) = self.staged.take() {
            let service = self.service.clone();
            tokio::spawn(async move { service.discard_staged(Some(staged)).await });
        }
    }
}

/// Starts writing `len` bytes at `offset` to disk without waiting for it, so that the sync
/// once the upload is whole has only the tail left to write (on Linux; elsewhere that sync
/// writes it all). On a blocking thread, with a descriptor of its own: the call can block while
/// the disk's queue is full.
async fn start_writeback(file: &tokio::fs::File, offset: u64, len: u64) {
    if let Ok(own) = file.try_clone().await {
        let own = own.into_std().await;
        tokio::task::spawn_blocking(move || crate::store::start_writeback(&own, offset, len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writeback is started a 16 MiB stretch at a time as the upload arrives, and the file
    /// holds every byte in order, hashed as sent; dropped unfinished, the file goes.
    #[tokio::test]
    async fn an_upload_is_written_back_as_it_arrives_and_a_dropped_one_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upload");
        let file = std::fs::File::create(&path).unwrap();
        let mut intake = Intake::new(path.clone(), file, u64::MAX, None, None);
        let mut sent = Vec::new();
        for k in 0..41u32 {
            // Chunks of an odd size, so that stretch ends fall inside them.
            let chunk: Vec<u8> = (0..(1 << 20) + 7).map(|i: u32| (i.wrapping_mul(31) ^ k) as u8).collect();
            sent.extend_from_slice(&chunk);
            intake.write(Bytes::from(chunk)).await.unwrap();
        }
        assert_eq!(intake.written_back, 2 * WRITEBACK, "two whole stretches of {} bytes", sent.len());
        intake.file.flush().await.unwrap();
        assert_eq!(intake.bytes(), sent.len() as u64);
        let hex: String = Sha256::digest(&sent).iter().map(|b| format!("{b:02x}")).collect();
        let got: String = intake.hasher.clone().finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, hex);
        assert!(std::fs::read(&path).unwrap() == sent, "the file differs from what was sent");
        drop(intake);
        assert!(!path.exists(), "an intake dropped unfinished removes its temp file");
        let file = std::fs::File::create(&path).unwrap();
        let mut small = Intake::new(path.clone(), file, 4, None, None);
        assert!(matches!(small.write(Bytes::from_static(b"12345")).await, Err(IntakeError::TooLarge { limit: 4 })));
    }
}
