//! Snapshot metadata in SQLite, through sqlx. Every SQL query of fragscope is in this file.
//!
//! The schema is versioned with `PRAGMA user_version` and its migrations are compiled in, so
//! the binary runs from any directory. WAL mode keeps readers unblocked while a row changes.

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection};

use super::StoreError;
use crate::analysis::summary::Summary;

/// Migrations in order; `user_version` is how many have run.
const MIGRATIONS: &[&str] = &["CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL,
        name TEXT NOT NULL,
        note TEXT NOT NULL DEFAULT '',
        bytes INTEGER NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        verdict TEXT,
        created_at INTEGER NOT NULL,
        analyzed_at INTEGER
    );
    CREATE UNIQUE INDEX snapshots_sha256 ON snapshots(sha256);
    CREATE INDEX snapshots_created ON snapshots(created_at);",
    // Each upload its own id (the same bytes are stored and analysed once), runs of ranks,
    // and each snapshot's one-line summary for a run's page.
    "DROP INDEX snapshots_sha256;
    CREATE INDEX snapshots_sha256 ON snapshots(sha256);
    ALTER TABLE snapshots ADD COLUMN run_id TEXT;
    ALTER TABLE snapshots ADD COLUMN rank INTEGER;
    ALTER TABLE snapshots ADD COLUMN summary TEXT;
    CREATE INDEX snapshots_run ON snapshots(run_id, rank);
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX runs_key ON runs(key);",
    // How many times an analysis of these bytes was started: one that died twice (a stop, or
    // the kernel killing the server for memory) is failed, not resumed into a crash loop.
    "ALTER TABLE snapshots ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;"];

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

fn run_row(r: &sqlx::sqlite::SqliteRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow { id: r.try_get("id")?, key: r.try_get("key")?, created_at: r.try_get("created_at")? })
}

fn summary_json(s: Option<&Summary>) -> Option<String> {
    s.and_then(|s| serde_json::to_string(s).ok())
}

pub struct Meta {
    pool: SqlitePool,
}

fn row(r: &sqlx::sqlite::SqliteRow) -> Result<SnapshotRow, sqlx::Error> {
    Ok(SnapshotRow {
        id: r.try_get("id")?,
        sha256: r.try_get("sha256")?,
        name: r.try_get("name")?,
        note: r.try_get("note")?,
        bytes: r.try_get::<i64, _>("bytes")? as u64,
        status: Status::parse(r.try_get::<&str, _>("status")?),
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

impl Meta {
    pub async fn open(path: &std::path::Path) -> Result<Meta, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        let mut conn = pool.acquire().await?;
        migrate(&mut conn).await?;
        drop(conn);
        Ok(Meta { pool })
    }

    pub async fn insert(&self, r: &SnapshotRow) -> Result<(), StoreError> {
        sqlx::query(concat!("INSERT INTO snapshots (", columns!(), ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"))
            .bind(&r.id)
            .bind(&r.sha256)
            .bind(&r.name)
            .bind(&r.note)
            .bind(r.bytes as i64)
            .bind(r.status.as_str())
            .bind(&r.error)
            .bind(&r.verdict)
            .bind(r.created_at)
            .bind(&r.run_id)
            .bind(r.rank)
            .bind(summary_json(r.summary.as_ref()))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn get(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let r = sqlx::query(concat!("SELECT ", columns!(), " FROM snapshots WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(r.as_ref().map(row).transpose()?)
    }

    pub async fn by_sha256(&self, sha256: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let r = sqlx::query(concat!("SELECT ", columns!(), " FROM snapshots WHERE sha256 = ? ORDER BY created_at, id LIMIT 1"))
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
            " FROM snapshots ORDER BY created_at DESC, id LIMIT ? OFFSET ?"
        ))
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// Records the analysis of some bytes on every upload of them.
    pub async fn set_status(
        &self,
        sha256: &str,
        status: Status,
        error: Option<&str>,
        verdict: Option<&str>,
        summary: Option<&Summary>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE snapshots SET status = ?, error = ?, verdict = ?, summary = ?, analyzed_at = strftime('%s','now')
             WHERE sha256 = ?",
        )
        .bind(status.as_str())
        .bind(error)
        .bind(verdict)
        .bind(summary_json(summary))
        .bind(sha256)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A new upload of bytes already stored: `r` with the analysis state of the first upload
    /// of them, in one statement (so an analysis finishing meanwhile updates it or is copied).
    /// False when no upload of these bytes is left (deleted meanwhile).
    pub async fn insert_copy(&self, r: &SnapshotRow) -> Result<Option<SnapshotRow>, StoreError> {
        let done = sqlx::query(
            "INSERT INTO snapshots (id, sha256, name, note, bytes, status, error, verdict, created_at, run_id, rank, summary)
             SELECT ?, sha256, ?, ?, bytes, status, error, verdict, ?, ?, ?, summary
             FROM snapshots WHERE sha256 = ? ORDER BY created_at, id LIMIT 1",
        )
        .bind(&r.id)
        .bind(&r.name)
        .bind(&r.note)
        .bind(r.created_at)
        .bind(&r.run_id)
        .bind(r.rank)
        .bind(&r.sha256)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        self.get(&r.id).await
    }

    /// Deletes an upload; the number of uploads of the same bytes left, or None when there
    /// was no such upload.
    pub async fn delete(&self, id: &str) -> Result<Option<(String, u64)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let sha: Option<String> =
            sqlx::query_scalar("DELETE FROM snapshots WHERE id = ? RETURNING sha256").bind(id).fetch_optional(&mut *tx).await?;
        let Some(sha) = sha else { return Ok(None) };
        let left: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM snapshots WHERE sha256 = ?").bind(&sha).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(Some((sha, left as u64)))
    }

    /// Marks the analysis of some bytes started; returns how many times it has been.
    pub async fn start_attempt(&self, sha256: &str) -> Result<u64, StoreError> {
        let n: Option<i64> = sqlx::query_scalar(
            "UPDATE snapshots SET status = 'analyzing', error = NULL, attempts = attempts + 1
             WHERE sha256 = ? RETURNING attempts",
        )
        .bind(sha256)
        .fetch_optional(&self.pool)
        .await?;
        Ok(n.unwrap_or(0) as u64)
    }

    /// How many times the analysis of some bytes was started.
    pub async fn attempts(&self, sha256: &str) -> Result<u64, StoreError> {
        let n: Option<i64> = sqlx::query_scalar("SELECT MAX(attempts) FROM snapshots WHERE sha256 = ?")
            .bind(sha256)
            .fetch_one(&self.pool)
            .await?;
        Ok(n.unwrap_or(0) as u64)
    }

    /// Bytes whose analysis had not finished (the server stopped): to run again.
    pub async fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT sha256 FROM snapshots WHERE status IN ('queued', 'analyzing')
             GROUP BY sha256 ORDER BY MIN(created_at)",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.try_get("sha256")).collect::<Result<_, _>>()?)
    }

    /// The run of a key, made on first use.
    pub async fn run_for_key(&self, key: &str, new_id: &str, now: i64) -> Result<RunRow, StoreError> {
        sqlx::query("INSERT INTO runs (id, key, created_at) VALUES (?, ?, ?) ON CONFLICT(key) DO NOTHING")
            .bind(new_id)
            .bind(key)
            .bind(now)
            .execute(&self.pool)
            .await?;
        let r = sqlx::query("SELECT id, key, created_at FROM runs WHERE key = ?").bind(key).fetch_one(&self.pool).await?;
        Ok(run_row(&r)?)
    }

    pub async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let r = sqlx::query("SELECT id, key, created_at FROM runs WHERE id = ?").bind(id).fetch_optional(&self.pool).await?;
        Ok(r.as_ref().map(run_row).transpose()?)
    }

    /// Newest first.
    pub async fn runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError> {
        let rows = sqlx::query("SELECT id, key, created_at FROM runs ORDER BY created_at DESC, id LIMIT ? OFFSET ?")
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
            " FROM snapshots WHERE run_id = ? ORDER BY rank IS NULL, rank, created_at, id"
        ))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
    }

    /// Deletes a run's row (its uploads are deleted one by one before).
    pub async fn delete_run(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM runs WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records a summary computed after the fact (for analyses stored before summaries).
    pub async fn set_summary(&self, sha256: &str, summary: &Summary) -> Result<(), StoreError> {
        sqlx::query("UPDATE snapshots SET summary = ? WHERE sha256 = ?")
            .bind(summary_json(Some(summary)))
            .bind(sha256)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn created_before(&self, unix_seconds: i64) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM snapshots WHERE created_at < ?")
            .bind(unix_seconds)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| r.try_get("id")).collect::<Result<_, _>>()?)
    }

    pub async fn all_sha256(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT sha256 FROM snapshots").fetch_all(&self.pool).await?;
        Ok(rows.iter().map(|r| r.try_get("sha256")).collect::<Result<_, _>>()?)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

async fn migrate(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let version: i64 = sqlx::query_scalar("PRAGMA user_version").fetch_one(&mut *conn).await?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::raw_sql(*sql).execute(&mut *tx).await?;
        // An integer we computed, not input: safe to format into the statement.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PRAGMA user_version = {}", i + 1))).execute(&mut *tx).await?;
        tx.commit().await?;
    }
    Ok(())
}
