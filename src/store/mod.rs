//! The store: every file write and every SQL query. Nothing else touches the data directory.
//!
//! - `blobs`: uploads, content-addressed by sha256 ([`Blobs`]: a local folder by default, or an
//!   object store through `remote`).
//! - `meta`: snapshot and run metadata and the analysis queue, in SQLite (default) or
//!   PostgreSQL. Each upload has its own random id, name and note; uploads of the same bytes
//!   share one blob and one analysis.
//! - `results`: what an analysis leaves, by sha256 (a cache: it can be recomputed from the
//!   blob); with an object store they are uploaded there and `DATA/cache/` keeps local copies.
//!
//! Layout: `DATA/fragscope.db`, `DATA/blobs/ab/ab…`, `DATA/results/SHA256/`, `DATA/tmp/` (uploads
//! in progress; emptied at start). Crash safety: an upload is renamed into place only once
//! complete and synced, and its row is inserted after; a start removes temp files, partial
//! results, blobs no row refers to, and results of deleted snapshots.

mod blobs;
mod error;
mod meta;
mod remote;
mod results;

pub use blobs::{Blobs, LocalBlobs};
pub use error::{StoreError, io_disk_full};
pub use meta::{Added, Claim, Meta, RunRow, SnapshotRow, Status, redact};
pub use remote::{Staged, Staging};
pub use results::{Results, Written};

use std::path::PathBuf;

/// Starts writing `len` bytes of `file` at `offset` to disk without waiting for it, so that
/// a sync later has less left to write (on Linux; elsewhere that sync writes it all). It can
/// block while the disk's queue is full: call it where blocking is allowed.
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a hint on a descriptor the caller holds open; it touches none of our memory.
        unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
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
    id.len() == 32 && lower_hex(id)
}

/// True for a sha256 as the store writes it (64 lower-case hex digits).
pub fn valid_sha256(s: &str) -> bool {
    s.len() == 64 && lower_hex(s)
}

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Now, in unix seconds: the one clock of rows, leases and retention.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// What an upload is: its name and note, and the run and rank it belongs to.
#[derive(Debug, Clone, Default)]
pub struct Label {
    pub name: String,
    pub note: String,
    /// The run key (a job id) shared by a job's ranks.
    pub run_key: Option<String>,
    pub rank: Option<i64>,
}

/// A stored upload, and the secret that deletes it: given to its uploader once, kept only as
/// a hash.
pub struct Stored {
    pub added: Added,
    pub delete_key: String,
}

/// sha256 of a delete key, as hex: what the database keeps.
fn key_hash(key: &str) -> String {
    use sha2::Digest;
    crate::units::hex(&sha2::Sha256::digest(key.as_bytes()))
}

/// Compares two secrets in time that does not depend on where they differ (the server's
/// token, a delete key's hash).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What deleting an upload did.
pub struct Deleted {
    /// Its content's key.
    pub sha256: String,
    /// No other upload had the same bytes: the blob and results are gone too.
    pub last: bool,
}

/// Where the store keeps things besides the data folder.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `sqlite://…` or `postgres://…`; None: `DATA/fragscope.db`.
    pub database_url: Option<String>,
    /// `s3://bucket/prefix` (or `gs://`, `az://`); None: `DATA/blobs` and `DATA/results`.
    pub blob_store: Option<String>,
    /// The most bytes of remote blobs and results kept in `DATA/cache`.
    pub cache_bytes: u64,
}

pub struct Store {
    pub meta: Meta,
    pub blobs: Blobs,
    pub results: Results,
    tmp: PathBuf,
    /// Held while an upload joins stored bytes or a delete removes them, so neither sees the
    /// other half done (a re-upload racing the delete of the same bytes).
    gate: tokio::sync::Mutex<()>,
}

/// An upload's bytes as they arrived: its temp file, its copy staged in the object store if
/// there is one, their hash and size.
pub struct ArrivedFile {
    pub temp: PathBuf,
    pub staged: Option<Staged>,
    pub sha256: String,
    pub bytes: u64,
}

impl Store {
    /// The single-machine store: SQLite and folders under `data_dir`.
    #[cfg(test)]
    pub async fn open(data_dir: &std::path::Path) -> Result<Store, StoreError> {
        Store::open_with(data_dir, &Options::default()).await
    }

    pub async fn open_with(data_dir: &std::path::Path, options: &Options) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir)?;
        let tmp = data_dir.join("tmp");
        std::fs::create_dir_all(&tmp)?;
        let meta = match &options.database_url {
            Some(url) => Meta::connect(url).await?,
            None => Meta::open(&data_dir.join("fragscope.db")).await?,
        };
        let (blobs, results) = match &options.blob_store {
            None => (Blobs::Local(LocalBlobs::new(data_dir.join("blobs"))?), Results::new(data_dir.join("results"))?),
            Some(url) => {
                let remote = remote::Remote::from_url(url, data_dir.join("cache"), options.cache_bytes)
                    .map_err(|e| StoreError::Config(e.to_string()))?;
                let results = Results::new(remote.cache.results_dir())?;
                (Blobs::Remote(remote), results)
            }
        };
        let store = Store { meta, blobs, results, tmp, gate: tokio::sync::Mutex::new(()) };
        store.rekey_results().await?;
        Ok(store)
    }

    /// With an object store, removes this replica's cached copies of content no upload refers
    /// to any more: another replica deleted it (the bucket is emptied there, but each replica's
    /// cache is its own, and a delete must remove every copy). The content removed.
    pub async fn drop_deleted_copies(&self) -> Result<Vec<String>, StoreError> {
        let Some(remote) = self.blobs.remote() else { return Ok(Vec::new()) };
        let live: std::collections::HashSet<String> = self.meta.all_sha256().await?.into_iter().collect();
        let mut dropped = Vec::new();
        for sha in remote.cache.blob_keys()? {
            if !live.contains(&sha) {
                remote.cache.remove_blob(&sha)?;
                dropped.push(sha);
            }
        }
        for key in self.results.keys()? {
            if valid_sha256(&key) && !live.contains(&key) {
                self.results.delete_folder(&key)?;
                dropped.push(key);
            }
        }
        dropped.sort();
        dropped.dedup();
        Ok(dropped)
    }

    /// Whether the data folder takes a write now: a small file written, synced and removed
    /// (a full disk fails here, as an upload would).
    pub fn probe_disk(&self) -> std::io::Result<()> {
        use std::io::Write;
        let (path, mut file) = self.create_temp()?;
        let written = file.write_all(&[0u8; 4096]).and_then(|()| file.sync_all());
        drop(file);
        let _ = std::fs::remove_file(&path);
        written
    }

    /// A new file for an upload in progress, and its path.
    pub fn create_temp(&self) -> std::io::Result<(PathBuf, std::fs::File)> {
        let path = self.tmp.join(format!("{}.part", random_id()));
        let file = std::fs::File::create_new(&path)?;
        Ok((path, file))
    }

    /// With an object store, starts sending an upload there as it arrives (None: the local
    /// folder, or the store would not start one; then the file is sent once complete).
    pub async fn stage(&self) -> Option<Staging> {
        let remote = self.blobs.remote()?;
        match remote.stage().await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot stream the upload to the object store; it is sent once complete");
                None
            }
        }
    }

    /// Removes an upload staged in the object store that will not be kept.
    pub async fn discard_staged(&self, staged: Option<Staged>) {
        if let (Some(remote), Some(staged)) = (self.blobs.remote(), staged) {
            remote.discard(staged).await;
        }
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
        if let Some(remote) = self.blobs.remote() {
            // Uploads a replica staged and died before keeping (older than an hour: younger
            // ones may be arriving at another replica now).
            let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
            for staged in remote.staged_before(hour_ago).await? {
                remote.discard(staged).await;
            }
        }
        // Uploads of a run whose delete a stop interrupted.
        for id in self.meta.orphans().await? {
            self.delete(&id).await?;
        }
        let shas: std::collections::HashSet<String> = self.meta.all_sha256().await?.into_iter().collect();
        for sha in self.blobs.sweepable().await? {
            if !shas.contains(&sha) {
                self.blobs.delete(&sha).await?;
            }
        }
        // Results of content no upload refers to any more (a delete the stop interrupted).
        for key in self.results.keys()? {
            if !shas.contains(&key) {
                self.results.delete_folder(&key)?;
            }
        }
        Ok(())
    }

    /// Results stored under a snapshot's id by versions before uploads had their own ids move
    /// to their content's key.
    async fn rekey_results(&self) -> Result<(), StoreError> {
        for key in self.results.keys()? {
            if valid_id(&key)
                && let Some(row) = self.meta.get(&key).await?
            {
                self.results.rekey(&key, &row.sha256)?;
            }
        }
        Ok(())
    }

    /// Keeps a finished upload under a new id. Bytes stored before are not stored again (then
    /// `temp` is removed) and the new upload shares their analysis. Returns the row and
    /// whether its analysis is to be queued.
    pub async fn add_upload(&self, arrived: ArrivedFile, label: Label) -> Result<Stored, StoreError> {
        let ArrivedFile { temp, staged, sha256, bytes } = arrived;
        let delete_key = random_id();
        let key_hash = key_hash(&delete_key);
        let owner = meta::Owner { key_hash: &key_hash, run_key: label.run_key.as_deref() };
        let row = SnapshotRow {
            id: random_id(),
            sha256: sha256.clone(),
            name: label.name,
            note: label.note,
            bytes,
            status: Status::Queued,
            error: None,
            verdict: None,
            created_at: unix_now(),
            run_id: None,
            rank: label.rank,
            summary: None,
        };
        let _gate = self.gate.lock().await;
        if let Some(copied) = self.meta.insert_copy(&row, &owner).await? {
            let _ = std::fs::remove_file(&temp);
            self.discard_staged(staged).await;
            return Ok(Stored { added: copied, delete_key });
        }
        // Stored before its row: a crash between leaves a blob no row names, swept later.
        // Storing is idempotent (the key is the content's hash), so two replicas may both.
        self.blobs.commit(temp, staged, &sha256).await?;
        Ok(Stored { added: self.meta.add(&row, &owner).await?, delete_key })
    }

    /// True when `key` is the delete key given to the upload `id`.
    pub async fn owns(&self, id: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self.meta.owner(id).await?.is_some_and(|h| same_secret(&h, &key_hash(key))))
    }

    /// True when `key` is the delete key of the upload that started run `id`.
    pub async fn owns_run(&self, id: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self.meta.run_owner(id).await?.is_some_and(|h| same_secret(&h, &key_hash(key))))
    }

    /// Makes the results of `sha256` readable on this machine: a no-op for the local folder;
    /// with an object store, fetched into the cache unless there already.
    pub async fn local_results(&self, sha256: &str) -> Result<(), StoreError> {
        let Some(remote) = self.blobs.remote() else { return Ok(()) };
        let dir = self.results.path(sha256);
        if self.results.has(sha256) {
            remote.cache.touch(&dir);
            return Ok(());
        }
        Ok(remote.get_results(sha256, &dir).await?)
    }

    /// Sends the results just written on this machine to the object store, if there is one.
    pub async fn publish_results(&self, sha256: &str) -> Result<(), StoreError> {
        if let Some(remote) = self.blobs.remote() {
            remote.put_results(sha256, &self.results.path(sha256)).await?;
        }
        Ok(())
    }

    /// Deletes an upload: its row first (the link stops working at once), then, if it was the
    /// last upload of its bytes, their blob and results.
    pub async fn delete(&self, id: &str) -> Result<Option<Deleted>, StoreError> {
        let _gate = self.gate.lock().await;
        let Some((sha256, left)) = self.meta.delete(id).await? else { return Ok(None) };
        if left == 0 {
            self.results.delete(&sha256)?;
            self.blobs.delete(&sha256).await?;
        }
        Ok(Some(Deleted { sha256, last: left == 0 }))
    }

    /// Deletes a run and every upload in it; the uploads deleted, or None when there is no
    /// such run.
    pub async fn delete_run(&self, id: &str) -> Result<Option<Vec<Deleted>>, StoreError> {
        if !self.meta.delete_run(id).await? {
            return Ok(None);
        }
        let mut deleted = Vec::new();
        for row in self.meta.run_snapshots(id).await? {
            deleted.extend(self.delete(&row.id).await?);
        }
        Ok(Some(deleted))
    }
}
