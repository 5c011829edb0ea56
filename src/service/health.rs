//! Whether this replica can serve (`/readyz`), and what it has done (`/metrics`).

use super::{Service, ServiceError, StoreError, metrics};

/// Why this replica should not be sent traffic (`/readyz` answers 503 with it).
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// The database does not answer.
    #[error("the database does not answer: {0}")]
    Database(StoreError),
    /// The blob store does not answer.
    #[error("the blob store does not answer: {0}")]
    Blobs(std::io::Error),
    /// A write waited past 2 s for the database's lock.
    #[error("the database cannot take a write: it stayed locked for 2 s")]
    Locked,
    /// The database's disk is full.
    #[error("the database's disk is full")]
    DatabaseDiskFull,
    /// A write failed otherwise (the error with its sources).
    #[error("the database cannot take a write: {0}")]
    DatabaseWrite(String),
    /// The data folder's disk is full.
    #[error("the data folder's disk is full")]
    DataDiskFull,
    /// The data folder cannot be written.
    #[error("the data folder cannot be written: {0}")]
    DataFolder(std::io::Error),
    /// The check itself failed.
    #[error("{0}")]
    Crashed(tokio::task::JoinError),
}

impl Service {
    /// The database and the blob store answer; else which does not.
    /// A write is tried too, briefly: a store that answers reads but cannot take an upload
    /// (a full disk, a database stuck locked) is not ready.
    pub async fn ready(&self) -> Result<(), NotReady> {
        self.store.meta.ping().await.map_err(NotReady::Database)?;
        self.store.blobs.ping().await.map_err(NotReady::Blobs)?;
        let write = tokio::time::timeout(std::time::Duration::from_secs(2), self.store.meta.ping_write());
        match write.await {
            Err(_) => return Err(NotReady::Locked),
            Ok(Err(e)) if e.is_disk_full() => return Err(NotReady::DatabaseDiskFull),
            Ok(Err(e)) => return Err(NotReady::DatabaseWrite(e.with_sources())),
            Ok(Ok(())) => {}
        }
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.probe_disk()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if crate::store::io_disk_full(&e) => Err(NotReady::DataDiskFull),
            Ok(Err(e)) => Err(NotReady::DataFolder(e)),
            Err(e) => Err(NotReady::Crashed(e)),
        }
    }

    /// `/metrics`: the counters, and gauges read from the store now.
    pub async fn metrics(&self) -> Result<String, ServiceError> {
        let (by_status, stored_bytes, runs) = self.store.meta.gauges().await?;
        let now = crate::store::unix_now();
        let (queued, running) = self.store.meta.queue_depth(now).await?;
        let budget_free_bytes = self.worker.budget.free();
        let gauges = metrics::Gauges { by_status, stored_bytes, runs, budget_free_bytes, queued, running };
        Ok(metrics::render(&self.counters, &gauges))
    }
}
