//! A store server's clock, kept on this host: the time authority of a store
//! that several hosts share (`wit/clock.wit`).

use super::{Clock, boot_ms};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often a synced clock reads its server's clock again, unless its
/// store's URL says otherwise (`clock_sync_ms`).
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// How fast a boot clock may drift from the server's, at most: a
/// millisecond every this many (100 ppm, which quartz oscillators stay well
/// inside). A reading's error bound grows by this as it ages.
const DRIFT_EVERY_MS: u64 = 10_000;

/// Past this a disagreement between two readings is a step of the server's
/// clock (or of nothing this host controls), and is worth telling.
const STEP_MS: i64 = 1_000;

/// A store server's clock: `now_ms` is the server's time at its last reading
/// plus the boot clock's time since, so a wall-clock step of this host
/// changes nothing, and hosts reading the same server agree to within the
/// sum of their readings' errors (half a round trip each).
///
/// [`SyncedClock::read`] takes one reading; a task started by
/// [`SyncedClock::keep_synced`] reads again periodically ([`SYNC_EVERY`] by
/// default) while the clock lives. A reading is adopted when it is more precise than the one held or
/// disagrees with it by more than both errors (the server's clock moved): so
/// round-trip jitter never moves the time, and a step of the server's clock
/// is followed within a second.
pub struct SyncedClock {
    authority: String,
    /// How fine the server's answers are: 1 ms for a clock read in
    /// milliseconds, 1000 ms for an HTTP `Date` header (DynamoDB's).
    resolution_ms: u64,
    /// Server time minus boot clock, in milliseconds.
    offset_ms: AtomicI64,
    /// Half the round trip of the reading held, plus a millisecond of rounding.
    error_ms: AtomicU64,
    /// The boot clock at the reading held.
    read_at_ms: AtomicU64,
    anchored: AtomicBool,
    /// Why the last reading failed, while the clock was never anchored.
    last_failure: Mutex<Option<String>>,
    /// Steps of the server's clock seen, and the last one's size.
    steps: AtomicU64,
    last_step_ms: AtomicI64,
}

impl SyncedClock {
    /// A clock of `authority` (for operators: "the Redis server's TIME"),
    /// unknown until its first reading.
    pub fn new(authority: impl Into<String>) -> Arc<SyncedClock> {
        Self::with_resolution(authority, 1)
    }

    /// A clock whose server answers in whole steps of `resolution_ms`,
    /// floored (an HTTP `Date` header: whole seconds). A reading `S` then
    /// says the server's time was in `[S, S + resolution_ms)`: it is taken
    /// as the middle of that, and its error bound grows by half of it.
    pub fn with_resolution(authority: impl Into<String>, resolution_ms: u64) -> Arc<SyncedClock> {
        Arc::new(SyncedClock {
            authority: authority.into(),
            resolution_ms: resolution_ms.max(1),
            offset_ms: AtomicI64::new(0),
            error_ms: AtomicU64::new(u64::MAX),
            read_at_ms: AtomicU64::new(0),
            anchored: AtomicBool::new(false),
            last_failure: Mutex::new(None),
            steps: AtomicU64::new(0),
            last_step_ms: AtomicI64::new(0),
        })
    }

    /// Takes one reading: `read` asks the server for its time in
    /// milliseconds since the Unix epoch. A failure leaves the time as it
    /// was (and, before the first reading, says why in [`Clock::known`]).
    pub async fn read<E: std::fmt::Display>(&self, read: impl Future<Output = Result<u64, E>>) {
        let sent = boot_ms();
        match read.await {
            Ok(server_ms) => self.adopt(server_ms, sent, boot_ms()),
            Err(e) => {
                if !self.anchored.load(Ordering::Acquire) {
                    *self.lock_failure() = Some(format!("reading it failed: {e}"));
                }
            }
        }
    }

    /// What a store does as it opens: reads the server's clock with `read`
    /// once now, then keeps it synced every `every` ([`SyncedClock::keep_synced`]).
    /// Each reading gets its own clone of `from`, what it needs of the store
    /// (its connection, pool or client, and its timeout); the store's clones
    /// share the returned [`Syncing`]. `Err` says why the first reading
    /// failed: a store whose clock is unknown would fail every guard call
    /// closed, so it does not open.
    pub async fn start_syncing<S, F, Fut, E>(
        self: &Arc<Self>,
        every: Duration,
        from: S,
        read: F,
    ) -> Result<Arc<Syncing>, String>
    where
        S: Clone + Send + 'static,
        F: Fn(S) -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, E>> + Send,
        E: std::fmt::Display,
    {
        let read = move || read(from.clone());
        self.read(read()).await;
        self.known()?;
        Ok(Arc::new(self.keep_synced(every, read)))
    }

    /// Reads the server's clock with `read` every `every` (the first time
    /// one period from now) while the clock lives and the returned
    /// [`Syncing`] is held: the task ends with either. Must be called inside
    /// a tokio runtime.
    pub fn keep_synced<F, Fut, E>(self: &Arc<Self>, every: Duration, read: F) -> Syncing
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, E>> + Send,
        E: std::fmt::Display,
    {
        let clock: Weak<SyncedClock> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(clock) = clock.upgrade() else { return };
                clock.read(read()).await;
            }
        });
        Syncing(task.abort_handle())
    }

    /// A reading: the server said `server_ms` between the boot clock's
    /// `sent_ms` and `received_ms`.
    pub fn adopt(&self, server_ms: u64, sent_ms: u64, received_ms: u64) {
        let round_trip = received_ms.saturating_sub(sent_ms);
        let half_step = self.resolution_ms / 2;
        let offset =
            (server_ms + half_step).cast_signed() - (sent_ms + round_trip / 2).cast_signed();
        let error = round_trip.div_ceil(2) + half_step + 1;
        if self.anchored.load(Ordering::Acquire) {
            let held = self.offset_ms.load(Ordering::Acquire);
            let held_error = self.error_now(received_ms);
            let apart = (offset - held).abs();
            let disagrees = apart.unsigned_abs() > held_error.saturating_add(error);
            if !disagrees && error >= held_error {
                return; // no better, and consistent with what is held
            }
            if disagrees && apart >= STEP_MS {
                self.steps.fetch_add(1, Ordering::Relaxed);
                self.last_step_ms.store(offset - held, Ordering::Relaxed);
            }
        }
        self.offset_ms.store(offset, Ordering::Release);
        self.error_ms.store(error, Ordering::Release);
        self.read_at_ms.store(received_ms, Ordering::Release);
        self.anchored.store(true, Ordering::Release);
    }

    /// The held reading's error bound at boot-clock instant `at_ms`: its
    /// round trip's, grown by the drift since.
    fn error_now(&self, at_ms: u64) -> u64 {
        let age_ms = at_ms.saturating_sub(self.read_at_ms.load(Ordering::Acquire));
        self.error_ms
            .load(Ordering::Acquire)
            .saturating_add(age_ms.div_ceil(DRIFT_EVERY_MS))
    }

    /// How many times the server's clock was seen to step (by a second or
    /// more), and the last step in milliseconds (negative: back).
    pub fn steps(&self) -> (u64, i64) {
        (
            self.steps.load(Ordering::Relaxed),
            self.last_step_ms.load(Ordering::Relaxed),
        )
    }

    fn lock_failure(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The task that keeps a [`SyncedClock`] synced: stopped when dropped.
#[derive(Debug)]
pub struct Syncing(tokio::task::AbortHandle);

impl Drop for Syncing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl SyncedClock {
    /// The time at boot-clock instant `at_ms`.
    fn at(&self, at_ms: u64) -> u64 {
        let offset = self.offset_ms.load(Ordering::Acquire);
        at_ms
            .cast_signed()
            .saturating_add(offset)
            .max(0)
            .cast_unsigned()
    }
}

impl Clock for SyncedClock {
    fn now_ms(&self) -> u64 {
        self.at(boot_ms())
    }

    fn known(&self) -> Result<u64, String> {
        if self.anchored.load(Ordering::Acquire) {
            return Ok(self.error_now(boot_ms()));
        }
        let why = self.lock_failure().clone();
        Err(format!(
            "{} has not been read yet{}",
            self.authority,
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        ))
    }

    fn authority(&self) -> String {
        self.authority.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_read_then_carried_by_the_boot_clock() {
        let clock = SyncedClock::new("a test server's clock");
        let err = clock.known().unwrap_err();
        assert!(
            err.contains("a test server's clock has not been read yet"),
            "{err}"
        );
        // The server said 5_000_000 halfway through a 4 ms round trip that
        // ended now.
        let received = boot_ms();
        clock.adopt(5_000_000, received - 4, received);
        let before = boot_ms();
        let (now, error) = (clock.now_ms(), clock.known().unwrap());
        let after = boot_ms();
        assert!(error >= 3, "half the round trip and a millisecond: {error}");
        let at = |boot: u64| 5_000_000 + boot - (received - 2);
        assert!((at(before)..=at(after)).contains(&now), "{now}");
    }

    /// Each reading of the layout's vectors (`wit/store-layout/vectors.json`,
    /// `time.{set}`), adopted by a fresh clock from `new`, gives the time and
    /// error they say; the JavaScript and Python hosts check them too.
    fn follows_the_vectors(set: &str, new: impl Fn() -> Arc<SyncedClock>) {
        let text = include_str!("../../../wit/store-layout/vectors.json");
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        let n = |v: &serde_json::Value| v.as_str().unwrap().parse::<u64>().unwrap();
        let readings = doc["time"][set].as_array().unwrap();
        assert!(!readings.is_empty());
        for r in readings {
            let clock = new();
            clock.adopt(n(&r["server_ms"]), n(&r["sent"]), n(&r["received"]));
            assert_eq!(clock.at(n(&r["at"])), n(&r["now_ms"]), "{r}");
            assert_eq!(clock.error_now(n(&r["at"])), n(&r["error_ms"]), "{r}");
        }
    }

    #[test]
    fn readings_follow_the_layouts_vectors() {
        follows_the_vectors("readings", || SyncedClock::new("vectors"));
    }

    /// An HTTP `Date` header (DynamoDB's) says a whole second: the server's
    /// time was somewhere in it, so the reading is its middle, and half a
    /// second more error (`wit/store-layout/README.md`, DynamoDB; the
    /// vectors' `time.dynamodb_readings`).
    #[test]
    fn a_reading_in_whole_seconds_is_the_middle_of_its_second() {
        follows_the_vectors("dynamodb_readings", || {
            SyncedClock::with_resolution("a Date header", 1_000)
        });
    }

    #[test]
    fn jitter_keeps_the_time_and_a_step_moves_it() {
        const T: i64 = 10_000_000;
        let offset = |clock: &SyncedClock| clock.offset_ms.load(Ordering::Relaxed);
        let clock = SyncedClock::new("s");
        let at = |ms: i64| ms.cast_unsigned();
        clock.adopt(at(T), 0, 10); // offset T - 5, error 6
        // A slower reading inside the error bound changes nothing.
        clock.adopt(at(T + 103), 100, 120); // offset T - 7, error 11
        assert_eq!(offset(&clock), T - 5);
        // A more precise one is taken.
        clock.adopt(at(T + 201), 200, 202); // offset T, error 2
        assert_eq!(offset(&clock), T);
        assert_eq!(clock.steps().0, 0);
        // The server's clock steps back an hour: followed, and counted.
        clock.adopt(at(T + 301 - 3_600_000), 300, 302);
        assert_eq!(offset(&clock), T - 3_600_000);
        assert_eq!(clock.steps(), (1, -3_600_000));
    }
}
