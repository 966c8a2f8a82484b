//! The guard component inside wasmtime.
//!
//! [`Runtime`] compiles the component once and keeps the `Engine` and the
//! `InstancePre`; a [`Pool`] keeps ready instances, each in a cheap `Store`
//! of its own with a memory limit and an epoch deadline, so a call never
//! pays for instantiation on the hot path. A trap, a deadline or a failed
//! instantiation answers `Unavailable` — the guard fails closed — and the
//! instance is dropped, never reused.

use crate::clock::Clock;
use crate::store::{Store, StoreError};
use idem_guest::model::{self, GuardError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, StoreLimits, StoreLimitsBuilder};

#[allow(clippy::pedantic)] // generated
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "idem",
        imports: { default: async },
        exports: { default: async },
    });
}

use bindings::exports::idem::guard::guard as wit;
use bindings::idem::guard::{store as wit_store, types as wit_types};
use bindings::{Idem, IdemPre};

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
    pre: IdemPre<HostState>,
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
        let engine = Engine::new(&config).map_err(|e| fail("wasmtime engine", e))?;
        let component =
            Component::new(&engine, bytes).map_err(|e| fail("compile guard component", e))?;
        let mut linker = Linker::<HostState>::new(&engine);
        Idem::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(|e| fail("link guard component", e))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| fail("guard component does not match the idem world", e))?;
        let pre =
            IdemPre::new(pre).map_err(|e| fail("guard component does not export the guard", e))?;
        spawn_epoch_ticker(&engine);
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                pre,
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

/// What the host gives one instance: the store primitives and the clock.
pub(crate) struct HostState {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    limits: StoreLimits,
}

struct Instance {
    store: wasmtime::Store<HostState>,
    guard: Idem,
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
    clock: Arc<dyn Clock>,
    idle: Mutex<Vec<Instance>>,
    instantiated: AtomicU64,
    failed: AtomicU64,
    in_use: AtomicU64,
}

impl Pool {
    pub(crate) fn new(runtime: Runtime, store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Pool {
        Pool {
            runtime,
            store,
            clock,
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
        let idle = self.lock_idle().pop();
        let mut instance = match idle {
            Some(instance) => instance,
            None => self.instantiate().await?,
        };
        instance.store.set_epoch_deadline(self.deadline_ticks());
        Ok(instance)
    }

    /// The call timeout in epoch ticks (at least one).
    fn deadline_ticks(&self) -> u64 {
        let timeout = self.runtime.inner.limits.call_timeout;
        (timeout.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }

    async fn instantiate(&self) -> Result<Instance, GuardError> {
        let limits = self.runtime.inner.limits;
        let state = HostState {
            store: self.store.clone(),
            clock: self.clock.clone(),
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .instances(16)
                .build(),
        };
        let mut store = wasmtime::Store::new(&self.runtime.inner.engine, state);
        store.limiter(|state| &mut state.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks());
        match self.runtime.inner.pre.instantiate_async(&mut store).await {
            Ok(guard) => {
                self.instantiated.fetch_add(1, Ordering::Relaxed);
                Ok(Instance { store, guard })
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(GuardError::Unavailable(format!(
                    "guard instantiation failed: {e:#}"
                )))
            }
        }
    }

    /// Returns a healthy instance to the pool, or drops a failed one and
    /// answers unavailable.
    fn finish<T>(&self, instance: Instance, result: wasmtime::Result<T>) -> Result<T, GuardError> {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        match result {
            Ok(value) => {
                let mut idle = self.lock_idle();
                if idle.len() < self.runtime.inner.limits.max_idle {
                    idle.push(instance);
                }
                Ok(value)
            }
            Err(trap) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                drop(instance);
                Err(GuardError::Unavailable(format!(
                    "guard component failed, instance replaced: {trap:#}"
                )))
            }
        }
    }

    async fn enter(&self) -> Result<Instance, GuardError> {
        let instance = self.checkout().await?;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok(instance)
    }

    pub(crate) async fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        policy: &model::Policy,
    ) -> Result<model::Decision, GuardError> {
        let mut i = self.enter().await?;
        let r = i
            .guard
            .idem_guard_guard()
            .call_begin(&mut i.store, key, fingerprint, to_wit_policy(policy))
            .await;
        self.finish(i, r)?
            .map(from_wit_decision)
            .map_err(from_wit_error)
    }

    pub(crate) async fn complete(
        &self,
        claim: model::Claim,
        response: model::Response,
        policy: &model::Policy,
    ) -> (model::Response, Result<(), GuardError>) {
        let mut i = match self.enter().await {
            Ok(i) => i,
            Err(e) => return (response, Err(e)),
        };
        let claim = to_wit_claim(claim);
        let response = to_wit_response(response);
        let r = i
            .guard
            .idem_guard_guard()
            .call_complete(&mut i.store, &claim, &response, to_wit_policy(policy))
            .await;
        let result = self.finish(i, r).and_then(|r| r.map_err(from_wit_error));
        (from_wit_response(response), result)
    }

    pub(crate) async fn release(&self, claim: model::Claim) -> Result<(), GuardError> {
        let mut i = self.enter().await?;
        let r = i
            .guard
            .idem_guard_guard()
            .call_release(&mut i.store, &to_wit_claim(claim))
            .await;
        self.finish(i, r)?.map_err(from_wit_error)
    }

    pub(crate) async fn renew(
        &self,
        claim: model::Claim,
        policy: &model::Policy,
    ) -> Result<model::Claim, GuardError> {
        let mut i = self.enter().await?;
        let r = i
            .guard
            .idem_guard_guard()
            .call_renew(&mut i.store, &to_wit_claim(claim), to_wit_policy(policy))
            .await;
        self.finish(i, r)?
            .map(from_wit_claim)
            .map_err(from_wit_error)
    }

    pub(crate) async fn fingerprint(
        &self,
        parts: &crate::RequestParts,
    ) -> Result<String, GuardError> {
        let mut i = self.enter().await?;
        let parts = wit::RequestParts {
            method: parts.method.clone(),
            path: parts.path.clone(),
            headers: parts.headers.clone(),
            body: parts.body.clone(),
        };
        let r = i
            .guard
            .idem_guard_guard()
            .call_fingerprint(&mut i.store, &parts)
            .await;
        self.finish(i, r)
    }
}

impl wit_types::Host for HostState {}

impl bindings::idem::guard::clock::Host for HostState {
    async fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}

impl wit_store::Host for HostState {
    async fn get(
        &mut self,
        key: String,
        now_ms: u64,
    ) -> Result<Option<wit_types::Entry>, wit_store::StoreError> {
        match self.store.get(&key, now_ms).await {
            Ok(entry) => Ok(entry.map(to_wit_entry)),
            Err(e) => Err(to_wit_store_error(e)),
        }
    }

    async fn insert(
        &mut self,
        key: String,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<wit_store::InsertOutcome, wit_store::StoreError> {
        match self
            .store
            .insert(&key, from_wit_record(record), now_ms)
            .await
        {
            Ok(model::InsertOutcome::Inserted(v)) => Ok(wit_store::InsertOutcome::Inserted(v)),
            Ok(model::InsertOutcome::Existing(e)) => {
                Ok(wit_store::InsertOutcome::Existing(to_wit_entry(e)))
            }
            Err(e) => Err(to_wit_store_error(e)),
        }
    }

    async fn replace(
        &mut self,
        key: String,
        expected_version: u64,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<Option<u64>, wit_store::StoreError> {
        self.store
            .replace(&key, expected_version, from_wit_record(record), now_ms)
            .await
            .map_err(to_wit_store_error)
    }

    async fn delete(
        &mut self,
        key: String,
        expected_version: Option<u64>,
    ) -> Result<bool, wit_store::StoreError> {
        self.store
            .delete(&key, expected_version)
            .await
            .map_err(to_wit_store_error)
    }
}

// Conversions between the generated types and the plain ones. All moves: no
// string or body is copied.

#[allow(clippy::needless_pass_by_value)] // used as `map_err(to_wit_store_error)`
fn to_wit_store_error(e: StoreError) -> wit_store::StoreError {
    match e {
        StoreError::Unavailable { .. } => wit_store::StoreError::Unavailable(e.to_string()),
        StoreError::Corrupt { .. } => wit_store::StoreError::Corrupt(e.to_string()),
    }
}

fn to_wit_entry(e: model::Entry) -> wit_types::Entry {
    let r = e.record;
    wit_types::Entry {
        record: wit_types::Record {
            fingerprint: r.fingerprint,
            state: match r.state {
                model::State::Processing => wit_types::State::Processing,
                model::State::Done => wit_types::State::Done,
            },
            lease_until_ms: r.lease_until_ms,
            expires_at_ms: r.expires_at_ms,
            response: r.response.map(to_wit_response),
        },
        version: e.version,
    }
}

fn from_wit_record(r: wit_types::Record) -> model::Record {
    model::Record {
        fingerprint: r.fingerprint,
        state: match r.state {
            wit_types::State::Processing => model::State::Processing,
            wit_types::State::Done => model::State::Done,
        },
        lease_until_ms: r.lease_until_ms,
        expires_at_ms: r.expires_at_ms,
        response: r.response.map(from_wit_response),
    }
}

fn to_wit_response(r: model::Response) -> wit_types::Response {
    wit_types::Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    }
}

fn from_wit_response(r: wit_types::Response) -> model::Response {
    model::Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    }
}

fn to_wit_policy(p: &model::Policy) -> wit::Policy {
    wit::Policy {
        lease_ms: p.lease_ms,
        retention_ms: p.retention_ms,
        max_response_bytes: p.max_response_bytes,
    }
}

fn to_wit_claim(c: model::Claim) -> wit::Claim {
    wit::Claim {
        key: c.key,
        fingerprint: c.fingerprint,
        fence: c.fence,
        lease_until_ms: c.lease_until_ms,
        expires_at_ms: c.expires_at_ms,
    }
}

fn from_wit_claim(c: wit::Claim) -> model::Claim {
    model::Claim {
        key: c.key,
        fingerprint: c.fingerprint,
        fence: c.fence,
        lease_until_ms: c.lease_until_ms,
        expires_at_ms: c.expires_at_ms,
    }
}

fn from_wit_decision(d: wit::Decision) -> model::Decision {
    match d {
        wit::Decision::Proceed(c) => model::Decision::Proceed(from_wit_claim(c)),
        wit::Decision::Replay(r) => model::Decision::Replay(from_wit_response(r)),
        wit::Decision::InFlight(ms) => model::Decision::InFlight { retry_after_ms: ms },
        wit::Decision::Conflict => model::Decision::Conflict,
    }
}

fn from_wit_error(e: wit::GuardError) -> GuardError {
    match e {
        wit::GuardError::Unavailable(why) => GuardError::Unavailable(why),
        wit::GuardError::InvalidInput(why) => GuardError::InvalidInput(why),
        wit::GuardError::StaleClaim(why) => GuardError::StaleClaim(why),
    }
}
