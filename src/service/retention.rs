//! Snapshots older than the retention period are deleted, hourly, by one replica at a time
//! (an advisory lock in the database picks it).

use std::time::Duration;

use super::Service;

/// The advisory lock that lets one replica at a time run the retention pass.
const RETENTION_LOCK: i64 = 0x6672_6167_7265_7431;

impl Service {
    /// Deletes snapshots older than `days`, hourly, for as long as the process runs.
    pub fn start_retention(&self, days: u64) {
        let service = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tick.tick().await;
                let pass = retention_pass(&service, days);
                match service.store.meta.exclusively(RETENTION_LOCK, pass).await {
                    Ok(Some(deleted)) => tracing::info!(deleted, "retention pass"),
                    Ok(None) => tracing::info!("retention pass: another replica is running it"),
                    Err(e) => tracing::error!(error = %e, "retention check failed"),
                }
            }
        });
    }
}

/// Deletes what is older than `days`; how many uploads it deleted.
async fn retention_pass(service: &Service, days: u64) -> usize {
    let cutoff = crate::store::unix_now().saturating_sub(days as i64 * 86400);
    let mut deleted = 0;
    match service.store.meta.created_before(cutoff).await {
        Ok(ids) => {
            for id in ids {
                match service.delete(&id).await {
                    Ok(true) => {
                        deleted += 1;
                        tracing::info!(id, "deleted: older than the retention period");
                    }
                    // Deleted meanwhile by its owner.
                    Ok(false) => {}
                    Err(e) => tracing::error!(id, error = %e, "retention: could not delete; the next pass tries again"),
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "retention check failed"),
    }
    deleted
}
