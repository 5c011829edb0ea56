//! The store: every file write and every SQL query. Nothing else touches the data directory.
//!
//! - `blobs`: uploads, content-addressed by sha256 ([`BlobStore`], local by default).
//! - `meta`: snapshot metadata in SQLite.
//! - `results`: what an analysis leaves (a cache: it can be recomputed from the blob).
//!
//! Layout: `DATA/fragscope.db`, `DATA/blobs/ab/ab…`, `DATA/results/ID/`, `DATA/tmp/` (uploads
//! in progress; emptied at start). Crash safety: an upload is renamed into place only once
//! complete and synced, and its row is inserted after; a start removes temp files, partial
//! results, blobs no row refers to, and results of deleted snapshots.

mod blobs;
mod meta;
mod results;

pub use blobs::{BlobStore, LocalBlobs};
pub use meta::{Meta, SnapshotRow, Status};
pub use results::{Results, Written};

use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Db(#[from] sqlx::Error),
    #[error("file error")]
    Io(#[from] std::io::Error),
    #[error("stored results are unreadable: {0}")]
    Corrupt(String),
    #[error("background task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// A new random id: 128 bits from the OS as 32 hex digits, unguessable, not derived from the
/// content (knowing a file must not reveal its link).
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// True for ids `random_id` makes; anything else never reaches a path.
pub fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub struct Store {
    pub meta: Meta,
    pub blobs: Arc<dyn BlobStore>,
    pub results: Results,
    tmp: PathBuf,
}

impl Store {
    pub async fn open(data_dir: &std::path::Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir)?;
        let tmp = data_dir.join("tmp");
        std::fs::create_dir_all(&tmp)?;
        let meta = Meta::open(&data_dir.join("fragscope.db")).await?;
        let blobs = Arc::new(LocalBlobs::new(data_dir.join("blobs"))?);
        let results = Results::new(data_dir.join("results"))?;
        Ok(Store { meta, blobs, results, tmp })
    }

    /// A new file for an upload in progress, and its path.
    pub fn create_temp(&self) -> std::io::Result<(PathBuf, std::fs::File)> {
        let path = self.tmp.join(format!("{}.part", random_id()));
        let file = std::fs::File::create_new(&path)?;
        Ok((path, file))
    }

    /// Removes an upload in progress that will not be kept.
    pub fn discard_temp(&self, temp: &std::path::Path) {
        if temp.starts_with(&self.tmp) {
            let _ = std::fs::remove_file(temp);
        }
    }

    /// Removes what a crash can leave behind.
    pub async fn clean_after_crash(&self) -> Result<(), StoreError> {
        for e in std::fs::read_dir(&self.tmp)? {
            std::fs::remove_file(e?.path())?;
        }
        self.results.clean_partial()?;
        let shas: std::collections::HashSet<String> = self.meta.all_sha256().await?.into_iter().collect();
        for sha in self.blobs.list()? {
            if !shas.contains(&sha) {
                self.blobs.delete(&sha)?;
            }
        }
        // Results of snapshots whose row is gone (a delete the stop interrupted).
        let ids: std::collections::HashSet<String> = self.meta.all_ids().await?.into_iter().collect();
        for id in self.results.ids()? {
            if !ids.contains(&id) {
                self.results.delete(&id)?;
            }
        }
        Ok(())
    }

    /// Keeps a finished upload: the existing snapshot if the same bytes were uploaded before
    /// (then `temp` is removed), else a new queued one. Returns the row and whether it is new.
    pub async fn add_upload(
        &self,
        temp: PathBuf,
        sha256: String,
        bytes: u64,
        name: String,
        note: String,
    ) -> Result<(SnapshotRow, bool), StoreError> {
        if let Some(row) = self.meta.by_sha256(&sha256).await? {
            let _ = std::fs::remove_file(&temp);
            return Ok((row, false));
        }
        let blobs = self.blobs.clone();
        let sha = sha256.clone();
        tokio::task::spawn_blocking(move || blobs.commit(&temp, &sha)).await??;
        let row = SnapshotRow {
            id: random_id(),
            sha256: sha256.clone(),
            name,
            note,
            bytes,
            status: Status::Queued,
            error: None,
            verdict: None,
            created_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        };
        match self.meta.insert(&row).await {
            Ok(()) => Ok((row, true)),
            // The same bytes, uploaded at the same moment by someone else: theirs won.
            Err(e) => match self.meta.by_sha256(&sha256).await? {
                Some(existing) => Ok((existing, false)),
                None => Err(e),
            },
        }
    }

    /// Deletes a snapshot: its row first (the link stops working at once), then its files.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let Some(row) = self.meta.get(id).await? else { return Ok(false) };
        self.meta.delete(id).await?;
        self.results.delete(id)?;
        if self.meta.by_sha256(&row.sha256).await?.is_none() {
            self.blobs.delete(&row.sha256)?;
        }
        Ok(true)
    }
}
