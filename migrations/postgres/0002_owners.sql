-- Who may delete an upload, and the run it started: the sha256 of the delete key its upload
-- was given (NULL for uploads made before keys: only the server's token deletes those).
ALTER TABLE snapshots ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN owner TEXT;
-- When an upload arrived, in microseconds: `created_at` (seconds) cannot order a job's ranks
-- uploaded within one second, and the first upload of a rank is the one that keeps it.
ALTER TABLE snapshots ADD COLUMN arrived_us BIGINT NOT NULL DEFAULT 0;
