//! The service: what the server does, without HTTP. It owns the analysis queue ([`worker`]),
//! the cache of parsed snapshots ([`loaded`]) and the admission of uploads (dedupe, sniff,
//! check within the memory budget, store, enqueue). Handlers parse a request, call one
//! function here, and shape the answer; tests call these functions directly.
//!
//! It is also the seam for other storage back ends: everything below goes through [`Store`].

mod budget;
pub mod early;
mod health;
mod intake;
pub mod loaded;
mod lookup;
pub mod metrics;
mod prepare;
mod retention;
pub mod runs;
mod views;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use crate::ingest;
use crate::store::Store;
pub use intake::{Arrived, Intake, IntakeError};
pub use views::{ActiveBy, ActiveQuery, PinnersAt};

// What the web layer renders and names, re-exported so that it reaches the lower stages only
// through this door (the layering test holds it to that).
pub use crate::analysis::breakdown::{Breakdown, Moment};
pub use crate::analysis::categories::Category;
pub use crate::analysis::compare::Comparison;
pub use crate::analysis::flame::Flame;
pub use crate::analysis::phases::Phase;
pub use crate::analysis::timeline::{Downsampled, SERIES};
pub use crate::analysis::verdict::{self, DiagnosisVerdict, Standing};
pub use crate::analysis::{Analysis, DeviceAnalysis};
pub use crate::ingest::IngestError;
pub use crate::simulate::Settings as SimulateSettings;
// What the web layer needs of the store's types, through its one door.
pub(crate) use crate::store::same_secret;
pub use crate::store::{Label, RunRow, SnapshotRow, Status, StoreError, io_disk_full, redact, valid_id};
use loaded::{Entry, Loaded};
use worker::Worker;

/// Uploads up to this size are read through before the answer, so a file that is no snapshot
/// gets its 4xx at once; larger ones are checked by their first bytes, then analysed in the
/// background.
pub const CHECK_BEFORE_ANSWER: u64 = 32 << 20;

/// How much the service may take: analyses at once, parsed snapshots kept, and the memory for
/// both.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub workers: usize,
    pub loaded: usize,
    pub memory: u64,
}

/// Why the service could not do what was asked. The web layer maps these to HTTP once.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The upload is not a snapshot we can read (the reader's or the model's message).
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Something asked for is not there (a device, an event past the end).
    #[error("no such {0}")]
    Missing(&'static str),
    /// A request that cannot be answered as asked.
    #[error("{0}")]
    Invalid(String),
    /// A background task died, or the runtime is shutting down: what was being done, and why.
    #[error("{doing}: {source}")]
    Internal {
        /// What was being done.
        doing: &'static str,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ServiceError {
    /// A background task or a semaphore that failed while `doing`.
    pub fn internal(doing: &'static str) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> ServiceError {
        move |source| ServiceError::Internal { doing, source }
    }
}

/// An upload received whole into a temp file of the store.
pub struct Upload {
    pub temp: PathBuf,
    pub sha256: String,
    pub bytes: u64,
    /// The file's first bytes, for sniffing.
    pub head: Vec<u8>,
    /// Its name and note, and its run and rank.
    pub label: Label,
    /// Its copy sent to the object store as it arrived, if there is one.
    pub staged: Option<crate::store::Staged>,
    /// Its parse while it arrived, if one ran (see [`early`]).
    pub early: Option<early::Early>,
}

/// The answer to an upload: its snapshot (a new id either way), and whether the same bytes
/// were stored before (then it shares their analysis).
pub struct Admitted {
    pub row: SnapshotRow,
    pub duplicate: bool,
    /// Deletes this upload (and its run, when `made_run`); given once, kept only as a hash.
    pub delete_key: String,
    /// The upload started its run.
    pub made_run: bool,
    /// The same bytes had failed before and are queued again.
    pub retried: bool,
}

#[derive(Clone)]
pub struct Service {
    store: Arc<Store>,
    worker: Worker,
    pub loaded: Arc<Loaded>,
    pub counters: Arc<metrics::Counters>,
}

impl Service {
    /// Opens the store (cleaning what a crash left) and starts the service (restarting
    /// unfinished analyses) as `config` says.
    pub async fn open(config: &crate::config::Config) -> Result<Service, Box<dyn std::error::Error>> {
        let options = crate::store::Options {
            database_url: config.database_url.clone(),
            blob_store: config.blob_store.clone(),
            cache_bytes: config.cache_size,
        };
        let store = Arc::new(Store::open_with(&config.data_dir, &options).await?);
        store.clean_after_crash().await?;
        let leases =
            worker::Leases { lease: std::time::Duration::from_secs(config.lease_seconds.max(3)), ..Default::default() };
        let sizes =
            Sizes { workers: config.analysis_workers, loaded: config.loaded_snapshots, memory: config.memory_budget() };
        Ok(Service::start(store, sizes, leases).await?)
    }

    /// Starts the queue over `store`: three quarters of `memory` for analyses at work (less what
    /// two checks of small uploads may take), a quarter for parsed snapshots kept for queries.
    /// Analyses a stop interrupted are queued again.
    pub async fn start(
        store: Arc<Store>,
        Sizes { workers, loaded, memory }: Sizes,
        leases: worker::Leases,
    ) -> Result<Service, StoreError> {
        let counters = Arc::new(metrics::Counters::default());
        let cache = Arc::new(Loaded::new(loaded, memory / 4, counters.clone()).within(memory));
        // The two checks of small uploads (see `check`) are carved out of the analyses' share.
        let checks = (2 * ingest::memory_estimate(CHECK_BEFORE_ANSWER, b"")).min(memory / 4);
        // With SQLite this server is the only replica: the leases its last run held are dead.
        let freed = store.meta.release_all().await?;
        if freed > 0 {
            tracing::info!(freed, "analyses interrupted by a stop: running them again");
        }
        let budget = budget::Budget::new(memory / 4 * 3 - checks);
        let worker = Worker::start(store.clone(), cache.clone(), counters.clone(), workers, budget, leases);
        if store.blobs.remote().is_some() {
            tokio::spawn(drop_deleted_copies(store.clone(), cache.clone()));
        }
        Ok(Service { store, worker, loaded: cache, counters })
    }

    /// Takes an upload under a new id. Bytes stored before are not checked or analysed again;
    /// else it sniffs them, reads small ones through (within the analysis budget) so bad input
    /// fails now, stores them and queues their analysis. The temp file is consumed either way.
    pub async fn admit(&self, mut up: Upload) -> Result<Admitted, ServiceError> {
        let result = self.check(&up).await;
        if result.is_err() {
            self.store.discard_temp(&up.temp);
            self.store.discard_staged(up.staged.take()).await;
            metrics::Counters::add(&self.counters.uploads_refused, 1);
        }
        let stored_before = result?;
        if up.label.name.is_empty() {
            up.label.name = "snapshot".to_string();
        }
        let early = up.early.take();
        let arrived =
            crate::store::ArrivedFile { temp: up.temp, staged: up.staged, sha256: up.sha256, bytes: up.bytes };
        let stored = self.store.add_upload(arrived, up.label).await?;
        let (mut row, new) = (stored.added.row, stored.added.new);
        match early {
            Some(early) if new => self.worker.adopt(self.store.clone(), self.loaded.clone(), &row.sha256, early).await,
            _ if new => self.worker.wake(),
            _ => {}
        }
        // The same bytes failed before: uploading them again is how a user retries.
        let retried = row.status == Status::Failed && self.retry(&row.sha256).await?;
        if retried {
            (row.status, row.error) = (Status::Queued, None);
        }
        metrics::Counters::add(&self.counters.uploads, 1);
        Ok(Admitted {
            row,
            duplicate: stored_before || !new,
            delete_key: stored.delete_key,
            made_run: stored.added.made_run,
            retried,
        })
    }

    /// A graceful stop: analyses running now are given back to the queue uncounted.
    pub async fn stop(&self) {
        self.worker.stop(&self.store).await;
    }

    /// Queues a failed analysis again; false when it had not failed.
    pub async fn retry(&self, sha256: &str) -> Result<bool, ServiceError> {
        let queued = self.store.meta.requeue(sha256, crate::store::unix_now()).await?;
        if queued {
            self.worker.wake();
        }
        Ok(queued)
    }

    /// Checks an upload whose bytes are new; true when they are stored already.
    ///
    /// (The check is held to the whole analysis budget, as the analysis is.)
    async fn check(&self, up: &Upload) -> Result<bool, ServiceError> {
        if self.store.meta.by_sha256(&up.sha256).await?.is_some() {
            return Ok(true);
        }
        ingest::check_head(&up.head)?;
        if up.bytes <= CHECK_BEFORE_ANSWER {
            // Two checks at most, on slots and memory of their own (carved out of the budget in
            // `start`), so an upload never waits behind analyses.
            let _slot = self
                .worker
                .checks
                .acquire()
                .await
                .map_err(|e| ServiceError::internal("waiting for a check's slot")(e.into()))?;
            let temp = up.temp.clone();
            // Its hash is the upload's, taken as the bytes came in: the check needs none.
            let options = ingest::Options { hash: false, ..ingest_options(self.worker.budget.total()) };
            tokio::task::spawn_blocking(move || ingest::ingest_path(&temp, &options).map(|_| ()))
                .await
                .map_err(|e| ServiceError::internal("checking an upload")(e.into()))??;
        }
        Ok(false)
    }

    /// Starts parsing an upload while it arrives, when its size is announced and the budget
    /// has room now (see [`early`]).
    pub fn start_early(&self, announced: Option<u64>) -> Option<early::Early> {
        self.worker.start_early(announced.filter(|b| *b > 0)?)
    }

    /// The stored analysis of a snapshot.
    pub async fn analysis(&self, row: &SnapshotRow) -> Result<Analysis, ServiceError> {
        self.store.local_results(&row.sha256).await?;
        let store = self.store.clone();
        let id = row.sha256.clone();
        tokio::task::spawn_blocking(move || store.results.analysis(&id))
            .await
            .map_err(|e| ServiceError::internal("reading an analysis")(e.into()))?
            .map_err(Into::into)
    }

    /// The parsed snapshot of a ready row, from the cache or parsed again within the budget.
    pub async fn entry(&self, row: &SnapshotRow) -> Result<Arc<Entry>, ServiceError> {
        let budget = self.worker.budget.clone();
        self.loaded.load(&self.store, &row.sha256, move |bytes| async move { budget.reserve(bytes).await }).await
    }

    /// A device's series over events `start..end` (default: all) in `points` buckets, from
    /// the stored timeline.
    pub async fn timeline(
        &self,
        row: &SnapshotRow,
        device: i64,
        start: Option<usize>,
        end: Option<usize>,
        points: usize,
    ) -> Result<crate::analysis::timeline::Downsampled, ServiceError> {
        self.store.local_results(&row.sha256).await?;
        let t = match self.store.results.timeline(&row.sha256, device) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ServiceError::Missing("device")),
            Err(e) => return Err(StoreError::from(e).into()),
        };
        let (start, end) = (start.unwrap_or(0), end.unwrap_or(t.len()).min(t.len()));
        if start > end {
            return Err(ServiceError::Invalid(format!("start {start} is after end {end}")));
        }
        tokio::task::spawn_blocking(move || t.columns().downsample(start..end, points))
            .await
            .map_err(|e| ServiceError::internal("downsampling a timeline")(e.into()))
    }

    /// The breakdown at the end that the analysis stored (None for analyses stored by older
    /// versions, which have none).
    pub async fn final_breakdown(
        &self,
        row: &SnapshotRow,
        device: i64,
    ) -> Result<Option<crate::analysis::breakdown::Breakdown>, ServiceError> {
        use crate::analysis::breakdown::Moment;
        let a = self.analysis(row).await?;
        let d = a.devices.into_iter().find(|d| d.device == device).ok_or(ServiceError::Missing("device"))?;
        Ok(d.memory.breakdown.into_iter().find(|b| b.moment == Moment::Final))
    }

    /// The original upload, open at its start, and the file name to download it under: its
    /// name with the extension its format has (`run-42` becomes `run-42.pickle`).
    pub async fn download(&self, row: &SnapshotRow) -> Result<(std::fs::File, String), ServiceError> {
        use std::io::{Read, Seek};
        let mut file = self.store.blobs.open(&row.sha256).await.map_err(|_| ServiceError::Missing("upload"))?;
        let mut head = [0u8; 64];
        let n = file.read(&mut head).map_err(StoreError::from)?;
        file.rewind().map_err(StoreError::from)?;
        let safe: String =
            row.name.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')).take(100).collect();
        let mut name = if safe.is_empty() { "snapshot".to_string() } else { safe };
        let ext = ingest::extension(&head[..n]);
        let known = [".pickle", ".pkl", ".json", ".gz", ".zst", ".pt"];
        if !known.iter().any(|k| name.to_ascii_lowercase().ends_with(k)) {
            name.push_str(ext);
        }
        Ok((file, name))
    }

    /// Deletes an upload (and its parsed snapshot from the cache, if no other upload has the
    /// same bytes); false when there was none.
    pub async fn delete(&self, id: &str) -> Result<bool, ServiceError> {
        let Some(gone) = self.store.delete(id).await? else { return Ok(false) };
        if gone.last {
            self.loaded.remove(&gone.sha256);
        }
        Ok(true)
    }
}

/// How often a replica looks for content deleted elsewhere (see `Store::drop_deleted_copies`).
const DELETES_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes, every few seconds, this replica's copies (cached files and parsed snapshots) of
/// content another replica deleted.
async fn drop_deleted_copies(store: Arc<Store>, loaded: Arc<Loaded>) {
    let mut tick = tokio::time::interval(DELETES_EVERY);
    loop {
        tick.tick().await;
        match store.drop_deleted_copies().await {
            Ok(dropped) => {
                for sha256 in &dropped {
                    loaded.remove(sha256);
                    tracing::info!(sha256, "deleted on another replica: local copies removed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for deleted content; trying again"),
        }
    }
}

/// Reading options for the server's parses: the reader, model and analysis held to `budget`
/// bytes (the whole analysis budget; 0: only the reader's counts), so that no upload, however
/// small its file, can take more.
pub(crate) fn ingest_options(budget: u64) -> ingest::Options {
    let memory = (budget > 0).then(|| crate::analysis::cost::costs(budget));
    ingest::Options { memory, ..ingest::Options::default() }
}
