//! The file's connections and schema: the writer's pragmas, WAL mode, the
//! read connections, and the migrations.

use super::SqliteOptions;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::{Duration, Instant};

/// The schema this build writes, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 3;

/// Marks the file as idem's (`PRAGMA application_id`, ASCII "idem").
const APPLICATION_ID: i64 = 0x6964_656d;

/// Migrations, in order: `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE records (
        key            TEXT PRIMARY KEY NOT NULL,
        version        INTEGER NOT NULL,
        fingerprint    TEXT NOT NULL,
        state          TEXT NOT NULL,
        lease_until_ms INTEGER NOT NULL,
        expires_at_ms  INTEGER NOT NULL,
        -- The response: all three NULL when there is none.
        status         INTEGER,
        headers        BLOB,
        body           BLOB
    ) STRICT;
    CREATE INDEX records_expires_at ON records (expires_at_ms);
",
    "
    -- Contract 0.2: the holder id of the claim that wrote the record (0 in
    -- the records 0.1 hosts wrote, which keep working), and the last
    -- checkpoint: both NULL when there is none.
    ALTER TABLE records ADD COLUMN holder INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE records ADD COLUMN phase TEXT;
    ALTER TABLE records ADD COLUMN checkpoint BLOB;
",
    // Contract 0.3: the file's time authority (`clock.rs`). The records
    // are as 0.2 wrote them.
    super::clock::SCHEMA,
];

pub(super) fn setup_writer(conn: &Connection, options: &SqliteOptions) -> Result<(), String> {
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| e.to_string())?;
    let mode = enable_wal(conn, options.busy_timeout)
        .map_err(|e| format!("cannot read it as a database: {e}"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!(
            "cannot use WAL mode (the file system gave journal mode {mode:?})"
        ));
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {};",
        options.synchronous.pragma()
    ))
    .map_err(|e| e.to_string())?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(())
}

/// Switches the file to WAL mode and returns the mode it is in. SQLite does
/// not wait out a busy file for this pragma (another store opening the same
/// new file may be switching it or writing its schema at that moment), so
/// it is retried here, for as long as the busy timeout allows.
fn enable_wal(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<String> {
    let deadline = Instant::now() + busy_timeout;
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            result => return result,
        }
    }
}

pub(super) fn open_reader(path: &Path, options: &SqliteOptions) -> Result<Connection, String> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open a read connection to {}: {e}", path.display()))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| e.to_string())?;
    // Reads only: a bug here cannot write around the writer thread.
    conn.execute_batch("PRAGMA query_only = 1;")
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// Creates the schema in a new file, or brings an older one up to
/// `SCHEMA_VERSION`, in one transaction. Refuses files that are not idem's
/// and schemas newer than this build.
pub(super) fn migrate(conn: &Connection) -> Result<(), String> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| format!("cannot lock it to check its schema: {e}"))?;
    let result = (|| {
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        let app: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        if version > SCHEMA_VERSION {
            return Err(format!(
                "its schema version is {version}, newer than this idem understands ({SCHEMA_VERSION}); use a newer idem"
            ));
        }
        if version == 0 {
            let tables: i64 = conn
                .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
                .map_err(|e| e.to_string())?;
            if tables > 0 && app != APPLICATION_ID {
                return Err(format!(
                    "it is not an idem database: it has {tables} schema objects and no idem schema version"
                ));
            }
        } else if app != APPLICATION_ID {
            return Err(format!(
                "it is not an idem database (application_id {app:#x})"
            ));
        }
        for (from, sql) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            conn.execute_batch(sql)
                .map_err(|e| format!("migrating the schema from version {from}: {e}"))?;
        }
        conn.execute_batch(&format!(
            "PRAGMA user_version = {SCHEMA_VERSION}; PRAGMA application_id = {APPLICATION_ID};"
        ))
        .map_err(|e| e.to_string())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(|e| e.to_string()),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
