//! One way to wrap a store: [`Hooked<S, H>`] runs each atomic operation
//! through a [`Hook`], which decides before the call what becomes of it
//! (a [`Plan`]: run it, delay it, fail it, lose its reply) and hears after
//! it how it went. Fault injection ([`super::Faulty`]), timing
//! ([`super::Timed`]) and hiding the sync side ([`AsyncOnly`]) are hooks;
//! [`super::stack`] puts the gateway's together.
//!
//! The one wrapper serves both sides of a store. Over a [`Store`] it is a
//! `Store`; its [`Store::as_sync`] is the same wrapper with the same hook
//! over the inner store's sync side, a [`SyncStore`]. So a hooked memory
//! store keeps the engine's sync fast path, and a hook that may make a call
//! wait says so ([`Hook::would_wait`]) to send calls to the async flavour,
//! which can wait without holding up the thread.
//!
//! ```
//! use idem::store::{FaultRule, Faulty, MemoryStore, Op, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (store, faults) = Faulty::new(MemoryStore::new());
//! faults.set(Op::Get, FaultRule::error("disk on fire")).unwrap();
//! assert!(store.get("order-1", 1_000).await.is_err());
//! // The sync side is the same wrapper, with the same rules.
//! assert!(store.as_sync().unwrap().get_now("order-1", 1_000).is_err());
//! # }
//! ```

use super::codec::unavailable;
use super::{Entry, InsertOutcome, ListQuery, Op, Record, Result, Store, StoreError, SyncStore};
use crate::clock::Clock;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What happens to one call, decided by a [`Hook`] before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    Run,
    /// Wait, then run.
    Delay(Duration),
    /// Wait, then fail as unavailable without running.
    Fail {
        after: Duration,
        reason: String,
    },
    /// Run, then fail as unavailable, as if the reply were lost: the
    /// operation is applied and the caller cannot know it.
    Lose(String),
}

/// Acts around each atomic operation (`get`, `insert`, `replace`,
/// `delete`) of a [`Hooked`] store; `list` and `purge_expired`, the
/// operators' and the purger's, pass through untouched. Cheap to clone: the
/// sync side gets a clone.
pub trait Hook: Clone + Send + Sync + 'static {
    /// Whether the wrapper reads the clock around each call for
    /// [`Hook::after`]. A hook that does not need the duration pays nothing.
    const TIMES: bool = false;

    /// Whether the wrapper offers the inner store's sync side
    /// ([`Store::as_sync`]); without it the engine always takes the async
    /// flavour.
    const KEEPS_SYNC: bool = true;

    fn before(&self, _op: Op) -> Plan {
        Plan::Run
    }

    /// After each call on `key`: how long it took, waits included (with
    /// [`Hook::TIMES`], else `None`), and whether it failed.
    fn after(
        &self,
        _op: Op,
        _key: &str,
        _took: Option<Duration>,
        _outcome: Result<(), &StoreError>,
    ) {
    }

    /// Whether [`Hook::before`] might plan a wait now. The sync side cannot
    /// wait: it runs a `Delay` at once and fails a `Fail` at once.
    fn would_wait(&self) -> bool {
        false
    }
}

/// The store `S` with every atomic operation run through the hook `H`.
/// `S` is a [`Store`], or on the sync side an `Arc<dyn SyncStore>`.
pub struct Hooked<S, H> {
    inner: S,
    hook: H,
    /// The inner store's name, for the errors a plan makes.
    store: &'static str,
}

impl<S: Store, H: Hook> Hooked<S, H> {
    pub fn wrap(inner: S, hook: H) -> Self {
        let store = inner.name();
        Hooked { inner, hook, store }
    }
}

impl<S, H: Hook> Hooked<S, H> {
    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn hook(&self) -> &H {
        &self.hook
    }

    async fn run<T>(&self, op: Op, key: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        let started = H::TIMES.then(Instant::now);
        let out = match self.hook.before(op) {
            Plan::Run => call.await,
            Plan::Delay(wait) => {
                sleep(wait).await;
                call.await
            }
            Plan::Fail { after, reason } => {
                sleep(after).await;
                Err(unavailable(self.store, reason))
            }
            Plan::Lose(reason) => {
                let _applied = call.await;
                Err(unavailable(self.store, reason))
            }
        };
        self.after(op, key, started, &out);
        out
    }

    /// [`Hooked::run`] on the sync side, which cannot wait: see [`Hook::would_wait`].
    fn run_now<T>(&self, op: Op, key: &str, call: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = H::TIMES.then(Instant::now);
        let out = match self.hook.before(op) {
            Plan::Run | Plan::Delay(_) => call(),
            Plan::Fail { reason, .. } => Err(unavailable(self.store, reason)),
            Plan::Lose(reason) => {
                let _applied = call();
                Err(unavailable(self.store, reason))
            }
        };
        self.after(op, key, started, &out);
        out
    }

    fn after<T>(&self, op: Op, key: &str, started: Option<Instant>, out: &Result<T>) {
        let took = started.map(|s| s.elapsed());
        self.hook.after(op, key, took, out.as_ref().map(|_| ()));
    }
}

async fn sleep(wait: Duration) {
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// Each atomic operation runs through the hook, on the inner store.
#[async_trait]
impl<S: Store, H: Hook> Store for Hooked<S, H> {
    fn name(&self) -> &'static str {
        self.store
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        self.run(Op::Get, key, self.inner.get(key, now_ms)).await
    }
    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        self.run(Op::Insert, key, self.inner.insert(key, record, now_ms))
            .await
    }
    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        let replaced = self.inner.replace(key, expected, record, now_ms);
        self.run(Op::Replace, key, replaced).await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        let deleted = self.inner.delete(key, expected_version, now_ms);
        self.run(Op::Delete, key, deleted).await
    }
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        self.inner.list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        self.inner.purge_expired(now_ms, limit).await
    }
    fn purges_itself(&self) -> bool {
        self.inner.purges_itself()
    }
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        if !H::KEEPS_SYNC {
            return None;
        }
        Some(Arc::new(Hooked {
            inner: self.inner.as_sync()?,
            hook: self.hook.clone(),
            store: self.store,
        }))
    }
}

/// The sync side, as [`Store::as_sync`] makes it: the same, but a call
/// cannot wait (see [`Hook::would_wait`]).
impl<H: Hook> SyncStore for Hooked<Arc<dyn SyncStore>, H> {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        self.run_now(Op::Get, key, || self.inner.get_now(key, now_ms))
    }
    fn insert_now(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        self.run_now(Op::Insert, key, || {
            self.inner.insert_now(key, record, now_ms)
        })
    }
    fn replace_now(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        self.run_now(Op::Replace, key, || {
            self.inner.replace_now(key, expected, record, now_ms)
        })
    }
    fn delete_now(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        self.run_now(Op::Delete, key, || {
            self.inner.delete_now(key, expected_version, now_ms)
        })
    }
    fn would_wait(&self) -> bool {
        self.hook.would_wait() || self.inner.would_wait()
    }
}

/// Hides the sync side: see [`AsyncOnly`].
#[derive(Clone, Copy, Debug, Default)]
pub struct HideSync;

impl Hook for HideSync {
    const KEEPS_SYNC: bool = false;
}

/// A store the engine calls through the async flavour, as it does a disk
/// or network store, even when it has a sync side: for tests and benchmarks
/// of that flavour over the memory store.
pub type AsyncOnly<S> = Hooked<S, HideSync>;

impl<S: Store> AsyncOnly<S> {
    pub fn new(inner: S) -> Self {
        Hooked::wrap(inner, HideSync)
    }
}
