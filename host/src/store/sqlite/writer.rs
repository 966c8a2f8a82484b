//! The writer thread and the write primitives: one `BEGIN IMMEDIATE`
//! transaction per batch (group commit), or per lone write run in place.

use super::STORE;
use super::row::{RecordColumns, decode, sql};
use crate::store::codec::{corrupt, driver_failed, int};
use crate::store::{InsertOutcome, Record, Result};
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::{Mutex, OnceLock};
use tokio::sync::{mpsc, oneshot};

/// At most this many primitives share one transaction.
const MAX_BATCH: usize = 256;

/// The one write connection. The writer thread locks it for each batch it
/// takes from the queue; a lone caller that finds it free runs its primitive
/// on it in place (see [`SqliteStore::write`](super::SqliteStore)).
pub(super) struct WriteSide {
    pub(super) conn: Mutex<Connection>,
    pub(super) before_commit: OnceLock<BeforeCommit>,
}

/// See [`super::SqliteStore::set_before_commit`].
pub(super) type BeforeCommit = Box<dyn Fn(usize) + Send + Sync>;

/// A primitive for the writer thread.
pub(super) enum Write {
    Insert {
        key: String,
        record: Record,
        now_ms: u64,
    },
    Replace {
        key: String,
        expected: u64,
        record: Record,
        now_ms: u64,
    },
    Delete {
        key: String,
        expected_version: Option<u64>,
        now_ms: u64,
    },
    Purge {
        now_ms: u64,
        limit: usize,
    },
}

pub(super) enum Written {
    Insert(InsertOutcome),
    Replace(bool),
    Delete(bool),
    Purge(usize),
}

pub(super) struct Job {
    pub(super) write: Write,
    pub(super) reply: oneshot::Sender<Result<Written>>,
}

/// The writer thread: takes what is queued, applies it in one transaction,
/// and answers only after the commit. Ends when every sender is gone.
pub(super) fn write_loop(side: &WriteSide, mut queue: mpsc::Receiver<Job>) {
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
                    let failed = driver_failed(STORE, e);
                    batch.iter().map(|_| Err(failed.clone())).collect()
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

/// Applies one write in its own transaction.
pub(super) fn apply_alone(
    conn: &Connection,
    write: &Write,
    before_commit: &OnceLock<BeforeCommit>,
) -> Result<Written> {
    match apply_batch(conn, std::iter::once(write), before_commit) {
        Ok(mut results) => results.pop().expect("one result"),
        Err(e) => Err(driver_failed(STORE, e)),
    }
}

/// Applies `writes` in one transaction. A database error rolls all of them
/// back and is returned; a record that does not decode is that write's
/// answer only (it is found by a read, so nothing was written for it).
fn apply_batch<'w>(
    conn: &Connection,
    writes: impl ExactSizeIterator<Item = &'w Write>,
    before_commit: &OnceLock<BeforeCommit>,
) -> Result<Vec<Result<Written>>, rusqlite::Error> {
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
fn apply(conn: &Connection, write: &Write) -> Result<Result<Written>, rusqlite::Error> {
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
                    let columns = RecordColumns::new(record);
                    conn.prepare_cached(sql::INSERT)?
                        .execute(&*columns.params(key, &1, &[]))?;
                    Ok(Written::Insert(InsertOutcome::Inserted(1)))
                }
                Some((_, Some(live))) => live.map(|e| Written::Insert(InsertOutcome::Existing(e))),
                // Expired: overwritten at its version + 1.
                Some((version, None)) => match u64::try_from(version) {
                    Ok(old) => {
                        let version = old.saturating_add(1);
                        let columns = RecordColumns::new(record);
                        conn.prepare_cached(sql::OVERWRITE)?
                            .execute(&*columns.params(key, &int(version), &[]))?;
                        Ok(Written::Insert(InsertOutcome::Inserted(version)))
                    }
                    Err(_) => Err(corrupt(
                        STORE,
                        key,
                        format!("version {version} is negative"),
                    )),
                },
            }
        }
        Write::Replace {
            key,
            expected,
            record,
            now_ms,
        } => {
            let columns = RecordColumns::new(record);
            let replaced = conn
                .prepare_cached(sql::REPLACE)?
                .execute(&*columns.params(key, &int(*expected), &[&int(*now_ms)]))?;
            Ok(Written::Replace(replaced > 0))
        }
        Write::Delete {
            key,
            expected_version,
            now_ms,
        } => {
            let deleted = conn.prepare_cached(sql::DELETE)?.execute(params![
                key,
                expected_version.map(int),
                int(*now_ms)
            ])?;
            Ok(Written::Delete(deleted > 0))
        }
        Write::Purge { now_ms, limit } => {
            let purged = conn.prepare_cached(sql::PURGE)?.execute(params![
                int(*now_ms),
                i64::try_from(*limit).unwrap_or(i64::MAX)
            ])?;
            // The latest time the file has seen: a later boot's anchor starts no earlier.
            conn.prepare_cached(super::clock::RAISE_HIGH)?
                .execute(params![int(*now_ms)])?;
            Ok(Written::Purge(purged))
        }
    })
}
