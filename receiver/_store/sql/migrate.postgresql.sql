-- receiver: the migration runner's own statements for PostgreSQL (receiver/_store/migrations.py).
-- Blocks start with "-- name: NAME"; migrate.sqlite.sql defines the same names.

-- name: create_table
CREATE TABLE IF NOT EXISTS receiver_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    -- sha256 of the migration file as applied: a file changed afterwards is reported
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: tables
-- Which of the ledger's tables exist: receipts without migrations is a 0.1.0 database (the
-- baseline, 0001), which predates the migrations table.
SELECT to_regclass('receiver_migrations') IS NOT NULL AS migrations,
       to_regclass('receiver_receipts') IS NOT NULL AS receipts;

-- name: applied
SELECT version, name, checksum FROM receiver_migrations ORDER BY version;

-- name: record
INSERT INTO receiver_migrations (version, name, checksum)
VALUES ($1, $2, $3)
ON CONFLICT (version) DO NOTHING;

-- name: try_lock
-- A session lock, not a transaction's: CREATE INDEX CONCURRENTLY runs outside any transaction.
-- Tried, never waited on: a session blocked inside pg_advisory_lock holds a snapshot, and
-- CREATE INDEX CONCURRENTLY waits for every older snapshot, so the two would deadlock.
SELECT pg_try_advisory_lock(7241901) AS locked;

-- name: unlock
SELECT pg_advisory_unlock(7241901) AS unlocked;

-- name: invalid_index
-- An index left INVALID by an interrupted CREATE INDEX CONCURRENTLY: IF NOT EXISTS would keep
-- it as it is, so the runner drops it before building it again.
SELECT true AS invalid
FROM pg_index i
WHERE i.indexrelid = to_regclass($1) AND NOT i.indisvalid;

-- name: drop_index
-- {index} is a validated identifier (an index name cannot be a parameter).
DROP INDEX CONCURRENTLY IF EXISTS {index};

-- The app's own migrations (receiver/_store/app_migrations.py): each file once, by its name.
-- name: app_create_table
CREATE TABLE IF NOT EXISTS receiver_app_migrations (
    name       TEXT PRIMARY KEY,
    checksum   TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- name: app_applied
SELECT name, checksum FROM receiver_app_migrations ORDER BY name;

-- name: app_record
INSERT INTO receiver_app_migrations (name, checksum) VALUES ($1, $2);
