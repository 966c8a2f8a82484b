//! The HTTP semantics of the guard, shared by the reverse proxy and the
//! tower layer: read the key, scope it by client, fingerprint the request (natively,
//! with the component's code), then forward once, replay, or refuse.

mod paced;
mod parts;
mod run_to_completion;
mod waiter;

use paced::{Paced, TooSlow};
pub(crate) use parts::to_http;
use parts::{Read, Unread, body_timeout, expiry_date};
pub use parts::{client_key, scoped_key};
use run_to_completion::RunToCompletion;
use waiter::Waiter;

use super::BuildError;
use super::config::{Config, InFlight};
use super::events::{Observer, Verdict};
use super::parse::{HOP_BY_HOP, KeyError, fingerprinted_headers, idempotency_key};
pub use super::parse::{MAX_KEY_BYTES, strip_hop_by_hop};
use super::problem::Problem;
use super::traces::Traces;
use crate::clock::Clock;
use crate::guard::{Guard, Settle, Settled};
use crate::store::{self, FaultHandle, Store};
use axum::body::Body;
use axum::body::HttpBody as _;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::{BodyExt, Limited};
use idem_admin_api as api;
use idem_guest::model::{Claim, Decision, GuardError, Response as Stored};
use opentelemetry::context::FutureExt as _;
use opentelemetry_sdk::trace::SdkTracer;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};

/// The header that tells the upstream the claim's fence, so it can refuse a
/// stale holder's writes.
pub const FENCE_HEADER: &str = "idempotency-fence";

pub type HttpResponse = axum::http::Response<Body>;

/// The guard in HTTP terms. One per gateway or layer; shared by every request.
pub struct Gate {
    pub(crate) guard: Guard,
    pub(crate) config: Config,
    pub(crate) observer: Arc<Observer>,
    /// The faults of the guard's store: see [`Gate::over`].
    faults: FaultHandle,
    /// Slots for guarded requests (`max_concurrent`) and, apart, for those
    /// forwarded unguarded (`max_concurrent_unguarded`).
    guarded: Slots,
    unguarded: Slots,
    /// Repeats waiting for a key's first request in this process, woken when
    /// it completes or is released. An entry lives only while a request
    /// waits on it (see [`Waiter`]).
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// `config.replay_header` and `config.expiry_header`, parsed once.
    replay_header: HeaderName,
    expiry_header: Option<HeaderName>,
}

/// A forwarded request that ended without a response to store: what the
/// client is told instead.
enum Unstored {
    /// The upstream's own answer (a 5xx not stored by policy).
    Response(Stored),
    /// The gateway's answer (the upstream failed or timed out).
    Problem(Problem),
}

impl Gate {
    /// The gate the proxy and the layer both use: the guard over `backend`
    /// in the [`store::Stack`] (faults the admin API sets, operations timed
    /// into the observer's latencies), seeing time by `clock` (`None`: the
    /// store's time authority).
    pub(crate) fn over(
        config: Config,
        backend: Arc<dyn Store>,
        clock: Option<Arc<dyn Clock>>,
        tracer: Option<SdkTracer>,
    ) -> Result<Gate, BuildError> {
        config.validate()?;
        let observer = Arc::new(Observer::new(
            config.history_events,
            tracer.map(|t| Arc::new(Traces::new(t, backend.name()))),
        ));
        let listener: Arc<dyn store::CallListener> = observer.clone();
        let store = store::stack(backend, observer.latencies().clone(), Some(listener));
        let faults = store.faults().clone();
        let mut guard = config.guard_builder(store);
        if let Some(clock) = clock {
            guard = guard.clock(clock);
        }
        let guard = guard.build()?;
        let replay_header = HeaderName::try_from(config.replay_header.as_str())
            .unwrap_or(HeaderName::from_static("idempotent-replayed"));
        let expiry_header = HeaderName::try_from(config.expiry_header.as_str()).ok();
        Ok(Gate {
            replay_header,
            expiry_header,
            guarded: Slots::new(config.max_concurrent),
            unguarded: Slots::new(config.max_concurrent_unguarded),
            guard,
            config,
            observer,
            faults,
            waiters: Mutex::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The faults of the store the gate uses.
    pub fn faults(&self) -> &FaultHandle {
        &self.faults
    }

    /// The slots of each class: in use, limit, and requests refused for want of one.
    pub fn slots(&self) -> api::Slots {
        api::Slots {
            guarded: self.guarded.usage(),
            unguarded: self.unguarded.usage(),
        }
    }

    /// Keys with a repeat waiting on them in this process (for tests: none
    /// may outlive its request).
    pub fn waiting_keys(&self) -> usize {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Handles one request: `exec` forwards it (to the upstream, or to the
    /// inner service) and is called at most once. With traces on, a guarded
    /// request runs inside its span (see [`Traces`]).
    ///
    /// A guarded request goes through two halves: [`parts::read`] reads and
    /// checks it (its key, scope and body: what makes its fingerprint), and
    /// [`Gate::decide`] takes what was read and gets the guard's decision on
    /// it — run it once (forwarded here, under the claim), replay, refuse, or
    /// wait for the request in flight with its key.
    pub async fn handle<F, Fut>(self: &Arc<Self>, req: Request<Body>, exec: F) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<HttpResponse, Problem>> + Send + 'static,
    {
        if !self.config.guards(req.method().as_str()) {
            return self.pass_through(req, exec).await;
        }
        let Some(traces) = self.observer.traces() else {
            return self.guarded(req, exec).await;
        };
        let cx = traces.request(&req);
        let response = self.guarded(req, exec).with_context(cx.clone()).await;
        Traces::responded(&cx, response.status().as_u16());
        response
    }

    async fn guarded<F, Fut>(self: &Arc<Self>, req: Request<Body>, exec: F) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<HttpResponse, Problem>> + Send + 'static,
    {
        let started = Instant::now();
        let read = match parts::read(req, &self.config).await {
            Ok(read) => read,
            Err(Unread::Unkeyed(req)) => return self.pass_through(req, exec).await,
            Err(Unread::Refused { scoped, problem }) => {
                return self.refuse(&scoped, Verdict::Invalid, problem, started);
            }
        };
        // The slot is held until the run is over.
        let (claim, _slot) = match self.decide(&read, started).await {
            Decided::Run { claim, slot } => (claim, slot),
            Decided::Answered(response) => return response,
        };
        // The claimed request runs to completion even if the client
        // disconnects, so that its key is never left held until the lease
        // ends: right here, on this task; only when this future is dropped
        // half-way does the rest move to a task of its own. Written here,
        // not in a function of its own or inside `decide`: the upstream
        // call's future is large, and each level it is returned through
        // copies it once more.
        let gate = Arc::clone(self);
        RunToCompletion::new(async move {
            let (scoped, request) = read.into_request();
            gate.execute(scoped, claim, request, exec, started).await
        })
        .await
        .unwrap_or_else(|_panic| {
            Problem::Internal(
                "the request's handler panicked; its key is held until the lease runs out".into(),
            )
            .into_response(self.config.profile)
        })
    }

    /// The wait half of a guarded request, once read: within a slot, the
    /// guard's decision on its key and fingerprint — the request to run
    /// once under its claim (in the slot, which the caller holds while it
    /// runs), or the answer: its stored response replayed, or a refusal,
    /// after waiting (under `InFlight::Wait`) for a request in flight with
    /// its key to complete.
    async fn decide(&self, read: &Read, started: Instant) -> Decided<'_> {
        let Some(slot) = self.guarded.take() else {
            let problem = Problem::Overloaded {
                limit: self.config.max_concurrent,
                guarded: true,
            };
            let refused = self.refuse(&read.scoped, Verdict::Unavailable, problem, started);
            return Decided::Answered(refused);
        };
        // Computed natively (the component's own code, compiled for the
        // host): the body never crosses into the component.
        let fingerprint = read.fingerprint(&self.config);
        let deadline = match self.config.in_flight {
            InFlight::Reject => None,
            InFlight::Wait(bound) => Some(started + bound),
        };
        loop {
            // Registered before `begin`, so a completion between the two still wakes us.
            let waiter = deadline.map(|_| Waiter::new(self, &read.scoped));
            let mut notified = waiter.as_ref().map(|w| Box::pin(w.notify().notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            let (decision, expires_at_ms) = match self
                .guard
                .begin_expiring(&read.scoped, &fingerprint)
                .await
            {
                Ok(begun) => begun,
                Err(e) => {
                    return Decided::Answered(self.refuse_guard_error(&read.scoped, e, started));
                }
            };
            match decision {
                // The waiter goes with this function: no wait is registered
                // while the request runs.
                Decision::Proceed(claim) => return Decided::Run { claim, slot },
                Decision::Replay(stored) => {
                    let replayed = self.replay(&read.scoped, &stored, expires_at_ms, started);
                    return Decided::Answered(replayed);
                }
                Decision::Conflict => {
                    let problem = Problem::KeyMismatch;
                    let refused = self.refuse(&read.scoped, Verdict::Conflict, problem, started);
                    return Decided::Answered(refused);
                }
                Decision::InFlight { retry_after_ms } => {
                    let retry_after = self.retry_after(Duration::from_millis(retry_after_ms));
                    let now = Instant::now();
                    match (deadline, notified) {
                        (Some(deadline), Some(notified)) if now < deadline => {
                            // Woken by a completion in this process; a holder
                            // in another process is polled for.
                            let nap = retry_after
                                .min(deadline - now)
                                .min(Duration::from_millis(250));
                            let _ = tokio::time::timeout(nap, notified).await;
                        }
                        _ => {
                            return Decided::Answered(self.refuse(
                                &read.scoped,
                                Verdict::InFlight,
                                Problem::InFlight { retry_after },
                                started,
                            ));
                        }
                    }
                }
            }
        }
    }

    /// A stored response replayed: marked as a replay, with its expiry.
    fn replay(
        &self,
        scoped: &str,
        stored: &Stored,
        expires_at_ms: Option<u64>,
        started: Instant,
    ) -> HttpResponse {
        let mut response = to_http(stored);
        response
            .headers_mut()
            .insert(self.replay_header.clone(), HeaderValue::from_static("true"));
        self.tell_expiry(&mut response, expires_at_ms);
        self.observer.decided(
            scoped,
            Verdict::Replayed,
            Some(stored.status),
            started.elapsed(),
            None,
            None,
        );
        response
    }

    /// Forwards a request the key does not guard, within a slot of its own
    /// class, its body streamed under the same slow-client bounds as a
    /// guarded one's (408 once it falls behind), and the upstream given
    /// `upstream_timeout` from when it has the whole body.
    async fn pass_through<F, Fut>(&self, req: Request<Body>, exec: F) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Result<HttpResponse, Problem>>,
    {
        let config = &self.config;
        let Some(_slot) = self.unguarded.take() else {
            return Problem::Overloaded {
                limit: config.max_concurrent_unguarded,
                guarded: false,
            }
            .into_response(config.profile);
        };
        let (parts, body) = req.into_parts();
        // A request without a body (most GETs) needs no pacing.
        let (body, progress) = if body.is_end_stream() {
            (body, None)
        } else {
            let (paced, progress) =
                Paced::watched(body, config.body_read_timeout, config.min_body_rate);
            (Body::new(paced), Some(progress))
        };
        let exec = exec(Request::from_parts(parts, body));
        let forwarded = async {
            let mut exec = std::pin::pin!(exec);
            // While the client still sends, the body's deadlines bound the
            // exchange; the upstream's time starts once it has the whole
            // body (as for a guarded request), or at the latest when the
            // body's time is up (an upstream that stopped reading it).
            if let Some(progress) = &progress {
                let sent = tokio::time::timeout(config.body_read_timeout, progress.over());
                tokio::select! {
                    answered = &mut exec => return Ok(answered),
                    _ = sent => {}
                }
            }
            tokio::time::timeout(config.upstream_timeout, exec).await
        }
        .await;
        // Whatever the upstream made of a body cut short, the client is told
        // that its body was too slow.
        if progress.is_some_and(|p| p.was_cut()) {
            return body_timeout(config).into_response(config.profile);
        }
        match forwarded {
            Ok(Ok(response)) => response,
            Ok(Err(problem)) => problem.into_response(config.profile),
            Err(_) => {
                Problem::UpstreamTimeout(config.upstream_timeout).into_response(config.profile)
            }
        }
    }

    /// Tells the client until when its key replays this stored response
    /// (`Config::expiry_header`). Nothing when the expiry is unknown.
    fn tell_expiry(&self, response: &mut HttpResponse, expires_at_ms: Option<u64>) {
        let value = expires_at_ms.and_then(expiry_date);
        if let (Some(value), Some(name)) = (value, &self.expiry_header) {
            response.headers_mut().insert(name.clone(), value);
        }
    }

    /// How long a repeat should wait, given the holder's remaining lease: a
    /// holder finishes within the upstream timeout plus a completion after
    /// its claim, so at most that much of a full lease is ever needed.
    fn retry_after(&self, lease_left: Duration) -> Duration {
        let config = &self.config;
        let slack = config
            .lease
            .saturating_sub(config.upstream_timeout + config.store_timeout);
        lease_left
            .saturating_sub(slack)
            .max(Duration::from_millis(1))
    }

    /// Runs the request under its claim — the guard's one claim lifecycle,
    /// with its lease secured for the upstream timeout first and renewed
    /// while the upstream works — and answers what the policy says.
    async fn execute<F, Fut>(
        self: Arc<Self>,
        scoped: String,
        claim: Claim,
        mut req: Request<Body>,
        exec: F,
        started: Instant,
    ) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Result<HttpResponse, Problem>>,
    {
        let fence = claim.fence;
        // A claim this gateway runs until its upstream call is over (the
        // admin API says so; a write to it meanwhile is a renewal).
        let running = self.observer.running(&scoped, claim.holder);
        let settled = self
            .guard
            .execute(claim, self.config.upstream_timeout, |fence| {
                req.headers_mut().insert(
                    HeaderName::from_static(FENCE_HEADER),
                    HeaderValue::from(fence.0),
                );
                let traces = self.observer.traces();
                let upstream = traces.map(|t| {
                    let method = req.method().as_str().to_owned();
                    t.upstream(&method, fence.0, req.headers_mut())
                });
                let forwarded = self.forward(req, exec);
                async move {
                    let settle = forwarded.await;
                    drop(running);
                    if let Some(cx) = upstream {
                        Traces::upstream_done(&cx, settle_status(&settle));
                    }
                    settle
                }
            })
            .await;
        self.wake(&scoped);
        let profile = self.config.profile;
        let (response, detail) = match settled {
            Settled::Completed {
                response: stored,
                expires_at_ms,
            } => {
                let mut response = to_http(&stored);
                self.tell_expiry(&mut response, Some(expires_at_ms));
                (response, None)
            }
            Settled::Held(Unstored::Response(stored)) => (to_http(&stored), None),
            Settled::NotRecorded { response, error } => {
                let problem = Problem::NotRecorded {
                    why: error.to_string(),
                    retry_after: self.config.lease,
                };
                let detail = format!(
                    "upstream answered {}; {}",
                    response.status,
                    problem.detail()
                );
                (problem.into_response(profile), Some(detail))
            }
            Settled::Released { error, released } => {
                let (response, what) = match error {
                    Unstored::Response(stored) => {
                        (to_http(&stored), format!("{} not stored", stored.status))
                    }
                    Unstored::Problem(problem) => {
                        (problem.clone().into_response(profile), problem.detail())
                    }
                };
                let detail = match released {
                    Ok(()) => format!("{what}; key released for a retry"),
                    Err(e) => format!(
                        "{what}; the key could not be released ({e}) and is held until its lease runs out"
                    ),
                };
                (response, Some(detail))
            }
            Settled::Held(Unstored::Problem(problem)) => {
                let detail = problem.detail();
                (problem.into_response(profile), Some(detail))
            }
            Settled::NotStarted(e) => {
                let problem = Problem::StoreUnavailable(format!(
                    "the key's claim could not be kept for the request: {e}"
                ));
                return self.refuse_claimed(&scoped, problem, started, Some(fence));
            }
        };
        self.observer.decided(
            &scoped,
            Verdict::Executed,
            Some(response.status().as_u16()),
            started.elapsed(),
            detail,
            Some(fence),
        );
        response
    }

    /// Forwards the request once and says what its claim becomes: a
    /// response to store, or a failure that releases the key.
    async fn forward<F, Fut>(&self, req: Request<Body>, exec: F) -> Settle<Unstored>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Result<HttpResponse, Problem>>,
    {
        let limit = self.config.max_response_bytes;
        let timeout = self.config.upstream_timeout;
        let outcome = tokio::time::timeout(timeout, async {
            let response = exec(req).await?;
            let (parts, body) = response.into_parts();
            match Limited::new(body, limit).collect().await {
                Ok(c) => Ok((parts, c.to_bytes())),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    Err(Problem::ResponseTooLarge { limit })
                }
                Err(e) => Err(Problem::UpstreamFailed(format!(
                    "reading the response body: {e}"
                ))),
            }
        })
        .await
        .unwrap_or(Err(Problem::UpstreamTimeout(timeout)));
        let policy = self.config.store_policy;
        match outcome {
            Ok((parts, body)) => {
                let stored = Stored {
                    status: parts.status.as_u16(),
                    headers: parts
                        .headers
                        .iter()
                        .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
                        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                        .collect(),
                    body: body.to_vec(),
                };
                if stored.size_bytes() > limit {
                    // The body fit, but with its headers the response does not.
                    Settle::Complete(self.problem_to_store(&Problem::ResponseTooLarge { limit }))
                } else if stored.status >= 500 && !policy.server_errors {
                    Settle::Release(Unstored::Response(stored))
                } else {
                    Settle::Complete(stored)
                }
            }
            // The upstream ran: its key is done, with this answer in place
            // of the response, so that it never runs again.
            Err(problem @ Problem::ResponseTooLarge { .. }) => {
                Settle::Complete(self.problem_to_store(&problem))
            }
            Err(problem @ Problem::UpstreamTimeout(_)) if policy.timeouts => {
                Settle::Complete(self.problem_to_store(&problem))
            }
            Err(problem) => Settle::Release(Unstored::Problem(problem)),
        }
    }

    /// A gateway answer as a response to store and replay.
    fn problem_to_store(&self, problem: &Problem) -> Stored {
        let rendered = problem.render(self.config.profile);
        let mut headers = vec![(
            "content-type".to_owned(),
            rendered.content_type.as_bytes().to_vec(),
        )];
        if let Some(secs) = rendered.retry_after_secs {
            headers.push(("retry-after".to_owned(), secs.to_string().into_bytes()));
        }
        Stored {
            status: rendered.status.as_u16(),
            headers,
            body: rendered.body.into_bytes(),
        }
    }

    fn wake(&self, scoped: &str) {
        if matches!(self.config.in_flight, InFlight::Reject) {
            return;
        }
        let waiting = self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(scoped);
        if let Some(notify) = waiting {
            notify.notify_waiters();
        }
    }

    #[allow(clippy::needless_pass_by_value)] // callers build the problem in place
    fn refuse(
        &self,
        scoped: &str,
        verdict: Verdict,
        problem: Problem,
        started: Instant,
    ) -> HttpResponse {
        self.refuse_with(scoped, verdict, problem, started, None)
    }

    /// A 503 for a request that had claimed the key under `fence`.
    fn refuse_claimed(
        &self,
        scoped: &str,
        problem: Problem,
        started: Instant,
        fence: Option<u64>,
    ) -> HttpResponse {
        self.refuse_with(scoped, Verdict::Unavailable, problem, started, fence)
    }

    #[allow(clippy::needless_pass_by_value)]
    fn refuse_with(
        &self,
        scoped: &str,
        verdict: Verdict,
        problem: Problem,
        started: Instant,
        fence: Option<u64>,
    ) -> HttpResponse {
        let response = problem.clone().into_response(self.config.profile);
        let detail = match &problem {
            Problem::KeyMismatch => None,
            p => Some(p.detail()),
        };
        self.observer.decided(
            scoped,
            verdict,
            Some(response.status().as_u16()),
            started.elapsed(),
            detail,
            fence,
        );
        response
    }

    fn refuse_guard_error(
        &self,
        scoped: &str,
        error: GuardError,
        started: Instant,
    ) -> HttpResponse {
        match error {
            GuardError::InvalidInput(why) => self.refuse(
                scoped,
                Verdict::Invalid,
                Problem::KeyMalformed(why),
                started,
            ),
            GuardError::Unavailable(why) | GuardError::StaleClaim(why) => self.refuse(
                scoped,
                Verdict::Unavailable,
                Problem::StoreUnavailable(why),
                started,
            ),
        }
    }
}

/// What [`Gate::decide`] made of a request: run it under its claim, in the
/// slot taken for it, or the answer already made.
enum Decided<'a> {
    Run {
        claim: Claim,
        slot: tokio::sync::SemaphorePermit<'a>,
    },
    Answered(HttpResponse),
}

/// The slots of one class of requests: taken for the time a request is
/// handled, refused (503) when none is free.
struct Slots {
    free: Semaphore,
    limit: usize,
    refused: AtomicU64,
}

impl Slots {
    fn new(limit: usize) -> Slots {
        Slots {
            free: Semaphore::new(limit),
            limit,
            refused: AtomicU64::new(0),
        }
    }

    fn take(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let slot = self.free.try_acquire().ok();
        if slot.is_none() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        slot
    }

    fn usage(&self) -> api::SlotUse {
        api::SlotUse {
            in_use: self.limit.saturating_sub(self.free.available_permits()) as u64,
            limit: self.limit as u64,
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// What the upstream answered, as its span records it.
fn settle_status(settle: &Settle<Unstored>) -> Result<u16, String> {
    match settle {
        Settle::Complete(stored)
        | Settle::Release(Unstored::Response(stored))
        | Settle::Hold(Unstored::Response(stored)) => Ok(stored.status),
        Settle::Release(Unstored::Problem(problem)) | Settle::Hold(Unstored::Problem(problem)) => {
            Err(problem.detail())
        }
    }
}
