//! What operators see of the gateway's decisions: counters, rates, store
//! latency, replay counts per key and a live event stream.
//!
//! The hot path pays for two atomic adds, one short lock on a 10-slot rate
//! window and — only while someone listens to `/v1/events` — one broadcast.

use crate::store::{
    Entry, FaultRule, InsertOutcome, ListQuery, Op, Record, Store, StoreError, SyncStore,
};
use async_trait::async_trait;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// What the gateway did with one guarded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Forwarded: the upstream ran it.
    Executed,
    /// Answered from the store.
    Replayed,
    /// Refused: the key's first request was still running.
    InFlight,
    /// Refused: the key was used for another request.
    Conflict,
    /// Refused: the store (or the guard) failed, or the gateway was overloaded.
    Unavailable,
    /// Refused: the key or the request was malformed.
    Invalid,
}

impl Verdict {
    pub const ALL: [Verdict; 6] = [
        Verdict::Executed,
        Verdict::Replayed,
        Verdict::InFlight,
        Verdict::Conflict,
        Verdict::Unavailable,
        Verdict::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Executed => "executed",
            Verdict::Replayed => "replayed",
            Verdict::InFlight => "in_flight",
            Verdict::Conflict => "conflict",
            Verdict::Unavailable => "unavailable",
            Verdict::Invalid => "invalid",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One decision, as `/v1/events` sends it.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionEvent {
    pub ts_ms: u64,
    pub key: String,
    pub outcome: Verdict,
    pub status: Option<u16>,
    pub latency_us: u64,
    pub detail: Option<String>,
}

/// A fault rule changed through the admin API.
#[derive(Clone, Debug, Serialize)]
pub struct FaultEvent {
    pub ts_ms: u64,
    pub op: Op,
    #[serde(flatten)]
    pub rule: FaultRule,
}

#[derive(Clone, Debug)]
pub enum Event {
    Decision(DecisionEvent),
    Fault(FaultEvent),
}

/// How many keys' replay counts are kept; past it the oldest counts are
/// forgotten (the admin API then shows 0 for them).
const MAX_REPLAY_KEYS: usize = 100_000;
/// Store latencies kept for percentiles.
const LATENCY_SAMPLES: usize = 4096;
const RATE_WINDOW_S: u64 = 10;

/// Counters and the event stream of one gateway.
pub struct Observer {
    started: Instant,
    counts: [AtomicU64; 6],
    window: Mutex<[(u64, [u64; 6]); RATE_WINDOW_S as usize]>,
    events: broadcast::Sender<Event>,
    replays: Mutex<ReplayCounts>,
    latency: Mutex<LatencyRing>,
}

#[derive(Default)]
struct ReplayCounts {
    counts: HashMap<String, u64>,
    /// Insertion order, to forget the oldest first.
    order: std::collections::VecDeque<String>,
}

#[derive(Default)]
struct LatencyRing {
    samples: Vec<u32>,
    next: usize,
}

/// Store latency percentiles, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Default for Observer {
    fn default() -> Self {
        Observer {
            started: Instant::now(),
            counts: Default::default(),
            window: Mutex::new([(u64::MAX, [0; 6]); RATE_WINDOW_S as usize]),
            events: broadcast::channel(1024).0,
            replays: Mutex::default(),
            latency: Mutex::default(),
        }
    }
}

impl Observer {
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Records one decision and publishes it to event listeners.
    pub fn decided(
        &self,
        key: &str,
        outcome: Verdict,
        status: Option<u16>,
        latency: Duration,
        detail: Option<String>,
    ) {
        self.counts[outcome.index()].fetch_add(1, Ordering::Relaxed);
        let second = self.started.elapsed().as_secs();
        {
            let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = &mut window[(second % RATE_WINDOW_S) as usize];
            if slot.0 != second {
                *slot = (second, [0; 6]);
            }
            slot.1[outcome.index()] += 1;
        }
        if outcome == Verdict::Replayed {
            self.count_replay(key);
        }
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(Event::Decision(DecisionEvent {
                ts_ms: now_ms(),
                key: key.to_owned(),
                outcome,
                status,
                latency_us: latency.as_micros() as u64,
                detail,
            }));
        }
    }

    pub fn fault_changed(&self, op: Op, rule: FaultRule) {
        let _ = self.events.send(Event::Fault(FaultEvent {
            ts_ms: now_ms(),
            op,
            rule,
        }));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Listeners of the live event stream right now.
    pub fn listeners(&self) -> usize {
        self.events.receiver_count()
    }

    pub fn count(&self, outcome: Verdict) -> u64 {
        self.counts[outcome.index()].load(Ordering::Relaxed)
    }

    /// Decisions per second over the last 10 s (or since start, if sooner).
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    pub fn rate(&self, outcome: Verdict) -> f64 {
        let second = self.started.elapsed().as_secs();
        let window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let total: u64 = window
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s + RATE_WINDOW_S > second)
            .map(|(_, c)| c[outcome.index()])
            .sum();
        let span = self
            .started
            .elapsed()
            .as_secs_f64()
            .clamp(1.0, RATE_WINDOW_S as f64);
        total as f64 / span
    }

    pub fn replays(&self, key: &str) -> u64 {
        self.replays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    fn count_replay(&self, key: &str) {
        let mut r = self.replays.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = r.counts.get_mut(key) {
            *n += 1;
            return;
        }
        if r.counts.len() >= MAX_REPLAY_KEYS
            && let Some(oldest) = r.order.pop_front()
        {
            r.counts.remove(&oldest);
        }
        r.counts.insert(key.to_owned(), 1);
        r.order.push_back(key.to_owned());
    }

    pub fn forget_replays(&self, key: &str) {
        let mut r = self.replays.lock().unwrap_or_else(PoisonError::into_inner);
        if r.counts.remove(key).is_some() {
            r.order.retain(|k| k != key);
        }
    }

    fn store_latency(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(u32::MAX)) as u32;
        let mut ring = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.samples.len() < LATENCY_SAMPLES {
            ring.samples.push(us);
        } else {
            let i = ring.next;
            ring.samples[i] = us;
        }
        ring.next = (ring.next + 1) % LATENCY_SAMPLES;
    }

    /// Percentiles of the latest store operations.
    #[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)] // an index into at most 4096 samples
    pub fn store_latency_us(&self) -> Percentiles {
        let mut samples = self
            .latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .samples
            .clone();
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |q: f64| u64::from(samples[((samples.len() - 1) as f64 * q).round() as usize]);
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: u64::from(samples[samples.len() - 1]),
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    crate::clock::Clock::now_ms(&crate::clock::SystemClock)
}

/// A store decorator that times every atomic operation for the stats.
pub struct Timed {
    inner: Arc<dyn Store>,
    observer: Arc<Observer>,
}

impl Timed {
    pub fn new(inner: Arc<dyn Store>, observer: Arc<Observer>) -> Self {
        Timed { inner, observer }
    }

    async fn time<T>(&self, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        self.observer.store_latency(started.elapsed());
        out
    }
}

/// The sync form of [`Timed`], over the sync form of its inner store.
struct TimedSync {
    inner: Arc<dyn SyncStore>,
    observer: Arc<Observer>,
}

impl TimedSync {
    fn time<T>(&self, call: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = call();
        self.observer.store_latency(started.elapsed());
        out
    }
}

impl SyncStore for TimedSync {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        self.time(|| self.inner.get_now(key, now_ms))
    }
    fn insert_now(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        self.time(|| self.inner.insert_now(key, record, now_ms))
    }
    fn replace_now(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.time(|| {
            self.inner
                .replace_now(key, expected_version, record, now_ms)
        })
    }
    fn delete_now(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        self.time(|| self.inner.delete_now(key, expected_version))
    }
    fn would_wait(&self) -> bool {
        self.inner.would_wait()
    }
}

#[async_trait]
impl Store for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        self.time(self.inner.get(key, now_ms)).await
    }
    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        self.time(self.inner.insert(key, record, now_ms)).await
    }
    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.time(self.inner.replace(key, expected_version, record, now_ms))
            .await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        self.time(self.inner.delete(key, expected_version)).await
    }
    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        self.inner.list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(now_ms, limit).await
    }
    fn purges_itself(&self) -> bool {
        self.inner.purges_itself()
    }
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        Some(Arc::new(TimedSync {
            inner: self.inner.as_sync()?,
            observer: self.observer.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_counts_are_bounded_and_counted() {
        let o = Observer::default();
        o.decided("a", Verdict::Replayed, Some(200), Duration::ZERO, None);
        o.decided("a", Verdict::Replayed, Some(200), Duration::ZERO, None);
        o.decided("b", Verdict::Executed, Some(200), Duration::ZERO, None);
        assert_eq!((o.replays("a"), o.replays("b")), (2, 0));
        assert_eq!(
            (o.count(Verdict::Replayed), o.count(Verdict::Executed)),
            (2, 1)
        );
        assert!(o.rate(Verdict::Replayed) > 0.0);
        o.forget_replays("a");
        assert_eq!(o.replays("a"), 0);
    }

    #[test]
    fn percentiles_of_samples() {
        let o = Observer::default();
        for us in 1..=100 {
            o.store_latency(Duration::from_micros(us));
        }
        let p = o.store_latency_us();
        assert_eq!((p.p50, p.p99, p.max), (51, 99, 100));
    }
}
