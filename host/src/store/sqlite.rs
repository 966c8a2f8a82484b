//! Records in one SQLite file: the embedded default (`sqlite:idem.db`).
//!
//! # Durability
//!
//! The file is in WAL mode. A primitive's reply is sent only after its
//! transaction has committed, so a response the guard reported as recorded
//! is in the file. What a commit survives depends on [`Synchronous`]:
//!
//! - [`Synchronous::Normal`] (the default): the commit is written to the WAL
//!   before the reply, without an fsync. It survives the process dying in any
//!   way (`kill -9`, a panic, the OOM killer). A power loss or kernel crash
//!   MAY roll back the last transactions committed since the WAL was last
//!   synced (at a checkpoint); the file stays consistent. A claim or response
//!   lost that way makes a retry run the handler again: at-least-once across
//!   power loss, exactly-once across process crashes.
//! - [`Synchronous::Full`]: the WAL is fsynced at every commit (once per batch,
//!   see below), so a recorded response also survives power loss, given a
//!   disk that honours fsync.
//!
//! # Threads
//!
//! SQLite calls block, so none runs on the async runtime. All writes go to one
//! dedicated writer thread over a bounded channel (SQLite allows one writer at
//! a time anyway). The thread drains whatever is queued and applies it in one
//! `BEGIN IMMEDIATE` transaction — group commit: each primitive still runs
//! whole and alone (the thread runs them one after another), but 32 concurrent
//! callers share one commit, and one fsync under `Full`. If any statement of a
//! batch fails, the batch is rolled back and each primitive is retried in its
//! own transaction, so one failure never fails its neighbours.
//!
//! A lone write (no other under way, and none overlapping in the last 10 ms)
//! does not wait for the thread: it runs in place, in its own transaction,
//! inside tokio's `block_in_place`, which first hands the runtime's other
//! tasks on this worker to another thread. Waking the writer thread and then
//! the caller costs a lone caller more than the write itself. `get` and
//! `list` read on separate connections (WAL readers never block the writer):
//! a lone read in place in the same way, concurrent ones (and any on a
//! current-thread runtime) through `spawn_blocking`.
//!
//! ```no_run
//! use idem::store::{SqliteStore, SqliteOptions, Synchronous};
//!
//! let store = SqliteStore::open("idem.db", SqliteOptions { synchronous: Synchronous::Full, ..Default::default() })
//!     .expect("open idem.db");
//! # drop(store);
//! ```

use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, State, Store, StoreError};
use crate::Response;
use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

const STORE: &str = "sqlite";

/// The schema this build writes, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

/// Marks the file as idem's (`PRAGMA application_id`, ASCII "idem").
const APPLICATION_ID: i64 = 0x6964_656d;

/// Migrations, in order: `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &["
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
"];

/// Writes queued beyond this make callers wait (backpressure, not memory growth).
const QUEUE: usize = 4096;
/// At most this many primitives share one transaction.
const MAX_BATCH: usize = 256;
/// Idle read connections kept open.
const MAX_IDLE_READERS: usize = 8;

/// When a commit is on disk; see the module docs for what each survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Survives process crashes; a power loss may roll back the last commits.
    #[default]
    Normal,
    /// Survives power loss too: an fsync per commit (per batch).
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }

    /// Parses `normal` or `full` (any case).
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "normal" => Some(Synchronous::Normal),
            "full" => Some(Synchronous::Full),
            _ => None,
        }
    }
}

/// How to open the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    pub synchronous: Synchronous,
    /// How long a statement waits for another process's write lock before
    /// the primitive fails as unavailable.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A store in one SQLite file, shared by every clone (and by other processes
/// opening the same file: SQLite's locks keep each primitive atomic).
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    options: SqliteOptions,
    writes: Option<mpsc::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    side: Arc<WriteSide>,
    readers: Mutex<Vec<Connection>>,
    /// Writes and reads under way, to tell a lone caller from a crowd.
    writing: Crowd,
    reading: Crowd,
}

/// The one write connection. The writer thread locks it for each batch it
/// takes from the queue; a lone caller that finds it free runs its primitive
/// on it in place (see [`SqliteStore::write`]).
struct WriteSide {
    conn: Mutex<Connection>,
    before_commit: OnceLock<BeforeCommit>,
}

/// See [`SqliteStore::set_before_commit`].
type BeforeCommit = Box<dyn Fn(usize) + Send + Sync>;

impl Drop for Inner {
    /// Closing the queue ends the writer thread after the writes already
    /// queued; waiting for it means the file is closed when the store is gone.
    fn drop(&mut self) {
        self.writes.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, creates or migrates
    /// its schema, and starts the writer thread. Blocks: call it from
    /// `spawn_blocking` on an async runtime.
    ///
    /// Fails when the directory does not exist, the file is not a database or
    /// not idem's, or its schema is newer than this build understands.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, OpenError> {
        let path = path.as_ref().to_path_buf();
        let fail = |reason: String| OpenError::Unreachable {
            store: STORE,
            url: path.display().to_string(),
            reason,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(fail(format!(
                "the directory {} does not exist",
                dir.display()
            )));
        }
        if path.is_dir() {
            return Err(fail("it is a directory, not a database file".into()));
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| fail(e.to_string()))?;
        setup_writer(&conn, &options).map_err(fail)?;
        migrate(&conn).map_err(fail)?;

        let (writes, queue) = mpsc::channel(QUEUE);
        let side = Arc::new(WriteSide {
            conn: Mutex::new(conn),
            before_commit: OnceLock::new(),
        });
        let thread_side = side.clone();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || write_loop(&thread_side, queue))
            .map_err(|e| fail(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                options,
                writes: Some(writes),
                writer: Some(thread),
                side,
                readers: Mutex::new(Vec::new()),
                writing: Crowd::default(),
                reading: Crowd::default(),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn options(&self) -> &SqliteOptions {
        &self.inner.options
    }

    /// Test support, for the crash tests' `idem debug-crash` only: `hook`
    /// runs inside every write transaction, after its
    /// statements and before its `COMMIT`, with the number of primitives in
    /// it — so a test can stop a process there and kill it. Set once per
    /// store; returns false if one was already set. Nothing else sets it.
    #[doc(hidden)]
    pub fn set_before_commit(&self, hook: impl Fn(usize) + Send + Sync + 'static) -> bool {
        self.inner.side.before_commit.set(Box::new(hook)).is_ok()
    }

    /// Applies `write` and answers after its commit. A lone write (see
    /// [`Crowd`]; the write connection free) runs here, in place, on a
    /// thread the runtime has handed its other tasks away from
    /// (`block_in_place`): it pays no trip to the writer thread and back,
    /// which costs more than the write itself. Under concurrent writes it
    /// joins the queue and shares the writer thread's next commit.
    async fn write(&self, write: Write) -> Result<Written, StoreError> {
        let queue = self
            .inner
            .writes
            .as_ref()
            .ok_or_else(|| unavailable("the store is closed"))?;
        let (_writing, alone) = self.inner.writing.enter();
        if alone
            && may_block_in_place()
            && let Some(conn) = try_lock(&self.inner.side.conn)
        {
            let hook = &self.inner.side.before_commit;
            return tokio::task::block_in_place(|| apply_alone(&conn, &write, hook));
        }
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { write, reply })
            .await
            .map_err(|_| unavailable("the writer thread has stopped"))?;
        answer
            .await
            .map_err(|_| unavailable("the writer thread stopped before answering"))?
    }

    /// Runs `read` on a pooled read connection, off the async runtime. A
    /// lone read runs in place once the runtime has handed this thread's
    /// other tasks away (`block_in_place`); concurrent reads (or any, on a
    /// current-thread runtime) run on the blocking pool, which spreads a
    /// crowd over its threads with fewer hand-offs.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (_reading, alone) = self.inner.reading.enter();
        if alone && may_block_in_place() {
            return tokio::task::block_in_place(|| Self::read_now(&self.inner, read));
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || Self::read_now(&inner, read))
            .await
            .map_err(|e| unavailable(&format!("read task failed: {e}")))?
    }

    /// Runs `read` on a pooled read connection, on this thread.
    fn read_now<T>(
        inner: &Inner,
        read: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = inner
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&inner.path, &inner.options).map_err(|e| unavailable(&e))?,
        };
        let result = read(&conn);
        let mut idle = inner
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        result
    }
}

/// After operations last overlapped, how long before one counts as alone
/// again. Under steady concurrent load they overlap far more often than
/// this, so they keep sharing the writer thread's commits (and the blocking
/// pool) instead of each taking a worker thread for itself.
const QUIET: Duration = Duration::from_millis(10);

/// Tells a lone operation from one in a crowd: how many are under way, and
/// when two last overlapped.
struct Crowd {
    under_way: AtomicUsize,
    /// Milliseconds from `since` to the last overlap, plus one; 0 for never.
    overlapped_at: AtomicU64,
    since: Instant,
}

impl Default for Crowd {
    fn default() -> Self {
        Crowd {
            under_way: AtomicUsize::new(0),
            overlapped_at: AtomicU64::new(0),
            since: Instant::now(),
        }
    }
}

impl Crowd {
    /// Counts one operation in until the guard drops, and says whether it
    /// is alone: none other under way, and none overlapping for `QUIET`.
    fn enter(&self) -> (Busy<'_>, bool) {
        let others = self.under_way.fetch_add(1, Ordering::AcqRel);
        let now = u64::try_from(self.since.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let busy = Busy(&self.under_way);
        if others > 0 {
            self.overlapped_at.store(now, Ordering::Relaxed);
            return (busy, false);
        }
        let last = self.overlapped_at.load(Ordering::Relaxed);
        let quiet = u64::try_from(QUIET.as_millis()).unwrap_or(u64::MAX);
        (busy, last == 0 || now.saturating_sub(last) >= quiet)
    }
}

/// One operation under way, counted until dropped.
struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether this thread may block in place: on a worker of a multi-thread
/// tokio runtime (which hands its other tasks to another thread first), or
/// in its `block_on`. A current-thread runtime cannot hand its tasks away.
fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The lock if it is free now. A lock poisoned by a panic still holds a
/// usable connection: each transaction starts by rolling back any left open.
fn try_lock<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn unavailable(reason: &str) -> StoreError {
    StoreError::Unavailable {
        store: STORE,
        reason: reason.to_owned(),
    }
}

fn sql_unavailable(e: &rusqlite::Error) -> StoreError {
    unavailable(&e.to_string())
}

fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        store: STORE,
        key: key.to_owned(),
        reason: reason.into(),
    }
}

fn setup_writer(conn: &Connection, options: &SqliteOptions) -> Result<(), String> {
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

fn open_reader(path: &Path, options: &SqliteOptions) -> Result<Connection, String> {
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
fn migrate(conn: &Connection) -> Result<(), String> {
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

/// A primitive for the writer thread.
enum Write {
    Insert {
        key: String,
        record: Record,
        now_ms: u64,
    },
    Replace {
        key: String,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    },
    Delete {
        key: String,
        expected_version: Option<u64>,
    },
    Purge {
        now_ms: u64,
        limit: usize,
    },
}

enum Written {
    Insert(InsertOutcome),
    Replace(Option<u64>),
    Delete(bool),
    Purge(usize),
}

struct Job {
    write: Write,
    reply: oneshot::Sender<Result<Written, StoreError>>,
}

/// The writer thread: takes what is queued, applies it in one transaction,
/// and answers only after the commit. Ends when every sender is gone.
fn write_loop(side: &WriteSide, mut queue: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let answers = {
            let conn = side
                .conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let writes = batch.iter().map(|job| &job.write);
            match apply_batch(&conn, writes, &side.before_commit) {
                Ok(results) => results,
                // Rolled back: nothing of the batch is written. Alone, or
                // locked out by another process for the whole busy timeout:
                // retrying each would only wait that long again.
                Err(e) if batch.len() == 1 || is_busy(&e) => {
                    batch.iter().map(|_| Err(sql_unavailable(&e))).collect()
                }
                // Otherwise retry each alone, so only the primitive that
                // fails reports the failure.
                Err(_) => batch
                    .iter()
                    .map(|job| apply_alone(&conn, &job.write, &side.before_commit))
                    .collect(),
            }
        };
        for (job, answer) in batch.drain(..).zip(answers) {
            let _ = job.reply.send(answer);
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A record's columns, in the order [`decode`] reads them.
macro_rules! columns {
    () => {
        "key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body"
    };
}
const COLUMNS: &str = columns!();

/// The write statements. Each is prepared once per connection and found
/// again in its statement cache.
mod sql {
    pub const BEGIN: &str = "BEGIN IMMEDIATE";
    pub const COMMIT: &str = "COMMIT";
    pub const SELECT: &str = concat!("SELECT ", columns!(), " FROM records WHERE key = ?1");
    pub const INSERT: &str = "INSERT INTO records (key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
    /// Inside the write transaction, so nothing changes the row between the
    /// read that found it expired and this write.
    pub const OVERWRITE: &str =
        "UPDATE records SET version = ?2, fingerprint = ?3, state = ?4, lease_until_ms = ?5,
         expires_at_ms = ?6, status = ?7, headers = ?8, body = ?9
         WHERE key = ?1";
    pub const REPLACE: &str =
        "UPDATE records SET version = version + 1, fingerprint = ?3, state = ?4,
         lease_until_ms = ?5, expires_at_ms = ?6, status = ?7, headers = ?8, body = ?9
         WHERE key = ?1 AND version = ?2 AND expires_at_ms > ?10";
    pub const DELETE: &str = "DELETE FROM records WHERE key = ?1 AND (?2 IS NULL OR version = ?2)";
    pub const PURGE: &str = "DELETE FROM records WHERE rowid IN
         (SELECT rowid FROM records WHERE expires_at_ms <= ?1 LIMIT ?2)";
}

/// Applies one write in its own transaction.
fn apply_alone(
    conn: &Connection,
    write: &Write,
    before_commit: &OnceLock<BeforeCommit>,
) -> Result<Written, StoreError> {
    match apply_batch(conn, std::iter::once(write), before_commit) {
        Ok(mut results) => results.pop().expect("one result"),
        Err(e) => Err(sql_unavailable(&e)),
    }
}

/// Applies `writes` in one transaction. A database error rolls all of them
/// back and is returned; a record that does not decode is that write's
/// answer only (it is found by a read, so nothing was written for it).
fn apply_batch<'w>(
    conn: &Connection,
    writes: impl ExactSizeIterator<Item = &'w Write>,
    before_commit: &OnceLock<BeforeCommit>,
) -> Result<Vec<Result<Written, StoreError>>, rusqlite::Error> {
    if !conn.is_autocommit() {
        // Left open by a panic mid-transaction: none of it was answered.
        conn.execute_batch("ROLLBACK")?;
    }
    conn.prepare_cached(sql::BEGIN)?.execute([])?;
    let mut results = Vec::with_capacity(writes.len());
    for write in writes {
        match apply(conn, write) {
            Ok(result) => results.push(result),
            Err(e) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                return Err(e);
            }
        }
    }
    if let Some(hook) = before_commit.get() {
        hook(results.len());
    }
    if let Err(e) = conn
        .prepare_cached(sql::COMMIT)
        .and_then(|mut c| c.execute([]))
    {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return Err(e);
    }
    Ok(results)
}

/// One primitive, inside the batch's write transaction (`BEGIN IMMEDIATE`:
/// no other connection or process writes until it commits), so a read and
/// the write it decides are one atomic step.
fn apply(conn: &Connection, write: &Write) -> Result<Result<Written, StoreError>, rusqlite::Error> {
    Ok(match write {
        Write::Insert {
            key,
            record,
            now_ms,
        } => {
            // Read first: a live record (a replay, a request in flight) is
            // answered with one read and nothing written.
            let held = conn
                .prepare_cached(sql::SELECT)?
                .query_row([key], |row| {
                    let version: i64 = row.get(1)?;
                    let expires_at_ms: i64 = row.get(5)?;
                    let live = expires_at_ms > int(*now_ms);
                    Ok((version, live.then(|| decode(key, row))))
                })
                .optional()?;
            match held {
                None => {
                    let (status, headers, body) = response_columns(record.response.as_ref());
                    conn.prepare_cached(sql::INSERT)?.execute(params![
                        key,
                        record.fingerprint,
                        record.state.as_str(),
                        int(record.lease_until_ms),
                        int(record.expires_at_ms),
                        status,
                        headers,
                        body
                    ])?;
                    Ok(Written::Insert(InsertOutcome::Inserted(1)))
                }
                Some((_, Some(live))) => live.map(|e| Written::Insert(InsertOutcome::Existing(e))),
                // Expired: overwritten at its version + 1.
                Some((version, None)) => match u64::try_from(version) {
                    Ok(old) => {
                        let version = old.saturating_add(1);
                        let (status, headers, body) = response_columns(record.response.as_ref());
                        conn.prepare_cached(sql::OVERWRITE)?.execute(params![
                            key,
                            int(version),
                            record.fingerprint,
                            record.state.as_str(),
                            int(record.lease_until_ms),
                            int(record.expires_at_ms),
                            status,
                            headers,
                            body
                        ])?;
                        Ok(Written::Insert(InsertOutcome::Inserted(version)))
                    }
                    Err(_) => Err(corrupt(key, format!("version {version} is negative"))),
                },
            }
        }
        Write::Replace {
            key,
            expected_version,
            record,
            now_ms,
        } => {
            let (status, headers, body) = response_columns(record.response.as_ref());
            let replaced = conn.prepare_cached(sql::REPLACE)?.execute(params![
                key,
                int(*expected_version),
                record.fingerprint,
                record.state.as_str(),
                int(record.lease_until_ms),
                int(record.expires_at_ms),
                status,
                headers,
                body,
                int(*now_ms)
            ])?;
            Ok(Written::Replace(
                (replaced > 0).then(|| expected_version.saturating_add(1)),
            ))
        }
        Write::Delete {
            key,
            expected_version,
        } => {
            let deleted = conn
                .prepare_cached(sql::DELETE)?
                .execute(params![key, expected_version.map(int)])?;
            Ok(Written::Delete(deleted > 0))
        }
        Write::Purge { now_ms, limit } => {
            let purged = conn.prepare_cached(sql::PURGE)?.execute(params![
                int(*now_ms),
                i64::try_from(*limit).unwrap_or(i64::MAX)
            ])?;
            Ok(Written::Purge(purged))
        }
    })
}

/// Times and versions are u64; SQLite integers are i64. Past `i64::MAX`
/// (the year 292 million) a time saturates, which keeps every comparison right.
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn response_columns(response: Option<&Response>) -> (Option<u16>, Option<Vec<u8>>, Option<&[u8]>) {
    match response {
        Some(r) => (
            Some(r.status),
            Some(encode_headers(&r.headers)),
            Some(r.body.as_slice()),
        ),
        None => (None, None, None),
    }
}

/// Headers as one BLOB: a u32 count, then for each header a u32 length and
/// the name's UTF-8 bytes, a u32 length and the value's bytes; all big-endian.
fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let size = 4 + headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// The inverse of [`encode_headers`]; says what is wrong with a blob that is not one.
fn decode_headers(mut blob: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    fn take<'a>(blob: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
        if blob.len() < n {
            return Err(format!(
                "headers blob ends inside {what} ({n} bytes needed, {} left)",
                blob.len()
            ));
        }
        let (head, rest) = blob.split_at(n);
        *blob = rest;
        Ok(head)
    }
    fn length(blob: &mut &[u8], what: &str) -> Result<usize, String> {
        let bytes = take(blob, 4, what)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize)
    }
    let count = length(&mut blob, "the header count")?;
    // Every header takes at least 8 bytes: a count beyond that is corrupt, not a huge allocation.
    if count > blob.len() / 8 {
        return Err(format!(
            "headers blob claims {count} headers in {} bytes",
            blob.len()
        ));
    }
    let mut headers = Vec::with_capacity(count);
    for i in 0..count {
        let n = length(&mut blob, "a header name length")?;
        let name = std::str::from_utf8(take(&mut blob, n, "a header name")?)
            .map_err(|e| format!("header {i}'s name is not UTF-8: {e}"))?
            .to_owned();
        let n = length(&mut blob, "a header value length")?;
        let value = take(&mut blob, n, "a header value")?.to_vec();
        headers.push((name, value));
    }
    if !blob.is_empty() {
        return Err(format!(
            "headers blob has {} bytes after its {count} headers",
            blob.len()
        ));
    }
    Ok(headers)
}

/// One row as an entry, or `Corrupt` naming the key and what is wrong.
fn decode(key: &str, row: &Row<'_>) -> Result<Entry, StoreError> {
    let bad = |e: rusqlite::Error| corrupt(key, e.to_string());
    let unsigned = |column: &str, v: i64| {
        u64::try_from(v).map_err(|_| corrupt(key, format!("{column} {v} is negative")))
    };
    let version = unsigned("version", row.get::<_, i64>(1).map_err(bad)?)?;
    let fingerprint: String = row.get(2).map_err(bad)?;
    let state_text: String = row.get(3).map_err(bad)?;
    let state = State::parse(&state_text)
        .ok_or_else(|| corrupt(key, format!("unknown state {state_text:?}")))?;
    let lease_until_ms = unsigned("lease_until_ms", row.get::<_, i64>(4).map_err(bad)?)?;
    let expires_at_ms = unsigned("expires_at_ms", row.get::<_, i64>(5).map_err(bad)?)?;
    let status: Option<i64> = row.get(6).map_err(bad)?;
    let headers: Option<Vec<u8>> = row.get(7).map_err(bad)?;
    let body: Option<Vec<u8>> = row.get(8).map_err(bad)?;
    let response = match (status, headers, body) {
        (None, None, None) => None,
        (Some(status), Some(headers), Some(body)) => Some(Response {
            status: u16::try_from(status)
                .map_err(|_| corrupt(key, format!("status {status} is not an HTTP status")))?,
            headers: decode_headers(&headers).map_err(|reason| corrupt(key, reason))?,
            body,
        }),
        _ => {
            return Err(corrupt(
                key,
                "the response's status, headers and body are only partly present",
            ));
        }
    };
    Ok(Entry {
        record: Record {
            fingerprint,
            state,
            lease_until_ms,
            expires_at_ms,
            response,
        },
        version,
    })
}

/// The smallest string above every string starting with `prefix`, or `None`
/// when there is none; key order is UTF-8 byte order, which is char order.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[async_trait]
impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        STORE
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        let key = key.to_owned();
        self.read(move |conn| {
            let row = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM records WHERE key = ?1 AND expires_at_ms > ?2"
                ))
                .and_then(|mut s| {
                    s.query_row(params![key, int(now_ms)], |row| Ok(decode(&key, row)))
                        .optional()
                })
                .map_err(|e| sql_unavailable(&e))?;
            row.transpose()
        })
        .await
    }

    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        match self
            .write(Write::Insert {
                key: key.to_owned(),
                record,
                now_ms,
            })
            .await?
        {
            Written::Insert(outcome) => Ok(outcome),
            _ => unreachable!("the writer answers in kind"),
        }
    }

    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        match self
            .write(Write::Replace {
                key: key.to_owned(),
                expected_version,
                record,
                now_ms,
            })
            .await?
        {
            Written::Replace(version) => Ok(version),
            _ => unreachable!("the writer answers in kind"),
        }
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        match self
            .write(Write::Delete {
                key: key.to_owned(),
                expected_version,
            })
            .await?
        {
            Written::Delete(deleted) => Ok(deleted),
            _ => unreachable!("the writer answers in kind"),
        }
    }

    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let query = query.clone();
        self.read(move |conn| {
            let end = prefix_end(&query.prefix);
            let sql = format!(
                "SELECT {COLUMNS} FROM records
                 WHERE key >= ?1 AND (?2 IS NULL OR key < ?2) AND (?3 IS NULL OR key > ?3)
                   AND (?4 IS NULL OR state = ?4) AND expires_at_ms > ?5
                 ORDER BY key LIMIT ?6"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(|e| sql_unavailable(&e))?;
            let rows = stmt
                .query_map(
                    params![
                        query.prefix,
                        end,
                        query.after,
                        query.state.map(State::as_str),
                        int(now_ms),
                        i64::try_from(query.limit).unwrap_or(i64::MAX)
                    ],
                    |row| {
                        let key: String = row.get(0)?;
                        let entry = decode(&key, row);
                        Ok((key, entry))
                    },
                )
                .map_err(|e| sql_unavailable(&e))?;
            let mut out = Vec::new();
            for row in rows {
                let (key, entry) = row.map_err(|e| sql_unavailable(&e))?;
                out.push((key, entry?));
            }
            Ok(out)
        })
        .await
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        match self.write(Write::Purge { now_ms, limit }).await? {
            Written::Purge(n) => Ok(n),
            _ => unreachable!("the writer answers in kind"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_blobs_are_named() {
        let headers = vec![
            ("content-type".to_owned(), b"text/plain".to_vec()),
            (String::new(), vec![0, 255]),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
        assert_eq!(decode_headers(&encode_headers(&[])).unwrap(), vec![]);
        let blob = encode_headers(&headers);
        assert!(
            decode_headers(&blob[..blob.len() - 1])
                .unwrap_err()
                .contains("ends inside a header value")
        );
        let mut trailing = blob.clone();
        trailing.push(0);
        assert!(
            decode_headers(&trailing)
                .unwrap_err()
                .contains("1 bytes after")
        );
        assert!(
            decode_headers(&[0xff, 0xff, 0xff, 0xff])
                .unwrap_err()
                .contains("claims 4294967295 headers")
        );
        assert!(decode_headers(b"").unwrap_err().contains("header count"));
        let bad_name = [0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0];
        assert!(decode_headers(&bad_name).unwrap_err().contains("not UTF-8"));
    }

    /// The headers column as this layout has always written it: a file
    /// written before must still decode, and be written again byte for byte.
    #[test]
    fn stored_header_blobs_still_decode() {
        let blob = b"\0\0\0\x02\0\0\0\x0ccontent-type\0\0\0\ntext/plain\0\0\0\x01x\0\0\0\x02\0\xff";
        let headers = vec![
            ("content-type".to_owned(), b"text/plain".to_vec()),
            ("x".to_owned(), vec![0, 255]),
        ];
        assert_eq!(encode_headers(&headers), blob);
        assert_eq!(decode_headers(blob).unwrap(), headers);
    }

    #[test]
    fn prefix_end_bounds_exactly_the_keys_with_the_prefix() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_end("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(prefix_end(&format!("a{}", char::MAX)).as_deref(), Some("b"));
        assert_eq!(prefix_end(&char::MAX.to_string()), None);
        for key in ["ab", "ab\u{10ffff}", "abz", "ab/1"] {
            assert!(
                key >= "ab" && key < prefix_end("ab").unwrap().as_str(),
                "{key}"
            );
        }
    }
}
