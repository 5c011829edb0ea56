//! Snapshot metadata and the analysis queue, in SQLite (the default, a file in the data folder)
//! or PostgreSQL (for several replicas), through sqlx's `Any` driver: one text per query, with
//! `$1` placeholders both engines read. Every SQL query of fragscope is in this folder.
//!
//! Migrations are compiled in (`migrations/sqlite`, `migrations/postgres`) and run at start by
//! sqlx's migrator, which holds a lock while it runs so replicas starting at once migrate once.

mod connect;
mod queue;
mod rows;
mod runs;

pub use connect::redact;
pub use queue::Claim;
use rows::{Conn, get, insert, insert_copy, lock_content};

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};

use super::StoreError;
use crate::analysis::summary::Summary;

/// The engine behind the pool: a few statements differ (row locks, advisory locks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    Analyzing,
    Ready,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Analyzing => "analyzing",
            Status::Ready => "ready",
            Status::Failed => "failed",
        }
    }
    fn parse(s: &str) -> Status {
        match s {
            "queued" => Status::Queued,
            "analyzing" => Status::Analyzing,
            "ready" => Status::Ready,
            _ => Status::Failed,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotRow {
    pub id: String,
    pub sha256: String,
    pub name: String,
    pub note: String,
    pub bytes: u64,
    pub status: Status,
    pub error: Option<String>,
    /// The diagnosis verdict of the first device, once ready.
    pub verdict: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
    /// The run it belongs to, if uploaded with a run key.
    pub run_id: Option<String>,
    /// Its rank in that run.
    pub rank: Option<i64>,
    /// Its one-line summary, once ready (None for analyses stored before summaries).
    pub summary: Option<Summary>,
}

/// A group of uploads: one job's ranks.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: String,
    /// What the job's ranks have in common (a job id), as the uploads gave it.
    pub key: String,
    /// Unix seconds.
    pub created_at: i64,
}

fn run_row(r: &AnyRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow { id: r.try_get("id")?, key: r.try_get("key")?, created_at: r.try_get("created_at")? })
}

fn summary_json(s: Option<&Summary>) -> Option<String> {
    s.and_then(|s| serde_json::to_string(s).ok())
}

pub struct Meta {
    pool: AnyPool,
    engine: Engine,
}

fn row(r: &AnyRow) -> Result<SnapshotRow, sqlx::Error> {
    Ok(SnapshotRow {
        id: r.try_get("id")?,
        sha256: r.try_get("sha256")?,
        name: r.try_get("name")?,
        note: r.try_get("note")?,
        bytes: r.try_get::<i64, _>("bytes")? as u64,
        status: Status::parse(&r.try_get::<String, _>("status")?),
        error: r.try_get("error")?,
        verdict: r.try_get("verdict")?,
        created_at: r.try_get("created_at")?,
        run_id: r.try_get("run_id")?,
        rank: r.try_get("rank")?,
        // A summary this version cannot read is recomputed from the analysis, not an error.
        summary: r.try_get::<Option<String>, _>("summary")?.and_then(|s| serde_json::from_str(&s).ok()),
    })
}

/// The columns every query reads, as a literal (sqlx takes only literal SQL).
macro_rules! columns {
    () => {
        "id, sha256, name, note, bytes, status, error, verdict, created_at, run_id, rank, summary"
    };
}
use columns;

/// Who may delete an upload (and the run it started): the hash of the key its upload was
/// given, and the run key to join, if any.
pub struct Owner<'a> {
    /// sha256 of the delete key, as hex.
    pub key_hash: &'a str,
    pub run_key: Option<&'a str>,
}

/// A stored upload row, and what storing it did.
pub struct Added {
    pub row: SnapshotRow,
    /// The first upload of its bytes: its analysis was queued.
    pub new: bool,
    /// It started its run (its delete key deletes the run too).
    pub made_run: bool,
}

/// Joins the run of `key` inside the upload's own transaction, making it if there is none:
/// on Postgres the run's row stays locked until the upload's row is in, so a delete of the
/// run either waits for the upload and deletes it too, or finishes first and the upload
/// starts a new run under the same key; SQLite runs one writer at a time. Sets the row's
/// run; true when this made the run.
async fn join_run(c: &mut Conn, engine: Engine, owner: &Owner<'_>, r: &mut SnapshotRow) -> Result<bool, sqlx::Error> {
    let Some(key) = owner.run_key else { return Ok(false) };
    let sql = match engine {
        Engine::Sqlite => "SELECT id FROM runs WHERE key = $1",
        Engine::Postgres => "SELECT id FROM runs WHERE key = $1 FOR UPDATE",
    };
    // A delete committed between the insert that met the key and the select: insert again.
    for _ in 0..3 {
        let made = sqlx::query(
            "INSERT INTO runs (id, key, created_at, owner) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
        )
        .bind(super::random_id())
        .bind(key)
        .bind(r.created_at)
        .bind(owner.key_hash)
        .execute(&mut *c)
        .await?
        .rows_affected()
            == 1;
        if let Some(id) = sqlx::query_scalar::<_, String>(sql).bind(key).fetch_optional(&mut *c).await? {
            r.run_id = Some(id);
            return Ok(made);
        }
    }
    Err(sqlx::Error::RowNotFound)
}

impl Meta {
    /// A new upload of bytes already stored, sharing their analysis; None when no upload of
    /// them is left.
    pub async fn insert_copy(&self, r: &SnapshotRow, owner: &Owner<'_>) -> Result<Option<Added>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut r = r.clone();
        let made_run = join_run(&mut tx, self.engine, owner, &mut r).await?;
        lock_content(&mut tx, self.engine, &r.sha256).await?;
        let Some(row) = insert_copy(&mut tx, &r, owner.key_hash).await? else { return Ok(None) };
        tx.commit().await?;
        Ok(Some(Added { row, new: false, made_run }))
    }

    /// Adds an upload whose blob is stored. The content's key is claimed with a unique
    /// constraint, in one transaction: the first upload of some bytes is inserted queued and
    /// its analysis queued; any other (a replica that took the same bytes at the same moment)
    /// waits for it and joins it. The upload joins its run in the same transaction.
    pub async fn add(&self, r: &SnapshotRow, owner: &Owner<'_>) -> Result<Added, StoreError> {
        let mut tx = self.pool.begin().await?;
        let won =
            sqlx::query("INSERT INTO contents (sha256, created_at) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING")
                .bind(&r.sha256)
                .bind(r.created_at)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
        let mut r = r.clone();
        let made_run = join_run(&mut tx, self.engine, owner, &mut r).await?;
        lock_content(&mut tx, self.engine, &r.sha256).await?;
        if !won && let Some(copy) = insert_copy(&mut tx, &r, owner.key_hash).await? {
            tx.commit().await?;
            return Ok(Added { row: copy, new: false, made_run });
        }
        insert(&mut tx, &r, owner.key_hash).await?;
        queue::enqueue(&mut tx, &r.sha256, r.created_at).await?;
        tx.commit().await?;
        Ok(Added { row: r, new: true, made_run })
    }

    /// The hash of the delete key an upload was given (None: no such upload, or one made
    /// before uploads had keys).
    pub async fn owner(&self, id: &str) -> Result<Option<String>, StoreError> {
        let o: Option<Option<String>> =
            sqlx::query_scalar("SELECT owner FROM snapshots WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        Ok(o.flatten())
    }

    /// Uploads that name a run no longer there (a run delete that a stop interrupted).
    pub async fn orphans(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM snapshots WHERE run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = snapshots.run_id)",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.try_get("id")).collect::<Result<_, _>>()?)
    }

    pub async fn get(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let mut c = self.pool.acquire().await?;
        Ok(get(&mut c, id).await?)
    }

    pub async fn by_sha256(&self, sha256: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let r = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM snapshots WHERE sha256 = $1 ORDER BY created_at, id LIMIT 1"
        ))
        .bind(sha256)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.as_ref().map(row).transpose()?)
    }

    /// Newest first.
    pub async fn list(&self, limit: u32, offset: u32) -> Result<Vec<SnapshotRow>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM snapshots ORDER BY created_at DESC, id LIMIT $1 OFFSET $2"
        ))
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// Deletes an upload; the number of uploads of the same bytes left, or None when there
    /// was no such upload. The last one takes the content's key and queued analysis with it.
    pub async fn delete(&self, id: &str) -> Result<Option<(String, u64)>, StoreError> {
        let mut tx = self.write_transaction().await?;
        let sha: Option<String> =
            sqlx::query_scalar("SELECT sha256 FROM snapshots WHERE id = $1").bind(id).fetch_optional(&mut *tx).await?;
        let Some(sha) = sha else { return Ok(None) };
        // Counting the uploads left is only true while none is being added.
        lock_content(&mut tx, self.engine, &sha).await?;
        let deleted = sqlx::query("DELETE FROM snapshots WHERE id = $1").bind(id).execute(&mut *tx).await?;
        if deleted.rows_affected() == 0 {
            return Ok(None);
        }
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM snapshots WHERE sha256 = $1")
            .bind(&sha)
            .fetch_one(&mut *tx)
            .await?;
        if left == 0 {
            sqlx::query("DELETE FROM contents WHERE sha256 = $1").bind(&sha).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM jobs WHERE sha256 = $1").bind(&sha).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Some((sha, left as u64)))
    }

    /// Records a summary computed after the fact (for analyses stored before summaries).
    pub async fn set_summary(&self, sha256: &str, summary: &Summary) -> Result<(), StoreError> {
        sqlx::query("UPDATE snapshots SET summary = $1 WHERE sha256 = $2")
            .bind(summary_json(Some(summary)))
            .bind(sha256)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A transaction that reads before it writes. SQLite's default `BEGIN` takes the write
    /// lock at the first write, and if another connection wrote since this one's first read,
    /// that fails at once with SQLITE_BUSY instead of waiting (a retention pass lost that race
    /// with a restart's own writes). `BEGIN IMMEDIATE` takes the lock first, waiting its turn.
    async fn write_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Engine::Postgres => self.pool.begin().await,
        }
    }

    pub async fn created_before(&self, unix_seconds: i64) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM snapshots WHERE created_at < $1")
            .bind(unix_seconds)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| r.try_get("id")).collect::<Result<_, _>>()?)
    }

    /// The content some upload refers to.
    pub async fn all_sha256(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT DISTINCT sha256 FROM snapshots").fetch_all(&self.pool).await?;
        Ok(rows.iter().map(|r| r.try_get("sha256")).collect::<Result<_, _>>()?)
    }

    /// Uploads by status, distinct stored bytes, and runs: the gauges of `/metrics`.
    pub async fn gauges(&self) -> Result<(Vec<(String, u64)>, u64, u64), StoreError> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM snapshots GROUP BY status ORDER BY status")
            .fetch_all(&self.pool)
            .await?;
        let by_status = rows
            .iter()
            .map(|r| Ok((r.try_get::<String, _>("status")?, r.try_get::<i64, _>("n")? as u64)))
            .collect::<Result<_, sqlx::Error>>()?;
        // Postgres sums BIGINTs into a NUMERIC: cast back.
        let stored: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(SUM(b) AS BIGINT) FROM (SELECT MAX(bytes) AS b FROM snapshots GROUP BY sha256) AS per_content",
        )
        .fetch_one(&self.pool)
        .await?;
        let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs").fetch_one(&self.pool).await?;
        Ok((by_status, stored.unwrap_or(0) as u64, runs as u64))
    }

    /// The database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Whether a write could start now: on SQLite, the write lock is taken and let go (a
    /// connection stuck inside a transaction holds it, and every upload would wait and fail).
    pub async fn ping_write(&self) -> Result<(), StoreError> {
        let tx = self.write_transaction().await?;
        tx.rollback().await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::connect::sqlite_url;
    use super::*;
    use sqlx::Executor;
    use sqlx::any::AnyPoolOptions;

    /// A database written by versions that counted migrations in `user_version` opens: its
    /// rows stay, and an analysis it left queued is on the new queue.
    #[tokio::test]
    async fn a_database_from_before_the_migrator_is_carried_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fragscope.db");
        {
            let pool = AnyPoolOptions::new().max_connections(1);
            sqlx::any::install_default_drivers();
            let pool = pool.connect(&sqlite_url(&path)).await.unwrap();
            for sql in [
                include_str!("../../../migrations/sqlite/0001_snapshots.sql"),
                include_str!("../../../migrations/sqlite/0002_runs.sql"),
                include_str!("../../../migrations/sqlite/0003_attempts.sql"),
            ] {
                sqlx::raw_sql(sql).execute(&pool).await.unwrap();
            }
            sqlx::raw_sql(
                "INSERT INTO snapshots (id, sha256, name, bytes, status, created_at, attempts)
                 VALUES ('a', 'ab', 'old', 10, 'ready', 1, 1), ('b', 'cd', 'queued one', 20, 'analyzing', 2, 1);
                 PRAGMA user_version = 3;",
            )
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        let meta = Meta::open(&path).await.unwrap();
        assert_eq!(meta.get("a").await.unwrap().unwrap().name, "old");
        let claim = meta.claim("me", 10, 70).await.unwrap().expect("the unfinished analysis is queued");
        assert_eq!((claim.sha256.as_str(), claim.attempts), ("cd", 2), "its earlier attempt counts");
        assert!(meta.claim("me", 10, 70).await.unwrap().is_none(), "the finished one is not");
        drop(meta);
        // And it opens again, the migrations recorded.
        Meta::open(&path).await.unwrap();
    }

    /// A lease that runs out lets another claim the job; the one that lost it cannot renew.
    #[tokio::test]
    async fn a_job_whose_lease_ran_out_is_claimed_again() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::open(&dir.path().join("db")).await.unwrap();
        let row = SnapshotRow {
            id: "x".into(),
            sha256: "ef".into(),
            name: "n".into(),
            note: String::new(),
            bytes: 1,
            status: Status::Queued,
            error: None,
            verdict: None,
            created_at: 5,
            run_id: None,
            rank: None,
            summary: None,
        };
        let owner = Owner { key_hash: "k", run_key: None };
        assert!(meta.add(&row, &owner).await.unwrap().new);
        let copy = meta.add(&SnapshotRow { id: "y".into(), ..row.clone() }, &owner).await.unwrap();
        assert!(!copy.new, "the same bytes again join the first upload");
        assert_eq!(copy.row.status, Status::Queued);
        assert_eq!(meta.claim("a", 100, 160).await.unwrap().unwrap().attempts, 1);
        assert!(meta.claim("b", 150, 210).await.unwrap().is_none(), "held under a live lease");
        let again = meta.claim("b", 161, 221).await.unwrap().expect("the lease ran out");
        assert_eq!(again.attempts, 2);
        assert!(!meta.renew("ef", "a", 300).await.unwrap(), "the first owner lost it");
        assert!(meta.renew("ef", "b", 300).await.unwrap());
        meta.finish("ef", Status::Ready, None, Some("no_oom"), None).await.unwrap();
        assert_eq!(meta.get("y").await.unwrap().unwrap().status, Status::Ready);
        assert!(meta.claim("c", 1000, 1060).await.unwrap().is_none(), "done: off the queue");
        // Failed bytes go back on the queue, unclaimed and uncounted; ready ones do not.
        assert!(!meta.requeue("ef", 1100).await.unwrap(), "ready is not retried");
        meta.finish("ef", Status::Failed, Some("died"), None, None).await.unwrap();
        assert!(meta.requeue("ef", 1100).await.unwrap());
        assert_eq!(meta.get("x").await.unwrap().unwrap().status, Status::Queued);
        assert_eq!(meta.claim("d", 1200, 1260).await.unwrap().unwrap().attempts, 1);
    }

    /// A connection given back inside a transaction (as a write that fails on a full disk can
    /// leave one) is rolled back and dropped, not pooled holding the write lock.
    #[tokio::test]
    async fn a_connection_left_inside_a_transaction_does_not_hold_the_write_lock() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::open(&dir.path().join("db")).await.unwrap();
        {
            let mut c = meta.pool.acquire().await.unwrap();
            // Begun behind sqlx's back, as SQLite keeps a transaction a failed COMMIT left open.
            c.execute("BEGIN IMMEDIATE").await.unwrap();
            c.execute("INSERT INTO runs (id, key, created_at) VALUES ('r', 'k', 1)").await.unwrap();
        }
        let write = tokio::time::timeout(std::time::Duration::from_secs(5), meta.ping_write()).await;
        assert!(matches!(write, Ok(Ok(()))), "the write lock is still held: {write:?}");
        assert!(meta.run("r").await.unwrap().is_none(), "the stale transaction was rolled back");
    }

    /// The reverse: SQLite ended the transaction by itself (it rolls back when the disk fills)
    /// while sqlx still counts it open. Pooled, that connection refused every `BEGIN IMMEDIATE`
    /// ("non-zero transaction depth"), as CI saw after a full disk.
    #[tokio::test]
    async fn a_connection_sqlx_counts_inside_a_transaction_is_not_pooled() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::open(&dir.path().join("db")).await.unwrap();
        for _ in 0..8 {
            let mut tx = meta.pool.begin().await.unwrap();
            // Ended behind sqlx's back; its own rollback at the drop then fails.
            tx.execute("COMMIT").await.unwrap();
        }
        for _ in 0..8 {
            let write = tokio::time::timeout(std::time::Duration::from_secs(5), meta.ping_write()).await;
            assert!(matches!(write, Ok(Ok(()))), "a pooled connection refuses to begin: {write:?}");
        }
    }
}
