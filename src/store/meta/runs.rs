//! Runs: one job's ranks, grouped by the key their uploads gave.

use super::{Meta, RunRow, SnapshotRow, columns, row, run_row};
use crate::store::StoreError;

impl Meta {
    /// The run of a key, made on first use (by whichever replica gets there first).
    pub async fn run_for_key(&self, key: &str, new_id: &str, now: i64) -> Result<RunRow, StoreError> {
        sqlx::query("INSERT INTO runs (id, key, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING")
            .bind(new_id)
            .bind(key)
            .bind(now)
            .execute(&self.pool)
            .await?;
        let r =
            sqlx::query("SELECT id, key, created_at FROM runs WHERE key = $1").bind(key).fetch_one(&self.pool).await?;
        Ok(run_row(&r)?)
    }

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

    /// A run's uploads by rank (uploads without a rank last), oldest first within a rank.
    pub async fn run_snapshots(&self, run_id: &str) -> Result<Vec<SnapshotRow>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM snapshots WHERE run_id = $1 ORDER BY rank IS NULL, rank, created_at, id"
        ))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// Deletes a run's row (its uploads are deleted one by one before).
    pub async fn delete_run(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM runs WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }
}
