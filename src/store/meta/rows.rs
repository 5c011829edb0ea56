//! The statements on one upload's row that run inside a caller's transaction: insert it,
//! read it back, copy the analysis state of the first upload of the same bytes into it, and
//! hold the content key while that is done.

use super::{Engine, SnapshotRow, columns, row, summary_json};

pub(super) type Conn = sqlx::AnyConnection;

pub(super) async fn insert(c: &mut Conn, r: &SnapshotRow, owner: &str) -> Result<(), sqlx::Error> {
    sqlx::query(concat!(
        "INSERT INTO snapshots (",
        columns!(),
        ", owner, arrived_us) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    ))
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
    .bind(owner)
    .bind(arrived_us())
    .execute(c)
    .await?;
    Ok(())
}

pub(super) async fn get(c: &mut Conn, id: &str) -> Result<Option<SnapshotRow>, sqlx::Error> {
    let r =
        sqlx::query(concat!("SELECT ", columns!(), " FROM snapshots WHERE id = $1")).bind(id).fetch_optional(c).await?;
    r.as_ref().map(row).transpose()
}

/// Holds the content key of `sha256` until the transaction ends, on Postgres. Every write that
/// reads or sets the analysis state of all uploads of some bytes takes it first: Postgres
/// (read committed) lets an `INSERT .. SELECT` copy a row's state while another transaction
/// updates that row, and the update never sees the new row, which then keeps "analyzing"
/// forever. SQLite runs one writer at a time, so there it needs nothing.
pub(super) async fn lock_content(c: &mut Conn, engine: Engine, sha256: &str) -> Result<(), sqlx::Error> {
    if engine == Engine::Postgres {
        sqlx::query("SELECT sha256 FROM contents WHERE sha256 = $1 FOR UPDATE").bind(sha256).fetch_optional(c).await?;
    }
    Ok(())
}

/// `r` with the analysis state of the first upload of the same bytes (the caller holds the
/// content key, see [`lock_content`]); None when there is no such upload.
pub(super) async fn insert_copy(
    c: &mut Conn,
    r: &SnapshotRow,
    owner: &str,
) -> Result<Option<SnapshotRow>, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO snapshots (id, sha256, name, note, bytes, status, error, verdict, created_at, run_id, rank, summary, owner, arrived_us)
         SELECT $1, sha256, $2, $3, bytes, status, error, verdict, $4, $5, $6, summary, $7, $8
         FROM snapshots WHERE sha256 = $9 ORDER BY created_at, id LIMIT 1",
    )
    .bind(&r.id)
    .bind(&r.name)
    .bind(&r.note)
    .bind(r.created_at)
    .bind(&r.run_id)
    .bind(r.rank)
    .bind(owner)
    .bind(arrived_us())
    .bind(&r.sha256)
    .execute(&mut *c)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    get(c, &r.id).await
}

/// Microseconds since the epoch: the order uploads arrived in.
pub(super) fn arrived_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
