-- Content stored once: the unique key every upload of the same bytes meets, so two uploads at
-- once store one blob and queue one analysis.
CREATE TABLE contents (
    sha256 TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
INSERT INTO contents (sha256, created_at)
    SELECT sha256, MIN(created_at) FROM snapshots GROUP BY sha256;
-- The analysis queue: a row per content to analyse, claimed under a lease that its analyser
-- renews; a lease that runs out (the analyser died) lets another take it.
CREATE TABLE jobs (
    sha256 TEXT PRIMARY KEY,
    attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until INTEGER,
    queued_at INTEGER NOT NULL
);
INSERT INTO jobs (sha256, attempts, queued_at)
    SELECT sha256, MAX(attempts), MIN(created_at) FROM snapshots
    WHERE status IN ('queued', 'analyzing') GROUP BY sha256;
CREATE INDEX jobs_queued ON jobs(queued_at);
