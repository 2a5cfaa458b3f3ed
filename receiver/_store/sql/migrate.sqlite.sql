-- receiver: the migration runner's own statements for SQLite (receiver/_store/migrations.py).
-- Same names as migrate.postgresql.sql. SQLite has no advisory lock: the whole run is one
-- BEGIN IMMEDIATE transaction, which one process at a time can hold; try_lock, unlock,
-- invalid_index and drop_index are never run here.

-- name: create_table
CREATE TABLE IF NOT EXISTS receiver_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: tables
SELECT EXISTS (SELECT 1 FROM sqlite_master
               WHERE type = 'table' AND name = 'receiver_migrations') AS migrations,
       EXISTS (SELECT 1 FROM sqlite_master
               WHERE type = 'table' AND name = 'receiver_receipts') AS receipts;

-- name: applied
SELECT version, name, checksum FROM receiver_migrations ORDER BY version;

-- name: record
INSERT INTO receiver_migrations (version, name, checksum)
VALUES ($1, $2, $3)
ON CONFLICT (version) DO NOTHING;

-- name: try_lock
SELECT 1 AS locked;

-- name: unlock
SELECT 1 AS unlocked;

-- name: invalid_index
SELECT 1 AS invalid WHERE $1 IS NULL AND 0;

-- name: drop_index
DROP INDEX IF EXISTS {index};

-- The app's own migrations (receiver/_store/app_migrations.py): each file once, by its name.
-- name: app_create_table
CREATE TABLE IF NOT EXISTS receiver_app_migrations (
    name       TEXT PRIMARY KEY,
    checksum   TEXT NOT NULL,
    applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: app_applied
SELECT name, checksum FROM receiver_app_migrations ORDER BY name;

-- name: app_record
INSERT INTO receiver_app_migrations (name, checksum) VALUES ($1, $2);
