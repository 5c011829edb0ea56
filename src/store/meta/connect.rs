//! Connecting: the engine a URL names, the pool and its settings (SQLite's WAL, and no
//! connection given back inside a transaction), and the migrations compiled in.

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Executor, SqlSafeStr};

use super::{Engine, Meta};
use crate::store::StoreError;

fn migration(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(version, description.into(), MigrationType::Simple, sql.into_sql_str(), false)
}

fn migrator(engine: Engine) -> Migrator {
    Migrator::with_migrations(match engine {
        Engine::Sqlite => vec![
            migration(1, "snapshots", include_str!("../../../migrations/sqlite/0001_snapshots.sql")),
            migration(2, "runs", include_str!("../../../migrations/sqlite/0002_runs.sql")),
            migration(3, "attempts", include_str!("../../../migrations/sqlite/0003_attempts.sql")),
            migration(4, "queue", include_str!("../../../migrations/sqlite/0004_queue.sql")),
            migration(5, "owners", include_str!("../../../migrations/sqlite/0005_owners.sql")),
        ],
        Engine::Postgres => vec![
            migration(1, "schema", include_str!("../../../migrations/postgres/0001_schema.sql")),
            migration(2, "owners", include_str!("../../../migrations/postgres/0002_owners.sql")),
        ],
    })
}

impl Meta {
    /// Opens the SQLite file at `path` (made if missing).
    pub async fn open(path: &std::path::Path) -> Result<Meta, StoreError> {
        Meta::connect(&sqlite_url(path)).await
    }

    /// Connects to `sqlite://PATH` or `postgres://…` and migrates.
    pub async fn connect(url: &str) -> Result<Meta, StoreError> {
        sqlx::any::install_default_drivers();
        let engine = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Engine::Postgres
        } else if url.starts_with("sqlite:") {
            Engine::Sqlite
        } else {
            return Err(StoreError::Config(format!(
                "a database URL starts with sqlite:// or postgres://, not {:?}",
                redact(url)
            )));
        };
        let options = AnyPoolOptions::new()
            .max_connections(if engine == Engine::Sqlite { 4 } else { 8 })
            .acquire_timeout(std::time::Duration::from_secs(10));
        let options = if engine == Engine::Sqlite {
            // Readers stay unblocked while a row changes; writers wait for each other.
            options
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute(
                            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 10000",
                        )
                        .await
                        .map(|_| ())
                    })
                })
                .after_release(|conn, _| Box::pin(async move { Ok(ends_outside_transaction(conn).await) }))
        } else {
            options
        };
        let pool = options.connect(url).await?;
        let mut conn = pool.acquire().await?;
        let m = migrator(engine);
        if engine == Engine::Sqlite {
            // Versions before sqlx's migrator counted their migrations in `user_version`: mark
            // those as done, once.
            let legacy: i64 = sqlx::query_scalar("PRAGMA user_version").fetch_one(&mut *conn).await?;
            let table: Option<String> =
                sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
                    .fetch_optional(&mut *conn)
                    .await?;
            if legacy > 0 && table.is_none() {
                m.skip(&mut *conn, Some(legacy)).await?;
            }
        }
        m.run(&mut *conn).await?;
        drop(conn);
        Ok(Meta { pool, engine })
    }
}

/// Whether a SQLite connection given back to the pool is outside any transaction, as it must
/// be; one still inside is rolled back and closed. A write that fails on a full disk can
/// leave SQLite's transaction open while sqlx counts it as ended (or the reverse); pooled
/// again, that connection held the write lock for good: every later write waited out the
/// busy timeout ("database is locked"), and an upload "committed" inside the stale
/// transaction was lost at the restart. A `ROLLBACK` that succeeds proves the connection was
/// inside one. The reverse case: SQLite rolled back by itself when the disk filled, so sqlx's
/// own rollback failed and left its count of open transactions above zero; every later
/// `BEGIN IMMEDIATE` on that connection is then refused ("non-zero transaction depth"). The
/// `ROLLBACK` below runs after any rollback the dropped transaction queued, so the count read
/// after it is settled.
async fn ends_outside_transaction(conn: &mut sqlx::AnyConnection) -> bool {
    let sqlite_was_inside = conn.execute("ROLLBACK").await.is_ok();
    let sqlx_thinks_inside = sqlx::Connection::is_in_transaction(conn);
    if sqlite_was_inside || sqlx_thinks_inside {
        tracing::warn!(
            sqlite_was_inside,
            sqlx_thinks_inside,
            "a database connection was given back inside a transaction: rolled back and closed"
        );
    }
    !(sqlite_was_inside || sqlx_thinks_inside)
}

/// `sqlite://PATH?mode=rwc` for a file path, its bytes percent-encoded where a URL needs it.
pub(super) fn sqlite_url(path: &std::path::Path) -> String {
    let mut url = String::from("sqlite://");
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"/._-".contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    url.push_str("?mode=rwc");
    url
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].find(':') {
            Some(c) => format!("{}:***{}", &url[..s + 3 + c], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}
