//! What operators see of the gateway's decisions: counters, rates, store
//! latency, replay counts per key, a live event stream, the events kept for
//! a key's history, a log line per decision, and the trace spans' attributes.
//!
//! The hot path pays for two atomic adds, one short lock on a 10-slot rate
//! window, one on the history ring, the log line (when its level is on) and
//! — only while someone listens to `/v1/events` — one broadcast.

use super::traces::Traces;
use crate::store::{CallListener, FaultRule, Latencies, Op, Percentiles, StoreError};
use idem_admin_api::GatewayInfo;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// What the gateway did with one guarded request: the admin API's
/// `outcome`, one type from the counters to the wire.
pub use idem_admin_api::Verdict;

/// What `/v1/events` streams: the admin API's events, sent as they are.
pub use idem_admin_api::{
    AdminAction, AdminEvent, DecisionEvent, Event, FaultEvent, RenewalEvent, StoreErrorEvent,
};

/// How many keys' replay counts are kept; past it the oldest counts are
/// forgotten (the admin API then shows 0 for them).
const MAX_REPLAY_KEYS: usize = 100_000;
const RATE_WINDOW_S: u64 = 10;
/// Fault changes kept for keys' histories, beside the ring of events (a
/// key's history shows those made between its first and last event).
const MAX_FAULT_CHANGES: usize = 256;

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
    history: Mutex<History>,
    /// The claims whose requests run in this gateway now: store key →
    /// holder id. A claim is in it from its `begin` until its upstream call
    /// is over (its completion or release is not a renewal).
    running: Mutex<HashMap<Arc<str>, u64>>,
    gateway: Mutex<GatewayInfo>,
    traces: Option<Arc<Traces>>,
}

/// The newest events, for keys' histories, each with its place in the
/// order they happened in (times are only to the millisecond).
struct History {
    capacity: usize,
    events: VecDeque<(u64, Event)>,
    faults: VecDeque<(u64, Event)>,
    next: u64,
}

#[derive(Default)]
struct ReplayCounts {
    counts: HashMap<String, u64>,
    /// Insertion order, to forget the oldest first.
    order: VecDeque<String>,
}

impl Default for Observer {
    fn default() -> Self {
        Observer::new(super::config::DEFAULT_HISTORY_EVENTS, None)
    }
}

impl Observer {
    /// An observer that keeps the newest `history_events` events for keys'
    /// histories (0: none) and, with `traces`, puts what it hears on the
    /// current trace span.
    pub(crate) fn new(history_events: usize, traces: Option<Arc<Traces>>) -> Observer {
        Observer {
            started: Instant::now(),
            counts: Default::default(),
            window: Mutex::new([(u64::MAX, [0; 6]); RATE_WINDOW_S as usize]),
            events: broadcast::channel(1024).0,
            replays: Mutex::default(),
            latencies: Latencies::default(),
            history: Mutex::new(History {
                capacity: history_events,
                events: VecDeque::new(),
                faults: VecDeque::new(),
                next: 0,
            }),
            running: Mutex::default(),
            gateway: Mutex::new(GatewayInfo {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                ..GatewayInfo::default()
            }),
            traces,
        }
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn traces(&self) -> Option<&Arc<Traces>> {
        self.traces.as_ref()
    }

    /// Records one decision, logs it, keeps it for the key's history and
    /// publishes it to event listeners. `fence` is the claim's, when the
    /// request claimed the key.
    pub fn decided(
        &self,
        key: &str,
        outcome: Verdict,
        status: Option<u16>,
        latency: Duration,
        detail: Option<String>,
        fence: Option<u64>,
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
        let latency_us = latency.as_micros() as u64;
        // The message as a plain string field, first as a message is: the
        // same line, without `fmt` machinery (a format string is recorded
        // as `fmt::Arguments`, ~220 instructions a line more).
        tracing::info!(
            target: "idem::request",
            message = "decided",
            key,
            decision = outcome.as_str(),
            fence,
            status,
            latency_us,
            reason = detail.as_deref(),
        );
        if self.traces.is_some() {
            Traces::decided(outcome, key, fence, detail.as_deref());
        }
        self.publish(Event::Decision(DecisionEvent {
            ts_ms: now_ms(),
            key: key.to_owned(),
            outcome,
            status,
            latency_us,
            detail,
            fence,
        }));
    }

    /// A fault rule changed: `by` the admin client at that address, or in
    /// process (`None`).
    pub fn fault_changed(&self, op: Op, rule: FaultRule, by: Option<String>) {
        tracing::info!(
            target: "idem::admin",
            action = "fault",
            op = op.as_str(),
            rule = %rule,
            by = by.as_deref().unwrap_or("in process"),
            "fault rule changed"
        );
        self.publish(Event::Fault(FaultEvent {
            ts_ms: now_ms(),
            op,
            rule,
            by,
        }));
    }

    /// An operator's action on a key went through: the audit trail.
    pub fn admin_action(&self, action: AdminAction, key: &str, by: &str, fence: u64, version: u64) {
        tracing::info!(
            target: "idem::admin",
            action = action.as_str(),
            key,
            by,
            fence,
            version,
            "key changed by an operator"
        );
        self.publish(Event::Admin(AdminEvent {
            ts_ms: now_ms(),
            action,
            key: key.to_owned(),
            by: by.to_owned(),
            fence,
            version,
        }));
    }

    /// Keeps `event` for keys' histories and sends it to listeners.
    fn publish(&self, event: Event) {
        {
            let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
            let history = &mut *history;
            if history.capacity > 0 {
                let (ring, cap) = if matches!(event, Event::Fault(_)) {
                    (&mut history.faults, MAX_FAULT_CHANGES)
                } else {
                    (&mut history.events, history.capacity)
                };
                if ring.len() >= cap {
                    ring.pop_front();
                }
                let seq = history.next;
                history.next += 1;
                // Sent below only while someone listens: clone only then.
                if self.events.receiver_count() == 0 {
                    ring.push_back((seq, event));
                    return;
                }
                ring.push_back((seq, event.clone()));
            }
        }
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(event);
        }
    }

    /// What the gateway kept of `key`: its events, oldest first, with the
    /// fault changes made between its first and its last.
    pub fn history(&self, key: &str) -> idem_admin_api::KeyHistory {
        let history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let mut events: Vec<&(u64, Event)> = history
            .events
            .iter()
            .filter(|(_, e)| e.key() == Some(key))
            .collect();
        if let (Some((first, _)), Some((last, _))) = (events.first(), events.last()) {
            let during = (*first)..=(*last);
            let before = events.len();
            events.extend(
                history
                    .faults
                    .iter()
                    .filter(|(seq, _)| during.contains(seq)),
            );
            if events.len() > before {
                events.sort_by_key(|(seq, _)| *seq);
            }
        }
        idem_admin_api::KeyHistory {
            key: key.to_owned(),
            events: events.into_iter().map(|(_, e)| e.clone()).collect(),
            kept: history.capacity as u64,
            since_ms: history.events.front().map(|(_, e)| e.ts_ms()),
        }
    }

    /// A claim of `key` by `holder` runs in this gateway until the returned
    /// guard drops.
    pub(crate) fn running(self: &Arc<Self>, key: &str, holder: u64) -> Running {
        let key: Arc<str> = Arc::from(key);
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Arc::clone(&key), holder);
        Running {
            observer: Arc::clone(self),
            key,
            holder,
        }
    }

    /// Whether the claim of `key` by `holder` runs in this gateway now.
    pub fn runs(&self, key: &str, holder: u64) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .is_some_and(|h| *h == holder)
    }

    /// What the admin API says about this gateway.
    pub fn gateway(&self) -> GatewayInfo {
        self.gateway
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Names the gateway (`--name`); an empty name leaves its address as its name.
    pub(crate) fn set_name(&self, name: &str) {
        name.clone_into(
            &mut self
                .gateway
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .name,
        );
    }

    /// Where the gateway's proxy listens, once bound.
    pub(crate) fn set_listen(&self, listen: &str) {
        let mut gateway = self.gateway.lock().unwrap_or_else(PoisonError::into_inner);
        listen.clone_into(&mut gateway.listen);
        if gateway.name.is_empty() {
            listen.clone_into(&mut gateway.name);
        }
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

/// Every atomic store call of the gateway's stack: a failure is logged at
/// warn and kept for its key's history; a write to a claim that runs here
/// is a renewal; each call is a span of the request's trace.
impl CallListener for Observer {
    fn called(&self, op: Op, key: &str, took: Duration, outcome: Result<(), &StoreError>) {
        match outcome {
            Err(error) => {
                tracing::warn!(
                    target: "idem::store",
                    op = op.as_str(),
                    key,
                    latency_us = took.as_micros() as u64,
                    %error,
                    "store call failed"
                );
                self.publish(Event::StoreError(StoreErrorEvent {
                    ts_ms: now_ms(),
                    key: key.to_owned(),
                    op,
                    error: error.to_string(),
                }));
            }
            Ok(()) if op == Op::Replace && self.running_key(key) => {
                tracing::debug!(target: "idem::store", key, "lease renewed");
                self.publish(Event::Renewal(RenewalEvent {
                    ts_ms: now_ms(),
                    key: key.to_owned(),
                }));
            }
            Ok(()) => {}
        }
        if let Some(traces) = &self.traces {
            traces.store_call(op, took, outcome);
        }
    }
}

impl Observer {
    fn running_key(&self, key: &str) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }
}

/// A claim running in this gateway: see [`Observer::running`].
pub(crate) struct Running {
    observer: Arc<Observer>,
    /// One allocation, shared with the map.
    key: Arc<str>,
    holder: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self
            .observer
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A newer claim of the key in this gateway (a takeover of this one)
        // stays: put back, which is rare; the usual drop hashes the key once.
        if let Some((key, holder)) = running.remove_entry(&*self.key)
            && holder != self.holder
        {
            running.insert(key, holder);
        }
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
        for (key, verdict) in [
            ("a", Verdict::Replayed),
            ("a", Verdict::Replayed),
            ("b", Verdict::Executed),
        ] {
            o.decided(key, verdict, Some(200), Duration::ZERO, None, None);
        }
        assert_eq!((o.replays("a"), o.replays("b")), (2, 0));
        assert_eq!(
            (o.count(Verdict::Replayed), o.count(Verdict::Executed)),
            (2, 1)
        );
        assert!(o.rate(Verdict::Replayed) > 0.0);
        o.forget_replays("a");
        assert_eq!(o.replays("a"), 0);
    }

    /// A key's history: its own events, the fault changes between its
    /// first and its last, the newest `history_events` of all keys.
    #[test]
    fn a_keys_history_is_its_events_and_the_faults_meanwhile() {
        let o = Observer::new(3, None);
        o.fault_changed(Op::Insert, FaultRule::error("before"), None);
        o.decided(
            "k",
            Verdict::Executed,
            Some(201),
            Duration::ZERO,
            None,
            Some(1),
        );
        o.fault_changed(
            Op::Insert,
            FaultRule::error("during"),
            Some("127.0.0.1:1".into()),
        );
        o.decided(
            "other",
            Verdict::Executed,
            Some(201),
            Duration::ZERO,
            None,
            Some(1),
        );
        o.decided(
            "k",
            Verdict::Replayed,
            Some(201),
            Duration::ZERO,
            None,
            None,
        );
        let history = o.history("k");
        let names: Vec<&str> = history.events.iter().map(Event::name).collect();
        assert_eq!(names, ["decision", "fault", "decision"]);
        assert_eq!(history.kept, 3);
        // Three more events of another key push k's out.
        for _ in 0..3 {
            o.decided(
                "other",
                Verdict::Replayed,
                Some(201),
                Duration::ZERO,
                None,
                None,
            );
        }
        assert!(o.history("k").events.is_empty());
        assert!(Observer::new(0, None).history("k").events.is_empty());
    }

    #[test]
    fn a_claim_runs_here_until_its_guard_drops() {
        let o = Arc::new(Observer::default());
        let running = o.running("k", 7);
        assert!(o.runs("k", 7) && !o.runs("k", 8));
        // A takeover by this gateway's newer claim outlives the old one's guard.
        let newer = o.running("k", 8);
        drop(running);
        assert!(o.runs("k", 8));
        drop(newer);
        assert!(!o.runs("k", 8));
    }
}
