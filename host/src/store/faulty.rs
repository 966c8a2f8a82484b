//! Fault injection as a hook: `Faulty<S>` wraps any store and, per
//! operation, fails, delays, times out or loses replies as its
//! [`FaultHandle`] says. The handle belongs to whoever built the wrapper
//! (a test, the admin API) — there is no global registry.
//!
//! Rules and their text form are in [`super::fault_rule`].

use super::Store;
use super::fault_rule::{FaultKind, FaultRule, Op, ParseFaultError};
use super::hooked::{Hook, Hooked, Plan};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Controls the faults of one `Faulty` store. Clones control the same store.
#[derive(Clone, Default)]
pub struct FaultHandle {
    inner: Arc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// Lets the fault-free path skip the lock.
    any: AtomicBool,
    /// Whether a rule delays (`delay`, `timeout`): see [`Hook::would_wait`].
    waits: AtomicBool,
    rules: Mutex<BTreeMap<Op, FaultRule>>,
    injected: AtomicU64,
}

impl FaultHandle {
    /// Sets the rule for `op`; a rule that does not validate is refused and
    /// the old one stays.
    pub fn set(&self, op: Op, rule: FaultRule) -> Result<(), ParseFaultError> {
        rule.validate()?;
        let mut rules = self.lock();
        if rule.kind == FaultKind::Off {
            rules.remove(&op);
        } else {
            rules.insert(op, rule);
        }
        self.publish(&rules);
        Ok(())
    }

    /// Sets the same rule for every operation: `error` on all four is a store that is down.
    pub fn set_all(&self, rule: &FaultRule) -> Result<(), ParseFaultError> {
        for op in Op::ALL {
            self.set(op, rule.clone())?;
        }
        Ok(())
    }

    pub fn clear(&self, op: Op) {
        let _ = self.set(op, FaultRule::default());
    }

    pub fn clear_all(&self) {
        let mut rules = self.lock();
        rules.clear();
        self.publish(&rules);
    }

    /// Updates the flags the lock-free paths read, after `rules` changed.
    fn publish(&self, rules: &BTreeMap<Op, FaultRule>) {
        let waits = rules
            .values()
            .any(|r| matches!(r.kind, FaultKind::Delay | FaultKind::Timeout));
        self.inner.waits.store(waits, Ordering::SeqCst);
        self.inner.any.store(!rules.is_empty(), Ordering::SeqCst);
    }

    /// Whether a rule in force makes calls wait.
    fn waits(&self) -> bool {
        self.inner.waits.load(Ordering::Relaxed)
    }

    /// The rules in force, by operation.
    pub fn rules(&self) -> BTreeMap<Op, FaultRule> {
        self.lock().clone()
    }

    /// How many calls a fault has hit so far.
    pub fn injected(&self) -> u64 {
        self.inner.injected.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Op, FaultRule>> {
        self.inner
            .rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decides whether this call of `op` is hit, consuming a count if so.
    fn hit(&self, op: Op) -> Option<FaultRule> {
        if !self.inner.any.load(Ordering::Relaxed) {
            return None;
        }
        let mut rules = self.lock();
        let rule = rules.get_mut(&op)?;
        if rule.probability < 1.0 && fastrand::f64() >= rule.probability {
            return None;
        }
        let hit = rule.clone();
        if let Some(n) = rule.count.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                rules.remove(&op);
                self.publish(&rules);
            }
        }
        self.inner.injected.fetch_add(1, Ordering::Relaxed);
        Some(hit)
    }
}

/// A store that misbehaves on purpose, as its [`FaultHandle`] says.
pub type Faulty<S> = Hooked<S, FaultHandle>;

impl<S: Store> Faulty<S> {
    /// `inner` with no fault yet, and the handle that sets them.
    pub fn new(inner: S) -> (Self, FaultHandle) {
        let faults = FaultHandle::default();
        (Hooked::wrap(inner, faults.clone()), faults)
    }
}

/// A rule that hits fails, delays, times out or loses the reply of the
/// call. While a rule delays, [`Hook::would_wait`] sends calls to the async
/// side, which can wait; a call that was already on its way on the sync side
/// when such a rule was set gets it without the wait (a `timeout` fails at
/// once, a `delay` runs at once).
impl Hook for FaultHandle {
    fn before(&self, op: Op) -> Plan {
        let Some(rule) = self.hit(op) else {
            return Plan::Run;
        };
        let latency = Duration::from_millis(rule.latency_ms);
        match rule.kind {
            FaultKind::Off => Plan::Run,
            FaultKind::Error => Plan::Fail {
                after: Duration::ZERO,
                reason: format!("{} (injected on {})", rule.message, op.as_str()),
            },
            FaultKind::Timeout => Plan::Fail {
                after: latency,
                reason: format!(
                    "{} timed out after {} ms (injected)",
                    op.as_str(),
                    rule.latency_ms
                ),
            },
            FaultKind::Delay => Plan::Delay(latency),
            FaultKind::Lost => Plan::Lose(format!(
                "reply to {} lost (injected; the operation was applied)",
                op.as_str()
            )),
        }
    }

    fn would_wait(&self) -> bool {
        self.waits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_rules_switch_off() {
        let faults = FaultHandle::default();
        faults
            .set(Op::Insert, FaultRule::error("x").times(2))
            .unwrap();
        assert!(faults.hit(Op::Insert).is_some());
        assert!(faults.hit(Op::Get).is_none());
        assert!(faults.hit(Op::Insert).is_some());
        assert!(faults.hit(Op::Insert).is_none());
        assert!(faults.rules().is_empty());
        assert_eq!(faults.injected(), 2);
    }
}
