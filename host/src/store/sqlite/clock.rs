//! The file's time authority (`wit/clock.wit`): an anchor kept in the file —
//! an instant, and the machine's boot clock at that instant — so that every
//! process on the machine that opens the file answers the same time,
//! whenever it started and whatever its wall clock says.
//!
//! The anchor is written once per boot of the machine, by the first process
//! that opens the file after the boot (Linux's `boot_id` tells a boot from
//! the next): at the wall clock's time then, but never before the latest
//! time the file has seen (`high_ms`, raised by every purge), so a machine
//! that boots with its clock behind does not make the keys' leases and
//! retention last longer by the difference. Within a boot, wall-clock steps
//! change nothing. A file shared by several machines (a network file system)
//! is not supported: each boot of each machine would write its own anchor.
//!
//! Without a boot id (not Linux) the anchor is this process's: the wall
//! clock when it opened the file, carried by its monotonic clock.

use crate::clock::{Clock, LocalClock, boot_ms, wall_ms};
use crate::store::codec::int;
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::Arc;

/// The table, created by the schema's migration to version 3.
pub(super) const SCHEMA: &str = "
    -- The file's time authority: an instant (epoch_ms, milliseconds since the
    -- Unix epoch) and the machine's boot clock then (boot_ms), in the boot
    -- boot_id names; high_ms the latest time the file has seen.
    CREATE TABLE clock (
        id       INTEGER PRIMARY KEY CHECK (id = 1),
        boot_id  TEXT NOT NULL,
        boot_ms  INTEGER NOT NULL,
        epoch_ms INTEGER NOT NULL,
        high_ms  INTEGER NOT NULL
    ) STRICT;
";

/// Raises `high_ms` to a time the file has seen (run inside a purge write).
pub(super) const RAISE_HIGH: &str = "UPDATE clock SET high_ms = max(high_ms, ?1)";

/// The clock of one file: `epoch_ms` at boot-clock instant `boot_ms`.
#[derive(Debug)]
pub(super) struct FileClock {
    epoch_ms: u64,
    boot_ms: u64,
    boot_id: String,
}

impl Clock for FileClock {
    fn now_ms(&self) -> u64 {
        self.epoch_ms + boot_ms().saturating_sub(self.boot_ms)
    }

    fn authority(&self) -> String {
        format!(
            "the SQLite file's anchor (machine boot {}), carried by the boot clock",
            self.boot_id
        )
    }
}

/// This machine's boot id, if it has one.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

/// Reads the file's anchor, writing a new one when it was written in
/// another boot (or never): the clock every store on this file uses. Runs
/// on the writer's connection before the writer thread starts.
pub(super) fn anchor(conn: &Connection) -> Result<Arc<dyn Clock>, String> {
    let Some(boot_id) = boot_id() else {
        return Ok(Arc::new(LocalClock));
    };
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| format!("cannot lock it to read its clock: {e}"))?;
    let result = read_or_write(conn, boot_id);
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end);
    let clock = result?;
    ended.map_err(|e| format!("cannot write its clock: {e}"))?;
    Ok(Arc::new(clock))
}

fn read_or_write(conn: &Connection, boot_id: String) -> Result<FileClock, String> {
    let fail = |e: rusqlite::Error| format!("its clock: {e}");
    let row: Option<(String, i64, i64, i64)> = conn
        .query_row(
            "SELECT boot_id, boot_ms, epoch_ms, high_ms FROM clock WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .map_err(fail)?;
    let unsigned = |n: i64| u64::try_from(n).map_err(|_| format!("its clock holds {n}"));
    if let Some((id, boot, epoch, _)) = &row
        && *id == boot_id
    {
        return Ok(FileClock {
            epoch_ms: unsigned(*epoch)?,
            boot_ms: unsigned(*boot)?,
            boot_id,
        });
    }
    let high = match &row {
        Some((_, _, _, high)) => unsigned(*high)?,
        None => 0,
    };
    let clock = FileClock {
        epoch_ms: wall_ms().max(high),
        boot_ms: boot_ms(),
        boot_id,
    };
    let epoch = int(clock.epoch_ms);
    conn.execute(
        "INSERT INTO clock (id, boot_id, boot_ms, epoch_ms, high_ms) VALUES (1, ?1, ?2, ?3, ?3)
         ON CONFLICT (id) DO UPDATE SET boot_id = ?1, boot_ms = ?2, epoch_ms = ?3,
             high_ms = max(high_ms, ?3)",
        params![clock.boot_id, int(clock.boot_ms), epoch],
    )
    .map_err(fail)?;
    Ok(clock)
}
