//! Snapshot metadata in SQLite, through sqlx. Every SQL query of fragscope is in this file.
//!
//! The schema is versioned with `PRAGMA user_version` and its migrations are compiled in, so
//! the binary runs from any directory. WAL mode keeps readers unblocked while a row changes.

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection};

use super::StoreError;

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
    CREATE INDEX snapshots_created ON snapshots(created_at);"];

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
    })
}

/// The columns every query reads, as a literal (sqlx takes only literal SQL).
macro_rules! columns {
    () => {
        "id, sha256, name, note, bytes, status, error, verdict, created_at"
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
        sqlx::query(concat!("INSERT INTO snapshots (", columns!(), ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"))
            .bind(&r.id)
            .bind(&r.sha256)
            .bind(&r.name)
            .bind(&r.note)
            .bind(r.bytes as i64)
            .bind(r.status.as_str())
            .bind(&r.error)
            .bind(&r.verdict)
            .bind(r.created_at)
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
        let r = sqlx::query(concat!("SELECT ", columns!(), " FROM snapshots WHERE sha256 = ?"))
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

    pub async fn set_status(
        &self,
        id: &str,
        status: Status,
        error: Option<&str>,
        verdict: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE snapshots SET status = ?, error = ?, verdict = ?, analyzed_at = strftime('%s','now') WHERE id = ?",
        )
        .bind(status.as_str())
        .bind(error)
        .bind(verdict)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM snapshots WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Snapshots whose analysis had not finished (the server stopped): to run again.
    pub async fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM snapshots WHERE status IN ('queued', 'analyzing') ORDER BY created_at")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| r.try_get("id")).collect::<Result<_, _>>()?)
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

    pub async fn all_ids(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM snapshots").fetch_all(&self.pool).await?;
        Ok(rows.iter().map(|r| r.try_get("id")).collect::<Result<_, _>>()?)
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
