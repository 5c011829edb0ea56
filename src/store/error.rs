//! Why the store failed, and which failures are a full disk (reported as 507, not a bug).

/// Why a read or write of the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Db(#[from] sqlx::Error),
    #[error("file error")]
    Io(#[from] std::io::Error),
    #[error("stored results are unreadable: {0}")]
    Corrupt(String),
    /// A setting that cannot work (a database or blob store URL).
    #[error("{0}")]
    Config(String),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("background task failed")]
    Task(#[from] tokio::task::JoinError),
}

impl StoreError {
    /// The error and its sources, for a log line or a message a person reads (the database
    /// error's own text says only "database error").
    pub fn with_sources(&self) -> String {
        let mut msg = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        msg
    }

    /// The disk (or the quota) is full: a condition to report (507), not a bug.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Io(e) => io_disk_full(e),
            StoreError::Db(sqlx::Error::Database(d)) => d.message().contains("disk is full"),
            StoreError::Db(sqlx::Error::Io(e)) => io_disk_full(e),
            _ => false,
        }
    }
}

/// ENOSPC or EDQUOT.
pub fn io_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded
}
