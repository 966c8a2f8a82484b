//! The HTTP semantics of the guard, shared by the reverse proxy and the
//! tower layer: read the key, scope it by client, fingerprint the request in
//! the component, then forward once, replay, or refuse.

use super::config::{Config, InFlight};
use super::events::{Observer, Verdict};
use super::parse::{HOP_BY_HOP, fingerprinted_headers, idempotency_key};
pub use super::parse::{MAX_KEY_BYTES, strip_hop_by_hop};
use super::problem::Problem;
use crate::guard::{Guard, RequestParts};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::{BodyExt, Limited};
use idem_guest::model::{Claim, Decision, GuardError, Response as Stored};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
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
    permits: Semaphore,
    /// Repeats waiting for a key's first request in this process, woken when
    /// it completes or is released.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Gate {
    pub fn new(guard: Guard, config: Config, observer: Arc<Observer>) -> Gate {
        Gate {
            permits: Semaphore::new(config.max_concurrent),
            guard,
            config,
            observer,
            waiters: Mutex::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles one request: `exec` forwards it (to the upstream, or to the
    /// inner service) and is called at most once.
    #[allow(clippy::too_many_lines)] // one request's path through the guard, read top to bottom
    pub async fn handle<F, Fut>(self: &Arc<Self>, req: Request<Body>, exec: F) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<HttpResponse, Problem>> + Send + 'static,
    {
        let profile = self.config.profile;
        let Ok(_permit) = self.permits.try_acquire() else {
            return Problem::Overloaded {
                limit: self.config.max_concurrent,
            }
            .into_response(profile);
        };
        if !self.config.guards(req.method().as_str()) {
            return self.pass_through(req, exec).await;
        }
        let started = Instant::now();
        let key = match client_key(req.headers(), &self.config) {
            Ok(Some(key)) => key,
            Ok(None) if !self.config.require_key => return self.pass_through(req, exec).await,
            Ok(None) => {
                let problem = Problem::KeyMissing {
                    header: self.config.key_header.clone(),
                };
                return self.refuse("", Verdict::Invalid, problem, started);
            }
            Err(why) => {
                return self.refuse("", Verdict::Invalid, Problem::KeyMalformed(why), started);
            }
        };
        let scoped = scoped_key(req.headers(), &self.config, &key);
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, self.config.max_request_bytes)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return self.refuse(
                    &scoped,
                    Verdict::Invalid,
                    Problem::BodyTooLarge {
                        limit: self.config.max_request_bytes,
                    },
                    started,
                );
            }
            Err(e) => {
                let problem =
                    Problem::BadRequest(format!("the request body could not be read: {e}"));
                return self.refuse(&scoped, Verdict::Invalid, problem, started);
            }
        };
        let fingerprint = match self
            .guard
            .fingerprint(&request_parts(&parts, &body, &self.config))
            .await
        {
            Ok(fp) => fp,
            Err(e) => return self.refuse_guard_error(&scoped, e, started),
        };

        let deadline = match self.config.in_flight {
            InFlight::Reject => None,
            InFlight::Wait(bound) => Some(started + bound),
        };
        loop {
            // Registered before `begin`, so a completion between the two still wakes us.
            let waiter = deadline.map(|_| self.waiter(&scoped));
            let mut notified = waiter.as_ref().map(|n| Box::pin(n.notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            let decision = match self.guard.begin(&scoped, &fingerprint).await {
                Ok(decision) => decision,
                Err(e) => return self.refuse_guard_error(&scoped, e, started),
            };
            match decision {
                Decision::Proceed(claim) => {
                    drop(notified);
                    // The claimed request runs to completion even if the client
                    // disconnects, so that its key is never left held until the
                    // lease ends. It runs right here, on this task; only when this
                    // future is dropped half-way does the rest move to a task of its own.
                    let gate = Arc::clone(self);
                    let request = Request::from_parts(parts, Body::from(body));
                    return RunToCompletion::new(async move {
                        gate.execute(scoped, claim, request, exec, started).await
                    })
                    .await
                    .unwrap_or_else(|_panic| {
                        Problem::Internal(
                            "the request's handler panicked; its key is held until the lease runs out"
                                .into(),
                        )
                        .into_response(self.config.profile)
                    });
                }
                Decision::Replay(stored) => {
                    let mut response = to_http(&stored);
                    response.headers_mut().insert(
                        HeaderName::try_from(self.config.replay_header.as_str())
                            .unwrap_or(HeaderName::from_static("idempotent-replayed")),
                        HeaderValue::from_static("true"),
                    );
                    self.observer.decided(
                        &scoped,
                        Verdict::Replayed,
                        Some(stored.status),
                        started.elapsed(),
                        None,
                    );
                    return response;
                }
                Decision::Conflict => {
                    return self.refuse(&scoped, Verdict::Conflict, Problem::KeyMismatch, started);
                }
                Decision::InFlight { retry_after_ms } => {
                    let retry_after = Duration::from_millis(retry_after_ms);
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
                            return self.refuse(
                                &scoped,
                                Verdict::InFlight,
                                Problem::InFlight { retry_after },
                                started,
                            );
                        }
                    }
                }
            }
        }
    }

    async fn pass_through<F, Fut>(&self, req: Request<Body>, exec: F) -> HttpResponse
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Result<HttpResponse, Problem>>,
    {
        match tokio::time::timeout(self.config.upstream_timeout, exec(req)).await {
            Ok(Ok(response)) => response,
            Ok(Err(problem)) => problem.into_response(self.config.profile),
            Err(_) => Problem::UpstreamTimeout(self.config.upstream_timeout)
                .into_response(self.config.profile),
        }
    }

    /// Runs the request under its claim and stores what the policy says to.
    #[allow(clippy::too_many_lines)]
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
        req.headers_mut().insert(
            HeaderName::from_static(FENCE_HEADER),
            HeaderValue::from(claim.fence),
        );
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

        let profile = self.config.profile;
        let mut timed_out = false;
        let stored = match outcome {
            Ok((parts, body)) => Stored {
                status: parts.status.as_u16(),
                headers: parts
                    .headers
                    .iter()
                    .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
                    .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                    .collect(),
                body: body.to_vec(),
            },
            Err(Problem::UpstreamTimeout(after)) if self.config.store_policy.timeouts => {
                timed_out = true;
                let problem = Problem::UpstreamTimeout(after).into_response(profile);
                let (parts, body) = problem.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(http_body_util::Collected::to_bytes)
                    .unwrap_or_default();
                Stored {
                    status: parts.status.as_u16(),
                    headers: parts
                        .headers
                        .iter()
                        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                        .collect(),
                    body: body.to_vec(),
                }
            }
            Err(problem @ Problem::ResponseTooLarge { .. }) => {
                // The upstream ran: releasing would run it again. The key
                // stays held until its lease runs out, as after a crash.
                self.wake(&scoped);
                self.observer.decided(
                    &scoped,
                    Verdict::Executed,
                    Some(502),
                    started.elapsed(),
                    Some(problem.detail()),
                );
                return problem.into_response(profile);
            }
            Err(problem) => {
                let released = self.guard.release(claim).await;
                self.wake(&scoped);
                let detail = match released {
                    Ok(()) => format!("{}; key released for a retry", problem.detail()),
                    Err(e) => format!(
                        "{}; the key could not be released ({e}) and is held until its lease runs out",
                        problem.detail()
                    ),
                };
                self.observer.decided(
                    &scoped,
                    Verdict::Executed,
                    Some(problem.status().as_u16()),
                    started.elapsed(),
                    Some(detail),
                );
                return problem.into_response(profile);
            }
        };

        if stored.status >= 500 && !self.config.store_policy.server_errors && !timed_out {
            let released = self.guard.release(claim).await;
            self.wake(&scoped);
            let detail = match released {
                Ok(()) => format!("{} not stored; key released for a retry", stored.status),
                Err(e) => format!("{} not stored; release failed ({e})", stored.status),
            };
            self.observer.decided(
                &scoped,
                Verdict::Executed,
                Some(stored.status),
                started.elapsed(),
                Some(detail),
            );
            return to_http(&stored);
        }
        let (stored, recorded) = self.guard.complete(claim, stored).await;
        self.wake(&scoped);
        let detail = recorded.err().map(|e| {
            format!("the response was not recorded: {e}; a retry after the lease runs again")
        });
        self.observer.decided(
            &scoped,
            Verdict::Executed,
            Some(stored.status),
            started.elapsed(),
            detail,
        );
        to_http(&stored)
    }

    fn waiter(&self, scoped: &str) -> Arc<Notify> {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        waiters.entry(scoped.to_owned()).or_default().clone()
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

/// The key a client sent, if any: a structured-field string (`"…"`, as the
/// draft specifies) or, as many clients send it, a bare token.
pub fn client_key(headers: &HeaderMap, config: &Config) -> Result<Option<String>, String> {
    let mut values = headers.get_all(config.key_header.as_str()).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!(
            "more than one {} header; send exactly one",
            config.key_header
        ));
    }
    idempotency_key(value.as_bytes()).map(Some)
}

/// The store key: the client's scope (a hash of its client header, `anon`
/// without one), `/`, the key. See [`super::parse::scoped_key`].
pub fn scoped_key(headers: &HeaderMap, config: &Config, key: &str) -> String {
    let client = config
        .client_header
        .as_deref()
        .and_then(|h| headers.get(h))
        .map(HeaderValue::as_bytes);
    super::parse::scoped_key(client, key)
}

fn request_parts(
    parts: &axum::http::request::Parts,
    body: &Bytes,
    config: &Config,
) -> RequestParts {
    RequestParts {
        method: parts.method.as_str().to_owned(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: fingerprinted_headers(&parts.headers, &config.fingerprint_headers),
        body: body.to_vec(),
    }
}

/// The stored response as HTTP, headers in their stored order.
fn to_http(stored: &Stored) -> HttpResponse {
    let mut response = HttpResponse::new(Body::from(stored.body.clone()));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    response
}

/// A future that finishes even when dropped: polled in place while its
/// owner polls it, and spawned onto the runtime with whatever is left if its
/// owner drops it before it is done (a client disconnected). Unlike spawning
/// it up front, the common case pays no hand-off to another worker thread.
/// A panic inside it is caught and returned as `Err`, as a task's would be,
/// so that it ends one request and not the whole connection.
struct RunToCompletion<T: Send + 'static> {
    inner: Option<Pin<Box<dyn Future<Output = std::thread::Result<T>> + Send>>>,
}

impl<T: Send + 'static> RunToCompletion<T> {
    fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        RunToCompletion {
            inner: Some(Box::pin(AssertUnwindSafe(future).catch_unwind())),
        }
    }
}

impl<T: Send + 'static> Future for RunToCompletion<T> {
    type Output = std::thread::Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self
            .inner
            .as_mut()
            .expect("RunToCompletion polled after it completed");
        let output = std::task::ready!(inner.as_mut().poll(cx));
        self.inner = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for RunToCompletion<T> {
    fn drop(&mut self) {
        if let Some(rest) = self.inner.take() {
            // The box keeps the half-run future where it is; only the box moves.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = rest.await;
                });
            }
        }
    }
}
