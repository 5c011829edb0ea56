//! Runs: one job's ranks, grouped by the key their uploads gave.

use super::{Meta, RunRow, SnapshotRow, columns, row, run_row};
use crate::store::StoreError;

impl Meta {
    pub async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let r = sqlx::query("SELECT id, key, created_at FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(r.as_ref().map(run_row).transpose()?)
    }

    /// Newest first.
    pub async fn runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError> {
        let rows = sqlx::query("SELECT id, key, created_at FROM runs ORDER BY created_at DESC, id LIMIT $1 OFFSET $2")
            .bind(limit as i64)
            .bind(offset as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(run_row).collect::<Result<_, _>>()?)
    }

    /// A run's uploads in the order they arrived.
    pub async fn run_snapshots(&self, run_id: &str) -> Result<Vec<SnapshotRow>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM snapshots WHERE run_id = $1 ORDER BY created_at, arrived_us, id"
        ))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// The hash of the delete key of the upload that started a run.
    pub async fn run_owner(&self, id: &str) -> Result<Option<String>, StoreError> {
        let o: Option<Option<String>> =
            sqlx::query_scalar("SELECT owner FROM runs WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        Ok(o.flatten())
    }

    /// Deletes a run's row, before its uploads: an upload joining the run at that moment
    /// either is in before (and is deleted with the others) or starts a new run (see
    /// `join_run`). A stop before the uploads are gone leaves them to `orphans`.
    pub async fn delete_run(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM runs WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }
}
