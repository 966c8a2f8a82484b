//! Fault injection as a decorator: `Faulty<S>` wraps any store and, per
//! operation, fails, delays, times out or loses replies as its
//! [`FaultHandle`] says. The handle belongs to whoever built the decorator
//! (a test, the admin API) — there is no global registry.
//!
//! Rules and their text form are in [`super::fault_rule`].

use super::fault_rule::{FaultKind, FaultRule, Op, ParseFaultError};
use super::{Entry, InsertOutcome, ListQuery, Record, Store, StoreError, SyncStore};
use async_trait::async_trait;
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
    /// Whether a rule delays (`delay`, `timeout`): see [`SyncStore::would_wait`].
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
pub struct Faulty<S> {
    inner: S,
    faults: FaultHandle,
}

impl<S: Store> Faulty<S> {
    pub fn new(inner: S) -> (Self, FaultHandle) {
        let faults = FaultHandle::default();
        (
            Faulty {
                inner,
                faults: faults.clone(),
            },
            faults,
        )
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Runs `call` under the fault for `op`, if one hits.
    async fn apply<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(rule) = self.faults.hit(op) else {
            return call.await;
        };
        let effect = Effect::of(&rule, op);
        if !effect.wait.is_zero() {
            tokio::time::sleep(effect.wait).await;
        }
        let store = self.inner.name();
        match effect.then {
            Then::Run => call.await,
            Then::Fail(reason) => Err(StoreError::Unavailable { store, reason }),
            Then::RunAndFail(reason) => {
                let _applied = call.await;
                Err(StoreError::Unavailable { store, reason })
            }
        }
    }
}

/// What a rule that hits does to one call: wait, then one of [`Then`].
struct Effect {
    wait: Duration,
    then: Then,
}

enum Then {
    Run,
    /// Fails without running the call.
    Fail(String),
    /// Runs the call, then fails as if its reply were lost.
    RunAndFail(String),
}

impl Effect {
    fn of(rule: &FaultRule, op: Op) -> Effect {
        let latency = Duration::from_millis(rule.latency_ms);
        let (wait, then) = match rule.kind {
            FaultKind::Off => (Duration::ZERO, Then::Run),
            FaultKind::Error => (
                Duration::ZERO,
                Then::Fail(format!("{} (injected on {})", rule.message, op.as_str())),
            ),
            FaultKind::Timeout => (
                latency,
                Then::Fail(format!(
                    "{} timed out after {} ms (injected)",
                    op.as_str(),
                    rule.latency_ms
                )),
            ),
            FaultKind::Delay => (latency, Then::Run),
            FaultKind::Lost => (
                Duration::ZERO,
                Then::RunAndFail(format!(
                    "reply to {} lost (injected; the operation was applied)",
                    op.as_str()
                )),
            ),
        };
        Effect { wait, then }
    }
}

#[async_trait]
impl<S: Store> Store for Faulty<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        self.apply(Op::Get, self.inner.get(key, now_ms)).await
    }
    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        self.apply(Op::Insert, self.inner.insert(key, record, now_ms))
            .await
    }
    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.apply(
            Op::Replace,
            self.inner.replace(key, expected_version, record, now_ms),
        )
        .await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        self.apply(Op::Delete, self.inner.delete(key, expected_version))
            .await
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
        Some(Arc::new(FaultySync {
            inner: self.inner.as_sync()?,
            faults: self.faults.clone(),
            store: self.inner.name(),
        }))
    }
}

/// The sync form of a [`Faulty`] store, over the sync form of its inner
/// store, with the same rules. While a rule delays, [`SyncStore::would_wait`]
/// sends calls to the async form, which can wait; a call that was already
/// on its way when such a rule was set gets it without the wait (a
/// `timeout` fails at once, a `delay` runs at once).
struct FaultySync {
    inner: Arc<dyn SyncStore>,
    faults: FaultHandle,
    store: &'static str,
}

impl FaultySync {
    fn apply<T>(
        &self,
        op: Op,
        call: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(rule) = self.faults.hit(op) else {
            return call();
        };
        // No wait here: see the type's docs.
        let store = self.store;
        match Effect::of(&rule, op).then {
            Then::Run => call(),
            Then::Fail(reason) => Err(StoreError::Unavailable { store, reason }),
            Then::RunAndFail(reason) => {
                let _applied = call();
                Err(StoreError::Unavailable { store, reason })
            }
        }
    }
}

impl SyncStore for FaultySync {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        self.apply(Op::Get, || self.inner.get_now(key, now_ms))
    }
    fn insert_now(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        self.apply(Op::Insert, || self.inner.insert_now(key, record, now_ms))
    }
    fn replace_now(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.apply(Op::Replace, || {
            self.inner
                .replace_now(key, expected_version, record, now_ms)
        })
    }
    fn delete_now(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        self.apply(Op::Delete, || self.inner.delete_now(key, expected_version))
    }
    fn would_wait(&self) -> bool {
        self.faults.waits() || self.inner.would_wait()
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
