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
//! A claim (`insert`) reads first, on a read connection, and answers a live
//! record from that read: a replay or a request in flight needs no write
//! lock, so it is answered while another process holds the file's write
//! lock (`BEGIN IMMEDIATE`), which makes every write wait out the busy
//! timeout. Only an absent or expired key goes on to the writer.
//!
//! ```no_run
//! use idem::store::{SqliteStore, SqliteOptions, Synchronous};
//!
//! let store = SqliteStore::open("idem.db", SqliteOptions { synchronous: Synchronous::Full, ..Default::default() })
//!     .expect("open idem.db");
//! # drop(store);
//! ```

mod clock;
mod crowd;
mod row;
mod schema;
mod writer;

use super::codec::{driver_failed, int, unavailable};
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, Result, State, Store};
use crate::clock::Clock;
use async_trait::async_trait;
use crowd::{Crowd, may_block_in_place, try_lock};
use row::{COLUMNS, decode, prefix_end};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use schema::{migrate, open_reader, setup_writer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use writer::{Job, Write, WriteSide, Written, apply_alone, write_loop};

const STORE: &str = "sqlite";

/// Writes queued beyond this make callers wait (backpressure, not memory growth).
const QUEUE: usize = 4096;
/// Rows one purge write deletes at the most: a large purge goes in slices so
/// that the one writer is never held by it for long.
const PURGE_SLICE: usize = 128;
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
    /// The file's time authority (`clock.rs`).
    clock: Arc<dyn Clock>,
    /// Writes and reads under way, to tell a lone caller from a crowd.
    writing: Crowd,
    reading: Crowd,
}

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
        let clock = clock::anchor(&conn).map_err(fail)?;

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
                clock,
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

    /// Test support, for the same hook: how many writes wait in the writer
    /// thread's queue (not counting the batch it is applying).
    #[doc(hidden)]
    pub fn queued_writes(&self) -> usize {
        let queue = self.inner.writes.as_ref();
        queue.map_or(0, |q| q.max_capacity() - q.capacity())
    }

    /// Applies `write` and answers after its commit. A lone write (see
    /// [`Crowd`]; the write connection free) runs here, in place, on a
    /// thread the runtime has handed its other tasks away from
    /// (`block_in_place`): it pays no trip to the writer thread and back,
    /// which costs more than the write itself. Under concurrent writes it
    /// joins the queue and shares the writer thread's next commit.
    async fn write(&self, write: Write) -> Result<Written> {
        let queue = self
            .inner
            .writes
            .as_ref()
            .ok_or_else(|| unavailable(STORE, "the store is closed"))?;
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
            .map_err(|_| unavailable(STORE, "the writer thread has stopped"))?;
        answer
            .await
            .map_err(|_| unavailable(STORE, "the writer thread stopped before answering"))?
    }

    /// Runs `read` on a pooled read connection, off the async runtime. A
    /// lone read runs in place once the runtime has handed this thread's
    /// other tasks away (`block_in_place`); concurrent reads (or any, on a
    /// current-thread runtime) run on the blocking pool, which spreads a
    /// crowd over its threads with fewer hand-offs.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (_reading, alone) = self.inner.reading.enter();
        if alone && may_block_in_place() {
            return tokio::task::block_in_place(|| Self::read_now(&self.inner, read));
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || Self::read_now(&inner, read))
            .await
            .map_err(|e| unavailable(STORE, format!("read task failed: {e}")))?
    }

    /// Runs `read` on a pooled read connection, on this thread.
    fn read_now<T>(inner: &Inner, read: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = inner
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&inner.path, &inner.options).map_err(|e| unavailable(STORE, e))?,
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

#[async_trait]
impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        STORE
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
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
                .map_err(|e| driver_failed(STORE, e))?;
            row.transpose()
        })
        .await
    }

    /// Reads first, on a read connection: a live record (a replay, a
    /// request in flight) is answered from that read, which takes no write
    /// lock — so replays go on while another process holds the file's
    /// write lock. Only an absent or expired key goes to the writer, whose
    /// transaction reads it again before writing. A read that fails falls
    /// through to the write, which answers as it would have alone.
    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        if let Ok(Some(live)) = self.get(key, now_ms).await {
            return Ok(InsertOutcome::Existing(live));
        }
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

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        match self
            .write(Write::Replace {
                key: key.to_owned(),
                expected,
                record,
                now_ms,
            })
            .await?
        {
            Written::Replace(replaced) => Ok(replaced),
            _ => unreachable!("the writer answers in kind"),
        }
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        match self
            .write(Write::Delete {
                key: key.to_owned(),
                expected_version,
                now_ms,
            })
            .await?
        {
            Written::Delete(deleted) => Ok(deleted),
            _ => unreachable!("the writer answers in kind"),
        }
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        let query = query.clone();
        self.read(move |conn| {
            let end = prefix_end(&query.prefix);
            let sql = format!(
                "SELECT {COLUMNS} FROM records
                 WHERE key >= ?1 AND (?2 IS NULL OR key < ?2) AND (?3 IS NULL OR key > ?3)
                   AND (?4 IS NULL OR state = ?4) AND expires_at_ms > ?5
                 ORDER BY key LIMIT ?6"
            );
            let mut stmt = conn
                .prepare_cached(&sql)
                .map_err(|e| driver_failed(STORE, e))?;
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
                .map_err(|e| driver_failed(STORE, e))?;
            let mut out = Vec::new();
            for row in rows {
                let (key, entry) = row.map_err(|e| driver_failed(STORE, e))?;
                out.push((key, entry?));
            }
            Ok(out)
        })
        .await
    }

    /// In slices of 128 rows (`PURGE_SLICE`), each its own write: claims queued
    /// meanwhile wait for one slice, not for the whole batch.
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        let mut purged = 0;
        while purged < limit {
            let slice = (limit - purged).min(PURGE_SLICE);
            let Written::Purge(n) = self
                .write(Write::Purge {
                    now_ms,
                    limit: slice,
                })
                .await?
            else {
                unreachable!("the writer answers in kind")
            };
            purged += n;
            if n < slice {
                break;
            }
        }
        Ok(purged)
    }
}
