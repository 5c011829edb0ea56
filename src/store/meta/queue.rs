//! The analysis queue: a `jobs` row per content to analyse. Any replica claims the oldest job
//! no one holds, under a lease it renews while it works; a replica that dies leaves a lease
//! that runs out, and another claims the job again. Postgres skips rows another replica is
//! claiming at that moment (`FOR UPDATE SKIP LOCKED`); SQLite serializes writers anyway.

use super::{Conn, Engine, Meta, Status, summary_json};
use crate::analysis::summary::Summary;
use crate::store::StoreError;

/// A job this replica holds: its content, and how many times it has been claimed (this time
/// included).
#[derive(Debug, Clone)]
pub struct Claim {
    pub sha256: String,
    pub attempts: u64,
}

/// Queues the analysis of some bytes (once: a queued job stays as it is).
pub(super) async fn enqueue(c: &mut Conn, sha256: &str, now: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO jobs (sha256, attempts, queued_at) VALUES ($1, 0, $2) ON CONFLICT (sha256) DO NOTHING")
        .bind(sha256)
        .bind(now)
        .execute(c)
        .await?;
    Ok(())
}

/// Marks the uploads of claimed bytes as being analysed.
async fn mark_analyzing(c: &mut Conn, sha256: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE snapshots SET status = 'analyzing', error = NULL WHERE sha256 = $1")
        .bind(sha256)
        .execute(c)
        .await?;
    Ok(())
}

const CLAIM_SQLITE: &str = "UPDATE jobs SET owner = $1, lease_until = $2, attempts = attempts + 1
    WHERE sha256 = (SELECT sha256 FROM jobs WHERE owner IS NULL OR lease_until < $3 ORDER BY queued_at, sha256 LIMIT 1)
    RETURNING sha256, attempts";
const CLAIM_POSTGRES: &str = "UPDATE jobs SET owner = $1, lease_until = $2, attempts = attempts + 1
    WHERE sha256 = (SELECT sha256 FROM jobs WHERE owner IS NULL OR lease_until < $3 ORDER BY queued_at, sha256 LIMIT 1
                    FOR UPDATE SKIP LOCKED)
    RETURNING sha256, attempts";

impl Meta {
    /// Claims the oldest job no one holds (never claimed, or its lease ran out) for `owner`
    /// until `lease_until`, and marks its uploads analysing.
    pub async fn claim(&self, owner: &str, now: i64, lease_until: i64) -> Result<Option<Claim>, StoreError> {
        let sql = match self.engine {
            Engine::Sqlite => CLAIM_SQLITE,
            Engine::Postgres => CLAIM_POSTGRES,
        };
        let mut tx = self.pool.begin().await?;
        let got: Option<(String, i64)> =
            sqlx::query_as(sql).bind(owner).bind(lease_until).bind(now).fetch_optional(&mut *tx).await?;
        let Some((sha256, attempts)) = got else { return Ok(None) };
        mark_analyzing(&mut tx, &sha256).await?;
        tx.commit().await?;
        Ok(Some(Claim { sha256, attempts: attempts.max(0) as u64 }))
    }

    /// Claims the job of `sha256` if no one holds it (the replica that parsed the upload while
    /// it arrived takes its own job; another may have been faster).
    pub async fn claim_for(
        &self,
        sha256: &str,
        owner: &str,
        now: i64,
        lease_until: i64,
    ) -> Result<Option<Claim>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let got: Option<(i64,)> = sqlx::query_as(
            "UPDATE jobs SET owner = $1, lease_until = $2, attempts = attempts + 1
             WHERE sha256 = $3 AND (owner IS NULL OR lease_until < $4) RETURNING attempts",
        )
        .bind(owner)
        .bind(lease_until)
        .bind(sha256)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((attempts,)) = got else { return Ok(None) };
        mark_analyzing(&mut tx, sha256).await?;
        tx.commit().await?;
        Ok(Some(Claim { sha256: sha256.to_string(), attempts: attempts.max(0) as u64 }))
    }

    /// Gives a claimed job back to the queue untried (the claim does not count).
    pub async fn release(&self, sha256: &str, owner: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let released = sqlx::query(
            "UPDATE jobs SET owner = NULL, lease_until = NULL, attempts = attempts - 1 WHERE sha256 = $1 AND owner = $2",
        )
        .bind(sha256)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        if released.rows_affected() == 1 {
            sqlx::query("UPDATE snapshots SET status = 'queued' WHERE sha256 = $1")
                .bind(sha256)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Queues the analysis of failed bytes again, as if never tried (a retry after a crash, or
    /// after a fix); false when they are not failed.
    pub async fn requeue(&self, sha256: &str, now: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done =
            sqlx::query("UPDATE snapshots SET status = 'queued', error = NULL WHERE sha256 = $1 AND status = 'failed'")
                .bind(sha256)
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        super::lock_content(&mut tx, self.engine, sha256).await?;
        sqlx::query("DELETE FROM jobs WHERE sha256 = $1").bind(sha256).execute(&mut *tx).await?;
        enqueue(&mut tx, sha256, now).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Extends a lease; false when `owner` no longer holds it (it ran out and another replica
    /// claimed the job, or the job was deleted).
    pub async fn renew(&self, sha256: &str, owner: &str, lease_until: i64) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE jobs SET lease_until = $1 WHERE sha256 = $2 AND owner = $3")
            .bind(lease_until)
            .bind(sha256)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records the analysis of some bytes on every upload of them and takes the job off the
    /// queue, in one transaction.
    pub async fn finish(
        &self,
        sha256: &str,
        status: Status,
        error: Option<&str>,
        verdict: Option<&str>,
        summary: Option<&Summary>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        // An upload of the same bytes added meanwhile is then either updated here or copies
        // the outcome.
        super::lock_content(&mut tx, self.engine, sha256).await?;
        sqlx::query("UPDATE snapshots SET status = $1, error = $2, verdict = $3, summary = $4, analyzed_at = $5 WHERE sha256 = $6")
            .bind(status.as_str())
            .bind(error)
            .bind(verdict)
            .bind(summary_json(summary))
            .bind(crate::store::unix_now())
            .bind(sha256)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM jobs WHERE sha256 = $1").bind(sha256).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Frees every lease. Only for SQLite, where one server is the only replica: the leases
    /// its last run held died with it, and waiting for them to run out would only delay.
    pub async fn release_all(&self) -> Result<u64, StoreError> {
        if self.engine != Engine::Sqlite {
            return Ok(0);
        }
        let done = sqlx::query("UPDATE jobs SET owner = NULL, lease_until = NULL WHERE owner IS NOT NULL")
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Jobs waiting, and jobs held under a live lease.
    pub async fn queue_depth(&self, now: i64) -> Result<(u64, u64), StoreError> {
        let (waiting, running): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(CASE WHEN owner IS NULL OR lease_until < $1 THEN 1 ELSE 0 END), 0),
                    COALESCE(SUM(CASE WHEN owner IS NOT NULL AND lease_until >= $2 THEN 1 ELSE 0 END), 0)
             FROM jobs",
        )
        .bind(now)
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok((waiting.max(0) as u64, running.max(0) as u64))
    }

    /// Runs `work` if no other replica is running it now (a Postgres advisory lock held for the
    /// transaction; SQLite has one server). False when another replica holds the lock.
    pub async fn exclusively<F, T>(&self, lock: i64, work: F) -> Result<Option<T>, StoreError>
    where
        F: std::future::Future<Output = T>,
    {
        if self.engine == Engine::Sqlite {
            return Ok(Some(work.await));
        }
        let mut tx = self.pool.begin().await?;
        let got: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(lock).fetch_one(&mut *tx).await?;
        if !got {
            return Ok(None);
        }
        let out = work.await;
        tx.commit().await?;
        Ok(Some(out))
    }
}
