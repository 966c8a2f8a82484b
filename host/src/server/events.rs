//! What operators see of the gateway's decisions: counters, rates, store
//! latency, replay counts per key and a live event stream.
//!
//! The hot path pays for two atomic adds, one short lock on a 10-slot rate
//! window and — only while someone listens to `/v1/events` — one broadcast.

use crate::store::{FaultRule, Latencies, Op, Percentiles};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// What the gateway did with one guarded request: the admin API's
/// `outcome`, one type from the counters to the wire.
pub use idem_admin_api::Outcome as Verdict;

/// What `/v1/events` streams: the admin API's events, sent as they are.
pub use idem_admin_api::{DecisionEvent, Event, FaultEvent};

/// How many keys' replay counts are kept; past it the oldest counts are
/// forgotten (the admin API then shows 0 for them).
const MAX_REPLAY_KEYS: usize = 100_000;
const RATE_WINDOW_S: u64 = 10;

/// Counters and the event stream of one gateway.
pub struct Observer {
    started: Instant,
    counts: [AtomicU64; 6],
    window: Mutex<[(u64, [u64; 6]); RATE_WINDOW_S as usize]>,
    events: broadcast::Sender<Event>,
    replays: Mutex<ReplayCounts>,
    /// Of the store's atomic operations, which the gateway's store stack
    /// times into it.
    latencies: Latencies,
}

#[derive(Default)]
struct ReplayCounts {
    counts: HashMap<String, u64>,
    /// Insertion order, to forget the oldest first.
    order: std::collections::VecDeque<String>,
}

impl Default for Observer {
    fn default() -> Self {
        Observer {
            started: Instant::now(),
            counts: Default::default(),
            window: Mutex::new([(u64::MAX, [0; 6]); RATE_WINDOW_S as usize]),
            events: broadcast::channel(1024).0,
            replays: Mutex::default(),
            latencies: Latencies::default(),
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
        self.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
        let second = self.started.elapsed().as_secs();
        {
            let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = &mut window[(second % RATE_WINDOW_S) as usize];
            if slot.0 != second {
                *slot = (second, [0; 6]);
            }
            slot.1[outcome as usize] += 1;
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
        self.counts[outcome as usize].load(Ordering::Relaxed)
    }

    /// Decisions per second over the last 10 s (or since start, if sooner).
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    pub fn rate(&self, outcome: Verdict) -> f64 {
        let second = self.started.elapsed().as_secs();
        let window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let total: u64 = window
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s + RATE_WINDOW_S > second)
            .map(|(_, c)| c[outcome as usize])
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

    /// What the store stack times the store's operations into.
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    /// Percentiles of the latest store operations.
    pub fn store_latency_us(&self) -> Percentiles {
        self.latencies.percentiles_us()
    }
}

/// When an event happened, for operators: this host's wall clock (decisions
/// never read it).
pub(crate) fn now_ms() -> u64 {
    crate::clock::wall_ms()
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
}
