//! The guard as Rust callers use it: claim a key, run a handler once, store
//! its response, replay it to every repeat — through the component.
//!
//! `mod.rs` holds the guard, its builder and the claim lifecycle
//! ([`Guard::run`], [`Guard::execute`]); `progress.rs` what a handler holds
//! while it runs: its claim, renewed in the background, and its
//! checkpoints ([`Progress`]).

mod progress;

pub use progress::Progress;

use crate::clock::Clock;
use crate::engine::{Pool, PoolStats, Runtime};
use crate::store::{PurgeStats, Purger, Store};
use idem_guest::model::{Checkpoint, Claim, Decision, GuardError, Policy, Response};
use std::sync::Arc;
use std::time::Duration;

/// What `run` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran (exactly once for this key) and its response is stored.
    Executed(Response),
    /// The handler had already run with these parameters: its stored response.
    Replayed(Response),
    /// Another caller holds the key; nothing ran. Retry after this long.
    InFlight { retry_after: Duration },
    /// The key was used with other parameters; nothing ran.
    Conflict,
    /// The store (or the guard component) failed; nothing ran. Fail closed.
    Unavailable(String),
}

impl Outcome {
    /// The seed's names: `EXECUTED`, `REPLAYED`, `IN_FLIGHT`, `CONFLICT`, `UNAVAILABLE`.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Executed(_) => "EXECUTED",
            Outcome::Replayed(_) => "REPLAYED",
            Outcome::InFlight { .. } => "IN_FLIGHT",
            Outcome::Conflict => "CONFLICT",
            Outcome::Unavailable(_) => "UNAVAILABLE",
        }
    }
}

/// Why `run` did not produce an outcome.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    /// The handler failed. Its claim was released, or held until its lease
    /// runs out, as the guard's [`OnHandlerError`] says.
    #[error("handler failed: {0}")]
    Handler(E),
    /// The key or fingerprint breaks a limit; nothing ran.
    #[error("{0}")]
    InvalidInput(String),
    /// The handler ran but its response could not be stored (the store
    /// failed, the response was too large, or the claim was taken over).
    /// Here is the response; the key stays claimed until its lease runs out,
    /// and then a retry runs the handler again — the downstream operation
    /// must absorb that retry, as after a crash.
    #[error("the handler ran but its response was not recorded: {error}")]
    NotRecorded {
        response: Response,
        error: GuardError,
    },
}

/// What happens to a claim when its handler fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnHandlerError {
    /// Give the claim up: a retry runs at once. Right when a failed handler
    /// left no side effect behind.
    #[default]
    Release,
    /// Keep the claim until its lease runs out, as if the process had crashed.
    Hold,
}

/// The proof of a claim, passed to the handler: pass it downstream so that a
/// stale holder's writes can be refused there too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fence(pub u64);

/// How a handler run under [`Guard::execute`] ends its claim.
#[derive(Debug)]
pub enum Settle<E> {
    /// Store this response: every repeat replays it.
    Complete(Response),
    /// Nothing happened that a retry must not repeat: give the claim up so
    /// a retry runs at once.
    Release(E),
    /// Something may have happened: keep the claim until its lease runs out,
    /// as after a crash.
    Hold(E),
}

/// How a claim handed to [`Guard::execute`] ended.
#[derive(Debug)]
pub enum Settled<E> {
    /// The handler ran and its response is stored until `expires_at_ms`
    /// (as in [`Guard::begin_expiring`]).
    Completed {
        response: Response,
        expires_at_ms: u64,
    },
    /// The handler ran but its response could not be stored (the store
    /// failed, the response broke a limit, or the claim was taken over);
    /// the key stays claimed until its lease runs out.
    NotRecorded {
        response: Response,
        error: GuardError,
    },
    /// The handler asked for a release; `released` says whether the store took it
    /// (if not, the lease runs out as usual).
    Released {
        error: E,
        released: Result<(), GuardError>,
    },
    /// The handler asked to hold the claim.
    Held(E),
    /// The handler never ran: the claim's lease could not be made to cover
    /// the handler's time from now (the store failed, or the claim was
    /// taken over while it was being made). The claim was given up.
    NotStarted(GuardError),
}

/// The parts of a request that make its fingerprint, with
/// [`RequestParts::fingerprint`] computed natively: the same code as the
/// component's (equal to [`Guard::fingerprint`] for every request).
pub use idem_guest::fingerprint::RequestParts;

/// An idempotency guard over one store. Cheap to clone; clones share instances.
#[derive(Clone)]
pub struct Guard {
    pool: Arc<Pool>,
    policy: Policy,
    on_handler_error: OnHandlerError,
    renew_lease: bool,
    /// The longest one store call may take (the completion's bound).
    store_timeout: Duration,
    /// Stops with the last clone of the guard.
    purger: Option<Arc<Purger>>,
}

/// Builds a [`Guard`].
pub struct GuardBuilder {
    store: Arc<dyn Store>,
    /// `None`: the store's time authority.
    clock: Option<Arc<dyn Clock>>,
    runtime: Option<Runtime>,
    policy: Policy,
    on_handler_error: OnHandlerError,
    renew_lease: bool,
    store_timeout: Duration,
    purge_every: Option<Duration>,
}

/// How long one store call may take by default.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often expired records are purged by default.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_mins(1);
/// Records freed per purge batch.
const PURGE_BATCH: usize = 1_000;

impl GuardBuilder {
    /// The clock the guard judges leases and retention by (default: the
    /// store's time authority, [`Store::clock`]): for tests, a
    /// [`ManualClock`](crate::ManualClock). With a clock of its own the guard
    /// does not check that the lease outlasts a renewal
    /// ([`check_lease_renewable`](crate::check_lease_renewable)): its time
    /// need not be real time.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How long a claim is held before another caller may take it over.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy.lease_ms = lease.as_millis() as u64;
        self
    }

    /// How long keys are remembered after their latest claim or completion.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.policy.retention_ms = retention.as_millis() as u64;
        self
    }

    /// The largest response stored, body plus headers (default 1 MiB).
    #[must_use]
    pub fn max_response_bytes(mut self, bytes: u32) -> Self {
        self.policy.max_response_bytes = bytes;
        self
    }

    #[must_use]
    pub fn on_handler_error(mut self, policy: OnHandlerError) -> Self {
        self.on_handler_error = policy;
        self
    }

    /// Whether [`Guard::run`] renews the claim's lease while its handler is
    /// still running (default: yes, every third of the lease). Without it, a
    /// handler that outlives the lease can be taken over by a repeat and run
    /// twice; with it, only a holder that stopped renewing (crashed, or cut
    /// off from the store) loses its key.
    #[must_use]
    pub fn renew_lease(mut self, renew: bool) -> Self {
        self.renew_lease = renew;
        self
    }

    /// How long one store call may take (default 5 s). Past it the call
    /// counts as failed — the guard fails closed, and a write it made may
    /// still be applied, as with a lost reply — so a hung store holds no
    /// caller longer than this per store call.
    #[must_use]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// How often expired records are purged (default every 60 s; `None`
    /// for never). Only where the store needs it (not Redis, which expires
    /// keys itself) and only when the guard is built inside a tokio runtime.
    #[must_use]
    pub fn purge_every(mut self, every: Option<Duration>) -> Self {
        self.purge_every = every;
        self
    }

    /// The compiled component to run (default: the embedded one, compiled
    /// once per process).
    #[must_use]
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    pub fn build(self) -> Result<Guard, GuardError> {
        idem_guest::limits::check_policy(&self.policy)?;
        let runtime = match self.runtime {
            Some(runtime) => runtime,
            None => Runtime::shared()?,
        };
        if self.store_timeout.is_zero() {
            return Err(GuardError::InvalidInput(
                "store-timeout must be at least 1 ms".into(),
            ));
        }
        // The lease must outlast a renewal in real time. A store that
        // answers from memory never waits out its timeout, and a clock the
        // caller gives (a test's manual one) is not real time.
        if self.renew_lease && self.clock.is_none() && self.store.as_sync().is_none() {
            let lease = Duration::from_millis(self.policy.lease_ms);
            crate::lease::check_lease_renewable(lease, self.store_timeout)
                .map_err(|e| GuardError::InvalidInput(e.to_string()))?;
        }
        let clock = self.clock.unwrap_or_else(|| self.store.clock());
        let purger = self
            .purge_every
            .filter(|every| !every.is_zero() && !self.store.purges_itself())
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .map(|every| {
                Arc::new(Purger::spawn(
                    self.store.clone(),
                    clock.clone(),
                    every,
                    PURGE_BATCH,
                ))
            });
        Ok(Guard {
            pool: Arc::new(Pool::new(runtime, self.store, clock, self.store_timeout)),
            policy: self.policy,
            on_handler_error: self.on_handler_error,
            renew_lease: self.renew_lease,
            store_timeout: self.store_timeout,
            purger,
        })
    }
}

impl Guard {
    pub fn builder(store: impl Store) -> GuardBuilder {
        GuardBuilder::from_arc(Arc::new(store))
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The store this guard decides over.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.pool.store()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.pool.clock()
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// What the background purge has done, if this guard runs one.
    pub fn purge_stats(&self) -> Option<PurgeStats> {
        self.purger.as_ref().map(|p| p.stats())
    }

    /// Claims `key` for a request with this `fingerprint`.
    pub async fn begin(&self, key: &str, fingerprint: &str) -> Result<Decision, GuardError> {
        self.begin_expiring(key, fingerprint)
            .await
            .map(|(decision, _)| decision)
    }

    /// [`Guard::begin`], and on a replay when the key's record expires: its
    /// `expires-at-ms`, milliseconds since the Unix epoch on the store's
    /// clock ([`Store::clock`]), as the store read it. Until then every
    /// repeat replays; after it the key is new again. `None` for the other
    /// decisions.
    pub async fn begin_expiring(
        &self,
        key: &str,
        fingerprint: &str,
    ) -> Result<(Decision, Option<u64>), GuardError> {
        self.pool.begin(key, fingerprint, &self.policy).await
    }

    /// `begin` with durations other than the guard's for this call.
    pub async fn begin_with(
        &self,
        key: &str,
        fingerprint: &str,
        policy: &Policy,
    ) -> Result<Decision, GuardError> {
        self.pool
            .begin(key, fingerprint, policy)
            .await
            .map(|(decision, _)| decision)
    }

    /// Stores `response` for `claim`. The response comes back either way;
    /// a success says when the stored record expires (its `expires-at-ms`,
    /// as in [`Guard::begin_expiring`]).
    pub async fn complete(
        &self,
        claim: Claim,
        response: Response,
    ) -> (Response, Result<u64, GuardError>) {
        self.pool.complete(claim, response, &self.policy).await
    }

    /// Gives `claim` up so that a retry runs at once.
    pub async fn release(&self, claim: Claim) -> Result<(), GuardError> {
        self.pool.release(claim).await
    }

    /// Extends `claim`'s lease; returns it with its new fence.
    pub async fn renew(&self, claim: Claim) -> Result<Claim, GuardError> {
        self.pool.renew(claim, &self.policy).await
    }

    /// Records a recovery point for `claim` (see [`Progress::checkpoint`],
    /// which [`Guard::run_resumable`]'s handlers use); returns the claim with
    /// its new fence and this checkpoint.
    pub async fn save_checkpoint(
        &self,
        claim: Claim,
        checkpoint: Checkpoint,
    ) -> Result<Claim, GuardError> {
        self.pool
            .save_checkpoint(claim, checkpoint, &self.policy)
            .await
    }

    /// The canonical fingerprint of a request, computed by the component
    /// ([`RequestParts::fingerprint`] computes the same natively).
    pub async fn fingerprint(&self, parts: &RequestParts) -> Result<String, GuardError> {
        self.pool.fingerprint(parts).await
    }

    /// Runs `handler` at most once per key and fingerprint within the
    /// retention window, and replays its response to every repeat.
    ///
    /// While the handler runs, its claim's lease is renewed every third of
    /// the lease (see [`GuardBuilder::renew_lease`]), so a slow handler is
    /// never taken over while its process is alive and reaches the store.
    ///
    /// ```
    /// use idem::{Guard, MemoryStore, Outcome, Response};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let guard = Guard::builder(MemoryStore::new()).build().unwrap();
    /// let pay = |_fence| async { Ok::<_, std::io::Error>(Response { status: 200, headers: vec![], body: b"paid".to_vec() }) };
    /// let first = guard.run("order-1", "sku=A&qty=1", pay).await.unwrap();
    /// assert!(matches!(first, Outcome::Executed(_)));
    /// let again = guard.run("order-1", "sku=A&qty=1", pay).await.unwrap();
    /// assert_eq!(again, Outcome::Replayed(Response { status: 200, headers: vec![], body: b"paid".to_vec() }));
    /// # }
    /// ```
    pub async fn run<F, Fut, E>(
        &self,
        key: &str,
        fingerprint: &str,
        handler: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        self.run_resumable(key, fingerprint, |progress| handler(progress.fence()))
            .await
    }

    /// [`Guard::run`] for an operation of several steps, each of which must
    /// take effect once: the handler gets a [`Progress`], which says where
    /// an earlier holder of the key got to ([`Progress::resumed`]: `None` on
    /// a first run) and records how far this one gets
    /// ([`Progress::checkpoint`]). A holder that crashes after a checkpoint
    /// is taken over after its lease, and the new holder continues from that
    /// checkpoint instead of from the first step.
    ///
    /// ```
    /// use idem::{Guard, MemoryStore, Outcome, Response};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let guard = Guard::builder(MemoryStore::new()).build().unwrap();
    /// let order = guard
    ///     .run_resumable("order-7", "sku=A", |progress| async move {
    ///         if progress.resumed().is_none() {
    ///             // Step 1 (reserve stock) ran; record it before step 2.
    ///             progress.checkpoint("reserved", b"r-1".to_vec()).await?;
    ///         }
    ///         // Step 2 (charge) ...
    ///         Ok::<_, idem::GuardError>(Response { status: 200, headers: vec![], body: b"done".to_vec() })
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert!(matches!(order, Outcome::Executed(_)));
    /// # }
    /// ```
    pub async fn run_resumable<F, Fut, E>(
        &self,
        key: &str,
        fingerprint: &str,
        handler: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Progress) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        let claim = match self.begin(key, fingerprint).await {
            Ok(Decision::Proceed(claim)) => claim,
            Ok(Decision::Replay(response)) => return Ok(Outcome::Replayed(response)),
            Ok(Decision::InFlight { retry_after_ms }) => {
                return Ok(Outcome::InFlight {
                    retry_after: Duration::from_millis(retry_after_ms),
                });
            }
            Ok(Decision::Conflict) => return Ok(Outcome::Conflict),
            Err(GuardError::InvalidInput(why)) => return Err(RunError::InvalidInput(why)),
            Err(e) => return Ok(Outcome::Unavailable(e.to_string())),
        };
        let on_error = self.on_handler_error;
        let settled = self
            .execute_resumable(claim, Duration::ZERO, |progress| async move {
                match handler(progress).await {
                    Ok(response) => Settle::Complete(response),
                    Err(e) if on_error == OnHandlerError::Release => Settle::Release(e),
                    Err(e) => Settle::Hold(e),
                }
            })
            .await;
        match settled {
            Settled::Completed { response, .. } => Ok(Outcome::Executed(response)),
            Settled::NotRecorded { response, error } => {
                Err(RunError::NotRecorded { response, error })
            }
            Settled::Released { error, .. } | Settled::Held(error) => Err(RunError::Handler(error)),
            Settled::NotStarted(e) => Ok(Outcome::Unavailable(e.to_string())),
        }
    }

    /// The one claim lifecycle, behind [`Guard::run`], the gateway and the
    /// tower layer: runs `handler` under `claim` and ends the claim as the
    /// handler's [`Settle`] says.
    ///
    /// Before the handler starts, the claim's lease must cover `budget` (the
    /// longest the handler may take) from now: a claim whose store round
    /// trip was slow may have spent most of its lease already, so it is
    /// renewed first. If it cannot be (the store fails, or the key was
    /// taken over meanwhile), the handler never runs: the claim is given up
    /// and [`Settled::NotStarted`] says why. While the handler runs, the
    /// lease is renewed every third of the lease (unless the guard was
    /// built without renewal); the completion or release presents the claim
    /// as last renewed. A handler with a `budget` (one that ends within it,
    /// as the gateway's upstream call does) whose lease already covers that
    /// budget and the completion's store call (the store timeout) needs no
    /// renewal, and arms no timer. `Duration::ZERO` means no bound.
    pub async fn execute<F, Fut, E>(&self, claim: Claim, budget: Duration, handler: F) -> Settled<E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Settle<E>>,
    {
        self.execute_resumable(claim, budget, |progress| handler(progress.fence()))
            .await
    }

    /// [`Guard::execute`] with a handler that takes a [`Progress`] (see
    /// [`Guard::run_resumable`]).
    pub async fn execute_resumable<F, Fut, E>(
        &self,
        claim: Claim,
        budget: Duration,
        handler: F,
    ) -> Settled<E>
    where
        F: FnOnce(Progress) -> Fut,
        Fut: Future<Output = Settle<E>>,
    {
        let claim = match self.secure(claim, budget).await {
            Ok(claim) => claim,
            Err(e) => return Settled::NotStarted(e),
        };
        let bounded = !budget.is_zero() && self.covers(&claim, budget + self.store_timeout);
        let progress = Progress::new(self.clone(), claim);
        let work = handler(progress.clone());
        let settle = if bounded {
            work.await
        } else {
            self.holding(&progress, work).await
        };
        let claim = progress.claim().await;
        match settle {
            Settle::Complete(response) => match self.complete(claim, response).await {
                (response, Ok(expires_at_ms)) => Settled::Completed {
                    response,
                    expires_at_ms,
                },
                (response, Err(error)) => Settled::NotRecorded { response, error },
            },
            Settle::Release(error) => Settled::Released {
                error,
                released: self.release(claim).await,
            },
            Settle::Hold(error) => Settled::Held(error),
        }
    }

    /// Whether `claim`'s lease runs past `span` from now.
    #[allow(clippy::cast_possible_truncation)] // a span of 2^64 ms is no span
    fn covers(&self, claim: &Claim, span: Duration) -> bool {
        let needed = self
            .clock()
            .now_ms()
            .saturating_add(span.as_millis() as u64);
        claim.lease_until_ms > needed
    }

    /// Makes `claim`'s lease run at least `budget` past now, renewing it if
    /// needed. On failure the claim is released (best effort: if the store
    /// is down, its lease runs out as usual) and the error returned.
    async fn secure(&self, claim: Claim, budget: Duration) -> Result<Claim, GuardError> {
        if self.covers(&claim, budget) {
            return Ok(claim);
        }
        let renewed = match self.renew(claim.clone()).await {
            Ok(renewed) if self.covers(&renewed, budget) => renewed,
            Ok(renewed) => {
                let _ = self.release(renewed).await;
                return Err(GuardError::Unavailable(format!(
                    "the store is too slow to hold key {:?}: its lease of {} ms, renewed, no longer covers the {} ms the request may take",
                    claim.key,
                    self.policy.lease_ms,
                    budget.as_millis()
                )));
            }
            Err(e) => {
                if matches!(e, GuardError::Unavailable(_)) {
                    let _ = self.release(claim).await;
                }
                return Err(e);
            }
        };
        Ok(renewed)
    }
}

impl GuardBuilder {
    /// A builder over a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        GuardBuilder {
            store,
            clock: None,
            runtime: None,
            policy: Policy::default(),
            on_handler_error: OnHandlerError::default(),
            renew_lease: true,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            purge_every: Some(DEFAULT_PURGE_EVERY),
        }
    }
}
