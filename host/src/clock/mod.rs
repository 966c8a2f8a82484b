//! The time the guard judges leases and retention by: one *time authority*
//! per store (`wit/clock.wit`), never a host's wall clock.
//!
//! - [`SyncedClock`]: a store server's clock (Redis `TIME`, PostgreSQL
//!   `clock_timestamp()`), read from time to time and carried between reads
//!   by the machine's boot clock. Every host sharing the server agrees with
//!   it to within half a round trip.
//! - [`LocalClock`]: this process's boot clock, anchored once to the wall
//!   clock; for a store that lives and dies with the process (memory).
//! - The SQLite store's clock: an anchor kept in the file, carried by the
//!   machine's boot clock, so every process on the machine agrees
//!   (`store/sqlite/clock.rs`).
//! - [`ManualClock`]: one a test moves.
//!
//! A step of the wall clock moves none of them. [`wall_offset_ms`] tells
//! operators how far this host's wall clock is from a clock's time.
//!
//! ```
//! use idem::{Clock, ManualClock};
//! let clock = ManualClock::new(1_000);
//! clock.advance(std::time::Duration::from_millis(500));
//! assert_eq!(clock.now_ms(), 1_500);
//! assert_eq!(clock.known(), Ok(0));
//! ```

mod synced;

pub use synced::{SYNC_EVERY, SyncedClock, Syncing};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on a time authority.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;

    /// Whether the clock knows its authority's time: the bound on its error
    /// in milliseconds, or why it does not know it yet (a server clock never
    /// read). The guard fails closed while it is unknown.
    fn known(&self) -> Result<u64, String> {
        Ok(0)
    }

    /// What the time is taken from, for operators.
    fn authority(&self) -> String;
}

/// The machine's boot clock in milliseconds: monotonic, counting time
/// suspended, never stepped (Linux's `CLOCK_BOOTTIME`, shared by every
/// process of the machine). Elsewhere, this process's monotonic clock.
pub(crate) fn boot_ms() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        t.tv_sec.cast_unsigned() * 1_000 + t.tv_nsec.cast_unsigned() / 1_000_000
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
    }
}

/// This host's wall clock, in milliseconds since the Unix epoch. Only for
/// anchoring a clock once and for telling operators how far off it is;
/// never for a decision.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How far this host's wall clock is ahead of `clock` (negative: behind),
/// in milliseconds: a wall-clock step, or a mis-set host, shows here.
pub fn wall_offset_ms(clock: &dyn Clock) -> i64 {
    wall_ms().cast_signed() - clock.now_ms().cast_signed()
}

/// This process's boot clock, anchored to the wall clock the first time any
/// `LocalClock` is read: the authority of a store that lives and dies with
/// the process. Every `LocalClock` of the process answers the same time.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalClock;

impl LocalClock {
    /// The wall-clock instant and the boot clock at the anchor.
    fn anchor() -> (u64, u64) {
        static ANCHOR: OnceLock<(u64, u64)> = OnceLock::new();
        *ANCHOR.get_or_init(|| (wall_ms(), boot_ms()))
    }
}

impl Clock for LocalClock {
    fn now_ms(&self) -> u64 {
        let (wall, boot) = Self::anchor();
        wall + boot_ms().saturating_sub(boot)
    }

    fn authority(&self) -> String {
        "this process's monotonic clock, anchored to its wall clock once".into()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(now_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(now_ms)))
    }

    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn authority(&self) -> String {
        "a manual clock".into()
    }
}

/// A clock shared with others, as the gateway hands its own to the guard.
impl Clock for Arc<dyn Clock> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }

    fn known(&self) -> Result<u64, String> {
        (**self).known()
    }

    fn authority(&self) -> String {
        (**self).authority()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_clocks_agree_and_follow_the_boot_clock() {
        let a = LocalClock.now_ms();
        let b = LocalClock.now_ms();
        assert!(b >= a);
        // Anchored to the wall clock: within a second of it on a machine
        // whose wall clock is not being stepped by this test.
        assert!(wall_offset_ms(&LocalClock).abs() < 1_000);
    }
}
