//! Fault injection as a decorator: `Faulty<S>` wraps any store and, per
//! operation, fails, delays, times out or loses replies as its
//! [`FaultHandle`] says. The handle belongs to whoever built the decorator
//! (a test, the admin API) — there is no global registry.
//!
//! Rules have a small text form, after fail-rs: `[P%][N*]KIND[(ARG)]`, with
//! KIND one of `error(message)`, `timeout(ms)`, `delay(ms)`, `lost`, `off`:
//!
//! ```
//! use idem::store::{FaultRule, FaultKind};
//! let rule: FaultRule = "25%3*error(connection refused)".parse().unwrap();
//! assert_eq!(rule.kind, FaultKind::Error);
//! assert_eq!((rule.probability, rule.count), (0.25, Some(3)));
//! assert_eq!(rule.to_string(), "25%3*error(connection refused)");
//! ```

use super::{Entry, InsertOutcome, ListQuery, Record, Store, StoreError};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The store operations a fault can hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Get,
    Insert,
    Replace,
    Delete,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Get, Op::Insert, Op::Replace, Op::Delete];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Insert => "insert",
            Op::Replace => "replace",
            Op::Delete => "delete",
        }
    }
}

impl FromStr for Op {
    type Err = ParseFaultError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Op::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| {
                ParseFaultError(format!(
                    "unknown store operation {s:?}; expected get, insert, replace or delete"
                ))
            })
    }
}

/// What a fault does to an operation it hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Nothing: the rule is switched off.
    #[default]
    Off,
    /// Fails at once with the rule's message; nothing is applied.
    Error,
    /// Waits `latency_ms`, then fails as a timeout; nothing is applied.
    Timeout,
    /// Waits `latency_ms`, then runs the operation normally.
    Delay,
    /// Applies the operation, then fails as if the reply were lost.
    Lost,
}

/// One operation's fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultRule {
    pub kind: FaultKind,
    /// For `timeout` and `delay`.
    pub latency_ms: u64,
    /// The chance that each call is hit, from 0 to 1.
    pub probability: f64,
    /// Hit only this many more calls, then switch off.
    pub count: Option<u64>,
    /// For `error`.
    pub message: String,
}

impl Default for FaultRule {
    fn default() -> Self {
        FaultRule {
            kind: FaultKind::Off,
            latency_ms: 0,
            probability: 1.0,
            count: None,
            message: String::new(),
        }
    }
}

impl FaultRule {
    pub fn error(message: impl Into<String>) -> Self {
        FaultRule {
            kind: FaultKind::Error,
            message: message.into(),
            ..Self::default()
        }
    }
    pub fn timeout(after: Duration) -> Self {
        FaultRule {
            kind: FaultKind::Timeout,
            latency_ms: after.as_millis() as u64,
            ..Self::default()
        }
    }
    pub fn delay(by: Duration) -> Self {
        FaultRule {
            kind: FaultKind::Delay,
            latency_ms: by.as_millis() as u64,
            ..Self::default()
        }
    }
    pub fn lost() -> Self {
        FaultRule {
            kind: FaultKind::Lost,
            ..Self::default()
        }
    }
    /// Hits only the next `n` calls.
    #[must_use]
    pub fn times(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }
    /// Hits each call with probability `p` (0 to 1).
    #[must_use]
    pub fn with_probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }

    fn validate(&self) -> Result<(), ParseFaultError> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(ParseFaultError(format!(
                "probability {} is outside 0 to 1",
                self.probability
            )));
        }
        if self.latency_ms > MAX_LATENCY_MS {
            return Err(ParseFaultError(format!(
                "latency {} ms is over the limit of {MAX_LATENCY_MS} ms",
                self.latency_ms
            )));
        }
        Ok(())
    }
}

/// Faults longer than a minute are never what an operator meant.
const MAX_LATENCY_MS: u64 = 60_000;

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.probability < 1.0 {
            write!(f, "{}%", self.probability * 100.0)?;
        }
        if let Some(n) = self.count {
            write!(f, "{n}*")?;
        }
        match self.kind {
            FaultKind::Off => write!(f, "off"),
            FaultKind::Error => write!(f, "error({})", self.message),
            FaultKind::Timeout => write!(f, "timeout({})", self.latency_ms),
            FaultKind::Delay => write!(f, "delay({})", self.latency_ms),
            FaultKind::Lost => write!(f, "lost"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad fault rule: {0}")]
pub struct ParseFaultError(pub String);

impl FromStr for FaultRule {
    type Err = ParseFaultError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| {
            ParseFaultError(format!(
                "{text:?}: {why}; expected [P%][N*]error(msg)|timeout(ms)|delay(ms)|lost|off"
            ))
        };
        let mut rule = FaultRule::default();
        let mut rest = text.trim();
        if let Some((p, tail)) = rest.split_once('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| bad(format!("{p:?} is not a percentage")))?;
            rule.probability = p / 100.0;
            rest = tail;
        }
        if let Some((n, tail)) = rest
            .split_once('*')
            .filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
        {
            rule.count = Some(
                n.parse()
                    .map_err(|_| bad(format!("{n:?} is not a count")))?,
            );
            rest = tail;
        }
        let (kind, arg) = match rest.split_once('(') {
            Some((kind, arg)) => {
                let arg = arg
                    .strip_suffix(')')
                    .ok_or_else(|| bad("missing ')'".into()))?;
                (kind, Some(arg))
            }
            None => (rest, None),
        };
        let ms = |arg: Option<&str>| -> Result<u64, ParseFaultError> {
            let arg = arg.ok_or_else(|| bad(format!("{kind} needs a duration in ms")))?;
            arg.trim_end_matches("ms")
                .trim()
                .parse()
                .map_err(|_| bad(format!("{arg:?} is not a duration in ms")))
        };
        match kind {
            "off" => {}
            "error" => {
                rule.kind = FaultKind::Error;
                arg.unwrap_or("injected fault")
                    .clone_into(&mut rule.message);
            }
            "timeout" => {
                rule.kind = FaultKind::Timeout;
                rule.latency_ms = ms(arg)?;
            }
            "delay" => {
                rule.kind = FaultKind::Delay;
                rule.latency_ms = ms(arg)?;
            }
            "lost" => rule.kind = FaultKind::Lost,
            other => return Err(bad(format!("unknown fault {other:?}"))),
        }
        rule.validate()?;
        Ok(rule)
    }
}

/// Controls the faults of one `Faulty` store. Clones control the same store.
#[derive(Clone, Default)]
pub struct FaultHandle {
    inner: Arc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// Lets the fault-free path skip the lock.
    any: AtomicBool,
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
        self.inner.any.store(!rules.is_empty(), Ordering::SeqCst);
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
        self.lock().clear();
        self.inner.any.store(false, Ordering::SeqCst);
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
                self.inner.any.store(!rules.is_empty(), Ordering::SeqCst);
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

    fn unavailable(&self, reason: String) -> StoreError {
        StoreError::Unavailable {
            store: self.inner.name(),
            reason,
        }
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
        let latency = Duration::from_millis(rule.latency_ms);
        match rule.kind {
            FaultKind::Off => call.await,
            FaultKind::Error => {
                Err(self.unavailable(format!("{} (injected on {})", rule.message, op.as_str())))
            }
            FaultKind::Timeout => {
                tokio::time::sleep(latency).await;
                Err(self.unavailable(format!(
                    "{} timed out after {} ms (injected)",
                    op.as_str(),
                    rule.latency_ms
                )))
            }
            FaultKind::Delay => {
                tokio::time::sleep(latency).await;
                call.await
            }
            FaultKind::Lost => {
                let _applied = call.await;
                Err(self.unavailable(format!(
                    "reply to {} lost (injected; the operation was applied)",
                    op.as_str()
                )))
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_round_trips() {
        for text in [
            "error(connection refused)",
            "timeout(200)",
            "delay(5)",
            "lost",
            "50%lost",
            "3*error(x)",
            "10%2*delay(1)",
        ] {
            let rule: FaultRule = text.parse().unwrap();
            assert_eq!(rule.to_string(), text);
        }
        assert_eq!("delay(5ms)".parse::<FaultRule>().unwrap().latency_ms, 5);
    }

    #[test]
    fn bad_rules_name_the_problem() {
        let err = "explode".parse::<FaultRule>().unwrap_err().to_string();
        assert!(err.contains("unknown fault \"explode\""), "{err}");
        let err = "150%lost".parse::<FaultRule>().unwrap_err().to_string();
        assert!(err.contains("outside 0 to 1"), "{err}");
        let err = "delay(99999999)"
            .parse::<FaultRule>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("limit of 60000 ms"), "{err}");
        assert!("timeout".parse::<FaultRule>().is_err());
    }

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
