-- How many times an analysis of these bytes was started (superseded by jobs.attempts).
ALTER TABLE snapshots ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
