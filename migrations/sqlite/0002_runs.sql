-- Each upload its own id (the same bytes are stored and analysed once), runs of ranks, and
-- each snapshot's one-line summary for a run's page.
DROP INDEX snapshots_sha256;
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
CREATE UNIQUE INDEX runs_key ON runs(key);
