//! What the web layer asks of the store, asked through the service: the service is the one
//! door into the data directory, the database and the object store (`store/mod.rs` says
//! nothing else touches them).

use super::{Service, ServiceError};
use crate::store::{RunRow, SnapshotRow, Staged};

impl Service {
    /// The snapshot of an id, if there is one.
    pub async fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, ServiceError> {
        Ok(self.store.meta.get(id).await?)
    }

    /// The run of an id, if there is one.
    pub async fn run_row(&self, id: &str) -> Result<Option<RunRow>, ServiceError> {
        Ok(self.store.meta.run(id).await?)
    }

    /// Snapshots, newest first.
    pub async fn list(&self, limit: u32, offset: u32) -> Result<Vec<SnapshotRow>, ServiceError> {
        Ok(self.store.meta.list(limit, offset).await?)
    }

    /// A run's snapshots, in upload order.
    pub async fn run_snapshots(&self, run: &str) -> Result<Vec<SnapshotRow>, ServiceError> {
        Ok(self.store.meta.run_snapshots(run).await?)
    }

    /// Whether `key` is the delete key of snapshot `id`'s upload.
    pub async fn owns(&self, id: &str, key: &str) -> Result<bool, ServiceError> {
        Ok(self.store.owns(id, key).await?)
    }

    /// Whether `key` is the delete key of the upload that started run `id`.
    pub async fn owns_run(&self, id: &str, key: &str) -> Result<bool, ServiceError> {
        Ok(self.store.owns_run(id, key).await?)
    }

    /// Makes sure a ready snapshot's results are on this replica's disk (with an object
    /// store, another replica may have made them).
    pub async fn ensure_results(&self, sha256: &str) -> Result<(), ServiceError> {
        Ok(self.store.local_results(sha256).await?)
    }

    /// The analysis document as stored, untouched.
    pub fn analysis_bytes(&self, sha256: &str) -> Result<Vec<u8>, ServiceError> {
        Ok(self.store.results.analysis_bytes(sha256).map_err(crate::store::StoreError::from)?)
    }

    /// A segment map the analysis stored (the OOMs', the end's), if it stored this one.
    pub fn stored_map(&self, sha256: &str, device: i64, event: Option<u64>) -> Option<Vec<u8>> {
        self.store.results.map(sha256, device, event).ok()
    }

    /// Bytes an analysis at work has read of its upload, if one is at work on it.
    pub fn progress(&self, sha256: &str) -> Option<u64> {
        self.worker.progress(sha256)
    }

    /// A slot for a simulation (as heavy as an analysis, open to anyone with a link): two at
    /// once; None when both are taken.
    pub fn simulation_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.worker.simulations.try_acquire().ok()
    }

    /// Gives up an upload's object-store copy.
    pub async fn discard_staged(&self, staged: Option<Staged>) {
        self.store.discard_staged(staged).await
    }

    /// Closes the database's connections (after [`Service::stop`]).
    pub async fn close(&self) {
        self.store.meta.close().await
    }
}
