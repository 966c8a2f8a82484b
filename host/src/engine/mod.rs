//! The guard component inside wasmtime.
//!
//! [`Runtime`] compiles the component once and keeps the `Engine` and the
//! `InstancePre`; a pool keeps ready instances, each in a cheap `Store`
//! of its own with a memory limit and an epoch deadline, so a call never
//! pays for instantiation on the hot path. A trap, a deadline or a failed
//! instantiation answers `Unavailable` — the guard fails closed — and the
//! instance is dropped, never reused.

mod async_host;
mod glue;
mod sync_host;

use crate::clock::Clock;
use crate::store::{Store, SyncStore};
use idem_guest::fingerprint::RequestParts;
use idem_guest::model::{self, GuardError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use wasmtime::component::Component;
use wasmtime::{Config, Engine, StoreLimits, StoreLimitsBuilder};

/// How often the engine's epoch advances; deadlines are counted in these.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits on every guard instance.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// The longest one guard call may take, store round trips included.
    /// Past it the instance is stopped and the call answers unavailable.
    pub call_timeout: Duration,
    /// Idle instances kept per pool; more are dropped when returned.
    pub max_idle: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 16 << 20,
            call_timeout: Duration::from_secs(10),
            max_idle: 256,
        }
    }
}

/// A compiled guard component, shared by every guard built on it.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    /// Linked to async store imports, for stores that wait on I/O.
    async_pre: async_host::Pre,
    /// Linked to sync store imports, for stores that never wait.
    sync_pre: sync_host::Pre,
    limits: Limits,
}

impl Runtime {
    /// The embedded guard component, compiled once per process.
    pub fn shared() -> Result<Runtime, GuardError> {
        static SHARED: OnceLock<Result<Runtime, GuardError>> = OnceLock::new();
        SHARED
            .get_or_init(|| Runtime::from_component(crate::component::COMPONENT, Limits::default()))
            .clone()
    }

    /// Compiles a component that implements the `idem` world.
    pub fn from_component(bytes: &[u8], limits: Limits) -> Result<Runtime, GuardError> {
        let fail =
            |what: &str, e: wasmtime::Error| GuardError::Unavailable(format!("{what}: {e:#}"));
        let mut config = Config::new();
        config.epoch_interruption(true);
        // The guard runs one call at a time per instance: no per-store
        // structures for concurrent guests. A trap is reported by its
        // message; walking the wasm stack for a backtrace is not needed.
        config.concurrency_support(false);
        config.wasm_backtrace_max_frames(None);
        let engine = Engine::new(&config).map_err(|e| fail("wasmtime engine", e))?;
        let component =
            Component::new(&engine, bytes).map_err(|e| fail("compile guard component", e))?;
        let mismatch = "guard component does not match the idem world";
        let async_pre = async_host::link(&engine, &component).map_err(|e| fail(mismatch, e))?;
        let sync_pre = sync_host::link(&engine, &component).map_err(|e| fail(mismatch, e))?;
        spawn_epoch_ticker(&engine);
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                async_pre,
                sync_pre,
                limits,
            }),
        })
    }

    pub fn limits(&self) -> Limits {
        self.inner.limits
    }
}

/// Advances the engine's epoch every tick until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("idem-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawn the epoch thread");
}

/// The host side of the `response` resource (`wit/types.wit`): the
/// response stays here and the guest holds a handle to it, so no body
/// crosses the boundary. Shared, so that `complete` gives its caller the
/// response back without a copy.
pub struct ResponseRep {
    response: Arc<model::Response>,
    /// The `expires-at-ms` of the record a store read lent it from.
    expires_at_ms: Option<u64>,
}

impl ResponseRep {
    /// The response, moved out when no one else holds it.
    fn unshare(response: Arc<model::Response>) -> model::Response {
        Arc::try_unwrap(response).unwrap_or_else(|shared| (*shared).clone())
    }
}

/// What the host gives one instance, of either flavour: `store` is how its
/// store imports reach the store, the flavour's own (`async_host::Timed`:
/// a `dyn Store` and the store timeout; or a `dyn SyncStore`).
struct State<S> {
    store: S,
    clock: Arc<dyn Clock>,
    limits: StoreLimits,
    /// The `response` handles the guest holds during a call.
    table: wasmtime::component::ResourceTable,
    /// The expiry of the last done record a store call of this guard call
    /// wrote or returned (`complete` reports it).
    done_expires_at_ms: Option<u64>,
}

impl<S> State<S> {
    /// Notes a done record a store call returned: when a completion
    /// writes nothing (its response already stored), its expiry is
    /// this record's.
    fn saw<R>(&mut self, record: &model::Record<R>) {
        if record.state == model::State::Done {
            self.done_expires_at_ms = Some(record.expires_at_ms);
        }
    }
}

/// One instance of the component, in a wasmtime store of its own.
enum Instance {
    Async(async_host::Instance),
    Sync(sync_host::Instance),
}

impl Instance {
    fn is_sync(&self) -> bool {
        matches!(self, Instance::Sync(_))
    }
}

/// Counters of one pool, for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub instantiated: u64,
    pub failed: u64,
    pub idle: usize,
    pub in_use: u64,
}

/// Ready instances over one store and clock.
pub(crate) struct Pool {
    runtime: Runtime,
    store: Arc<dyn Store>,
    /// The same store when it answers without I/O: then calls use the
    /// sync flavour, except while it says a call would wait.
    sync_store: Option<Arc<dyn SyncStore>>,
    clock: Arc<dyn Clock>,
    /// How long one store call may take (the async flavour's imports).
    store_timeout: Duration,
    idle: Mutex<Vec<Instance>>,
    instantiated: AtomicU64,
    failed: AtomicU64,
    in_use: AtomicU64,
}

/// Makes one export call on whichever flavour the checkout `$i` holds: the
/// sync instance at once, the async one awaited.
macro_rules! call {
    ($i:ident, $export:ident($($arg:expr),*)) => {
        match $i.instance() {
            Instance::Sync(s) => s.$export($($arg),*),
            Instance::Async(a) => a.$export($($arg),*).await,
        }
    };
}
impl Pool {
    pub(crate) fn new(
        runtime: Runtime,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        store_timeout: Duration,
    ) -> Pool {
        Pool {
            runtime,
            sync_store: store.as_sync(),
            store,
            clock,
            store_timeout,
            idle: Mutex::new(Vec::new()),
            instantiated: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            instantiated: self.instantiated.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            idle: self.lock_idle().len(),
            in_use: self.in_use.load(Ordering::Relaxed),
        }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Instance>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn checkout(&self) -> Result<Instance, GuardError> {
        let sync = self
            .sync_store
            .as_ref()
            .is_some_and(|store| !store.would_wait());
        let idle = {
            let mut idle = self.lock_idle();
            idle.iter()
                .rposition(|i| i.is_sync() == sync)
                .map(|at| idle.swap_remove(at))
        };
        let mut instance = match idle {
            Some(instance) => instance,
            None => self.instantiate(sync).await?,
        };
        let ticks = self.deadline_ticks();
        match &mut instance {
            Instance::Async(i) => i.set_epoch_deadline(ticks),
            Instance::Sync(i) => i.set_epoch_deadline(ticks),
        }
        Ok(instance)
    }

    /// The call timeout in epoch ticks (at least one).
    fn deadline_ticks(&self) -> u64 {
        let timeout = self.runtime.inner.limits.call_timeout;
        (timeout.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }

    /// A new instance of the sync flavour (the store must have a sync form)
    /// or of the async one.
    async fn instantiate(&self, sync: bool) -> Result<Instance, GuardError> {
        let inner = &self.runtime.inner;
        let instance = if let Some(store) = self.sync_store.as_ref().filter(|_| sync) {
            let store = self.wasm_store(store.clone());
            sync_host::Instance::new(&inner.sync_pre, store).map(Instance::Sync)
        } else {
            let store = self.wasm_store(async_host::Timed {
                store: self.store.clone(),
                timeout: self.store_timeout,
            });
            async_host::Instance::new(&inner.async_pre, store)
                .await
                .map(Instance::Async)
        };
        match instance {
            Ok(instance) => {
                self.instantiated.fetch_add(1, Ordering::Relaxed);
                Ok(instance)
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(GuardError::Unavailable(format!(
                    "guard instantiation failed: {e:#}"
                )))
            }
        }
    }

    /// A wasmtime store for one instance, with its memory limit and deadline.
    fn wasm_store<S: Send + 'static>(&self, store: S) -> wasmtime::Store<State<S>> {
        let limits = self.runtime.inner.limits;
        let limits = StoreLimitsBuilder::new()
            .memory_size(limits.memory_bytes)
            .instances(16)
            .build();
        let state = State {
            store,
            clock: self.clock.clone(),
            limits,
            table: wasmtime::component::ResourceTable::new(),
            done_expires_at_ms: None,
        };
        let mut store = wasmtime::Store::new(&self.runtime.inner.engine, state);
        store.limiter(|state| &mut state.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        store
    }

    async fn enter(&self) -> Result<Checkout<'_>, GuardError> {
        // The guard judges time by the store's authority: until it is known
        // (a server clock never read yet) no call may guess it.
        if let Err(why) = self.clock.known() {
            return Err(GuardError::Unavailable(format!(
                "the store's clock is not known: {why}"
            )));
        }
        let instance = self.checkout().await?;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok(Checkout {
            pool: self,
            instance: Some(instance),
        })
    }

    pub(crate) async fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        policy: &model::Policy,
    ) -> Result<(model::Decision, Option<u64>), GuardError> {
        let mut i = self.enter().await?;
        let r = call!(i, begin(key, fingerprint, policy));
        i.finish(r)?
    }

    pub(crate) async fn complete(
        &self,
        claim: model::Claim,
        response: model::Response,
        policy: &model::Policy,
    ) -> (model::Response, Result<u64, GuardError>) {
        let mut i = match self.enter().await {
            Ok(i) => i,
            Err(e) => return (response, Err(e)),
        };
        let (response, r) = call!(i, complete(claim, response, policy));
        (response, i.finish(r).and_then(|r| r))
    }

    pub(crate) async fn release(&self, claim: model::Claim) -> Result<(), GuardError> {
        let mut i = self.enter().await?;
        let r = call!(i, release(claim));
        i.finish(r)?
    }

    pub(crate) async fn renew(
        &self,
        claim: model::Claim,
        policy: &model::Policy,
    ) -> Result<model::Claim, GuardError> {
        let mut i = self.enter().await?;
        let r = call!(i, renew(claim, policy));
        i.finish(r)?
    }

    pub(crate) async fn save_checkpoint(
        &self,
        claim: model::Claim,
        checkpoint: model::Checkpoint,
        policy: &model::Policy,
    ) -> Result<model::Claim, GuardError> {
        let mut i = self.enter().await?;
        let r = call!(i, save_checkpoint(claim, checkpoint, policy));
        i.finish(r)?
    }

    pub(crate) async fn fingerprint(&self, parts: &RequestParts) -> Result<String, GuardError> {
        let mut i = self.enter().await?;
        let r = call!(i, fingerprint(parts));
        i.finish(r)
    }
}

/// An instance out of the pool for one call. Finished, a healthy instance
/// goes back to the pool and a failed one is dropped. Dropped unfinished
/// (the caller gave up on the call half-way), the instance is dropped too:
/// it may have stopped anywhere inside the guest.
struct Checkout<'a> {
    pool: &'a Pool,
    instance: Option<Instance>,
}

impl Checkout<'_> {
    fn instance(&mut self) -> &mut Instance {
        self.instance
            .as_mut()
            .expect("a checkout holds its instance until finished")
    }

    /// Returns a healthy instance to the pool, or drops a failed one and
    /// answers unavailable.
    fn finish<T>(mut self, result: wasmtime::Result<T>) -> Result<T, GuardError> {
        let instance = self.instance.take();
        let pool = self.pool;
        match result {
            Ok(value) => {
                let mut idle = pool.lock_idle();
                if idle.len() < pool.runtime.inner.limits.max_idle {
                    idle.extend(instance);
                }
                Ok(value)
            }
            Err(trap) => {
                pool.failed.fetch_add(1, Ordering::Relaxed);
                drop(instance);
                Err(GuardError::Unavailable(format!(
                    "guard component failed, instance replaced: {trap:#}"
                )))
            }
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}
