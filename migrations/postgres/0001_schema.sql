-- The schema SQLite reached in its migrations 1 to 4, in one step (Postgres came later).
CREATE TABLE snapshots (
    id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    name TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    bytes BIGINT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    verdict TEXT,
    created_at BIGINT NOT NULL,
    analyzed_at BIGINT,
    run_id TEXT,
    rank BIGINT,
    summary TEXT,
    attempts BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX snapshots_sha256 ON snapshots(sha256);
CREATE INDEX snapshots_created ON snapshots(created_at);
CREATE INDEX snapshots_run ON snapshots(run_id, rank);
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX runs_key ON runs(key);
CREATE TABLE contents (
    sha256 TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);
CREATE TABLE jobs (
    sha256 TEXT PRIMARY KEY,
    attempts BIGINT NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until BIGINT,
    queued_at BIGINT NOT NULL
);
CREATE INDEX jobs_queued ON jobs(queued_at);
