//! Freeing the space of expired records, in the background.
//!
//! Reads never depend on it — every store treats an expired record as
//! absent — but without it a memory, SQLite or PostgreSQL store grows with
//! every key ever used. Redis expires its keys itself
//! ([`Store::purges_itself`]). One [`Purger`] per guard, in small batches so
//! a purge never holds a store (or SQLite's one writer) for long.
//!
//! ```
//! use idem::store::{MemoryStore, Purger, Store};
//! use idem::ManualClock;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let clock = ManualClock::new(0);
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! let purger = Purger::spawn(store, Arc::new(clock), Duration::from_secs(60), 1_000);
//! assert_eq!(purger.stats().runs, 0);
//! // Dropping the purger stops its task.
//! # }
//! ```

use super::Store;
use crate::clock::Clock;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long one batch may take before the purge gives up until the next
/// period (a store that hangs must not pile purges up).
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What the purger has done so far, for `/v1/stats` and `/metrics`: the
/// admin API's `purge` object.
pub use idem_admin_api::PurgeStats;

/// A background task that purges expired records every period, until dropped.
pub struct Purger {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Mutex<PurgeStats>>,
}

impl Purger {
    /// Purges `store` every `every`, by `clock`, `batch` records at a time
    /// until a batch comes back short. Must be called inside a tokio runtime.
    pub fn spawn(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        every: Duration,
        batch: usize,
    ) -> Purger {
        let stats = Arc::new(Mutex::new(PurgeStats {
            every_ms: every.as_millis() as u64,
            ..PurgeStats::default()
        }));
        let shared = stats.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let started = Instant::now();
                let (purged, error) = purge_all(&*store, clock.now_ms(), batch.max(1)).await;
                let mut stats = shared.lock().unwrap_or_else(PoisonError::into_inner);
                stats.runs += 1;
                stats.purged += purged;
                stats.last_purged = purged;
                stats.last_took_us = started.elapsed().as_micros() as u64;
                stats.errors += u64::from(error.is_some());
                stats.last_error = error;
            }
        });
        Purger { task, stats }
    }

    pub fn stats(&self) -> PurgeStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Frees every record expired by `now_ms`, `batch` at a time, yielding
/// between batches so requests on the same runtime and store go first.
/// Returns how many were freed, and the error that stopped it, if any.
pub async fn purge_all(store: &dyn Store, now_ms: u64, batch: usize) -> (u64, Option<String>) {
    let mut purged = 0u64;
    loop {
        match tokio::time::timeout(BATCH_TIMEOUT, store.purge_expired(now_ms, batch)).await {
            Ok(Ok(n)) => {
                purged += n as u64;
                if n < batch {
                    return (purged, None);
                }
            }
            Ok(Err(e)) => return (purged, Some(e.to_string())),
            Err(_) => {
                return (
                    purged,
                    Some(format!(
                        "a purge batch did not finish within {} s",
                        BATCH_TIMEOUT.as_secs()
                    )),
                );
            }
        }
        tokio::task::yield_now().await;
    }
}
