//! Tells a lone operation, which runs in place, from one in a crowd, which
//! queues for the writer thread or the blocking pool (see the module docs of
//! [`super`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// After operations last overlapped, how long before one counts as alone
/// again. Under steady concurrent load they overlap far more often than
/// this, so they keep sharing the writer thread's commits (and the blocking
/// pool) instead of each taking a worker thread for itself.
const QUIET: Duration = Duration::from_millis(10);

/// Tells a lone operation from one in a crowd: how many are under way, and
/// when two last overlapped.
pub(super) struct Crowd {
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
    pub(super) fn enter(&self) -> (Busy<'_>, bool) {
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
pub(super) struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether this thread may block in place: on a worker of a multi-thread
/// tokio runtime (which hands its other tasks to another thread first), or
/// in its `block_on`. A current-thread runtime cannot hand its tasks away.
pub(super) fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The lock if it is free now. A lock poisoned by a panic still holds a
/// usable connection: each transaction starts by rolling back any left open.
pub(super) fn try_lock<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}
