CREATE TABLE snapshots (
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
CREATE INDEX snapshots_created ON snapshots(created_at);
