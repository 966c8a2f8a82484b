//! A fake admin API v1 server: the contract's own types (`idem-admin-api`,
//! which the real gateway serializes too), backed by an in-memory table the
//! test owns. It filters, sorts and pages like the real
//! one should, records every mutating request, and streams SSE events.

// A handler's early return is a whole response; the fake's counts are small.
#![allow(clippy::result_large_err, clippy::cast_precision_loss)]

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use idem_admin_api::{
    DecisionEvent, Event, FaultEvent, FaultSet, Faults, KEEP_ALIVE, KeyDetail, KeyInfo,
    KeyListParams, KeyPage, KeyState, Order, Problem, SetFaults, Sort, Stats, StoredResponse,
    Verdict,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, oneshot};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[derive(Clone)]
pub struct Stored {
    pub state: KeyState,
    pub fence: u64,
    pub lease_until_ms: u64,
    pub expires_at_ms: u64,
    pub fingerprint: String,
    pub response: Option<StoredResponse>,
    pub replays: u64,
}

#[derive(Default)]
pub struct Inner {
    pub keys: BTreeMap<String, Stored>,
    pub faults: FaultSet,
    pub injected: u64,
    /// `"PUT /v1/faults {body}"`, `"POST /v1/keys/a/release"`, …
    pub requests: Vec<String>,
    pub keys_queries: Vec<String>,
}

pub struct Shared {
    pub inner: Mutex<Inner>,
    events: broadcast::Sender<Event>,
    token: Option<String>,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn decision(&self, key: &str, outcome: Verdict) {
        let event = DecisionEvent {
            ts_ms: now_ms(),
            key: key.into(),
            outcome,
            status: Some(200),
            latency_us: 420,
            detail: None,
            fence: None,
        };
        let _ = self.events.send(Event::Decision(event));
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }
}

pub struct Fake {
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Fake {
    pub async fn start() -> Fake {
        Fake::start_on("127.0.0.1:0", None).await
    }

    pub async fn start_on(addr: &str, token: Option<&str>) -> Fake {
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            inner: Mutex::default(),
            events,
            token: token.map(Into::into),
        });
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/v1/keys", get(list))
            .route("/v1/keys/{key}", get(one).delete(remove))
            .route("/v1/keys/{key}/{action}", post(act))
            .route("/v1/faults", get(faults).put(set_faults))
            .route("/v1/stats", get(stats))
            .route("/v1/events", get(event_stream))
            .route_layer(from_fn_with_state(shared.clone(), authorize))
            .with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Fake {
            url: format!("http://{addr}"),
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A fake holding the keys of each `(prefix, n, state)`, as [`Fake::seed`] adds them.
    pub async fn with_keys(seeds: &[(&str, usize, KeyState)]) -> Fake {
        let fake = Fake::start().await;
        for &(prefix, n, state) in seeds {
            fake.seed(prefix, n, state);
        }
        fake
    }

    /// Adds keys `prefix-00000`…: processing ones with a lease of 30 s, done
    /// ones with a stored JSON response.
    pub fn seed(&self, prefix: &str, n: usize, state: KeyState) {
        let now = now_ms();
        let mut inner = self.shared.lock();
        for i in 0..n {
            let done = state == KeyState::Done;
            inner.keys.insert(
                format!("{prefix}-{i:05}"),
                Stored {
                    state,
                    fence: i as u64 + 1,
                    lease_until_ms: if done { 0 } else { now + 30_000 },
                    expires_at_ms: now + 3_600_000,
                    fingerprint: format!(
                        "{:016x}",
                        (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ),
                    response: done.then(|| StoredResponse {
                        status: 201,
                        headers: vec![("content-type".into(), "application/json".into())],
                        body_bytes: 15,
                        body_preview: format!("{{\"order\":{i}}}"),
                        body_base64: String::new(),
                    }),
                    replays: (i % 7) as u64,
                },
            );
        }
    }

    /// Stops listening and closes every connection (SSE included).
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        // SSE streams never end by themselves: abort the server once it has
        // stopped accepting.
        let task = self.task.take().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        task.abort();
        let _ = task.await;
    }
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let body = Problem::new(
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        detail,
    );
    (
        status,
        [("content-type", "application/problem+json")],
        serde_json::to_string(&body).unwrap(),
    )
        .into_response()
}

fn no_key(key: &str) -> Response {
    problem(StatusCode::NOT_FOUND, format!("no key {key:?}"))
}

/// Every route wants the bearer token, when the fake has one.
async fn authorize(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    match &shared.token {
        Some(token) if given != Some(format!("Bearer {token}").as_str()) => {
            problem(StatusCode::UNAUTHORIZED, "a bearer token is required")
        }
        _ => next.run(request).await,
    }
}

fn info(key: &str, s: &Stored, now: u64) -> KeyInfo {
    KeyInfo {
        key: key.into(),
        state: s.state,
        fence: s.fence,
        version: s.fence,
        lease_until_ms: s.lease_until_ms,
        lease_remaining_ms: s.lease_until_ms.saturating_sub(now),
        expires_at_ms: s.expires_at_ms,
        expires_in_ms: s.expires_at_ms.saturating_sub(now),
        fingerprint: s.fingerprint.clone(),
        status: s.response.as_ref().map(|r| r.status),
        replays: s.replays,
        holder: String::new(),
        held_here: false,
    }
}

async fn list(State(shared): State<Arc<Shared>>, Query(p): Query<KeyListParams>) -> Response {
    let now = now_ms();
    let mut inner = shared.lock();
    inner.keys_queries.push(format!(
        "state={:?} prefix={:?} search={:?} sort={:?} order={:?} after={:?} limit={}",
        p.state,
        p.prefix,
        p.search,
        p.sort,
        p.order,
        p.after,
        p.limit.unwrap_or(idem_admin_api::DEFAULT_LIMIT)
    ));
    // The real gateway's checks and messages: the contract's own.
    let query = match p.check() {
        Ok(query) => query,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let (state, limit) = (query.state, query.limit as usize);
    let search = Some(query.search).filter(|s| !s.is_empty());
    let prefix = query.prefix;
    let mut rows: Vec<KeyInfo> = inner
        .keys
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .filter(|(_, s)| state.is_none_or(|st| s.state == st))
        .filter(|(k, _)| {
            // As the server: anywhere in the client's key, ignoring case.
            let own = k.split_once('/').map_or(k.as_str(), |(_, own)| own);
            search
                .as_deref()
                .is_none_or(|q| own.to_lowercase().contains(&q.to_lowercase()))
        })
        .map(|(k, s)| info(k, s, now))
        .collect();
    match query.sort {
        Sort::Key => {}
        Sort::Lease => rows.sort_by_key(|r| r.lease_until_ms),
        Sort::Expires => rows.sort_by_key(|r| r.expires_at_ms),
        Sort::Replays => rows.sort_by_key(|r| r.replays),
    }
    if query.order == Order::Desc {
        rows.reverse();
    }
    // The fake's cursor is an offset; the real one is opaque too.
    let start: usize = query
        .after
        .as_deref()
        .and_then(|a| a.strip_prefix('o'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let total = rows.len();
    let page: Vec<KeyInfo> = rows.into_iter().skip(start).take(limit).collect();
    let next = (start + page.len() < total).then(|| format!("o{}", start + page.len()));
    Json(KeyPage {
        now_ms: now,
        keys: page,
        next,
        total: Some(total as u64),
    })
    .into_response()
}

async fn one(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    let inner = shared.lock();
    match inner.keys.get(&key) {
        Some(s) => Json(KeyDetail {
            info: info(&key, s, now_ms()),
            response: s.response.clone(),
        })
        .into_response(),
        None => no_key(&key),
    }
}

async fn remove(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    let mut inner = shared.lock();
    inner.requests.push(format!("DELETE /v1/keys/{key}"));
    match inner.keys.remove(&key) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => no_key(&key),
    }
}

/// `POST /v1/keys/{key}/release` (of a processing key's lease) and
/// `POST /v1/keys/{key}/expire`.
async fn act(
    State(shared): State<Arc<Shared>>,
    Path((key, action)): Path<(String, String)>,
) -> Response {
    let now = now_ms();
    let mut inner = shared.lock();
    inner.requests.push(format!("POST /v1/keys/{key}/{action}"));
    let Some(s) = inner.keys.get_mut(&key) else {
        return no_key(&key);
    };
    match action.as_str() {
        "release" if s.state != KeyState::Processing => {
            return problem(
                StatusCode::CONFLICT,
                format!("{key:?} is done, not processing"),
            );
        }
        "release" => s.lease_until_ms = now,
        "expire" => s.expires_at_ms = now,
        _ => return problem(StatusCode::NOT_FOUND, format!("no action {action:?}")),
    }
    Json(info(&key, s, now)).into_response()
}

fn faults_body(inner: &Inner) -> Json<Faults> {
    Json(Faults {
        faults: inner.faults.clone(),
        injected: inner.injected,
    })
}

async fn faults(State(shared): State<Arc<Shared>>) -> Response {
    faults_body(&shared.lock()).into_response()
}

async fn set_faults(State(shared): State<Arc<Shared>>, body: String) -> Response {
    let mut inner = shared.lock();
    inner.requests.push(format!("PUT /v1/faults {body}"));
    let put = match SetFaults::from_json(body.as_bytes()) {
        Ok(put) => put,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    if let Err(why) = put.validate() {
        return problem(StatusCode::BAD_REQUEST, why);
    }
    for (op, rule) in put.faults {
        inner.faults.rule_mut(op).clone_from(&rule);
        let event = FaultEvent {
            ts_ms: now_ms(),
            op,
            rule,
            by: None,
        };
        let _ = shared.events.send(Event::Fault(event));
    }
    faults_body(&inner).into_response()
}

async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    let mut inner = shared.lock();
    inner.keys_queries.push("stats".into());
    let processing = inner
        .keys
        .values()
        .filter(|s| s.state == KeyState::Processing)
        .count() as f64;
    let mut stats = Stats {
        uptime_ms: 754_000,
        store: "memory".into(),
        ..Stats::default()
    };
    stats.rates_per_s.executed = 12.0;
    stats.rates_per_s.replayed = 3.5;
    stats.rates_per_s.in_flight = processing.min(9.0);
    stats.outcomes.executed = 9000;
    stats.store_latency_us.p50 = 80;
    stats.store_latency_us.p90 = 150;
    stats.store_latency_us.p99 = 900;
    stats.store_latency_us.max = 4000;
    Json(stats).into_response()
}

async fn event_stream(State(shared): State<Arc<Shared>>) -> Response {
    let rx = shared.events.subscribe();
    let stream = tokio_stream::wrappers::BroadcastStream::new(rx)
        .filter_map(|e| async move { e.ok() })
        .map(|event| {
            Ok::<_, std::convert::Infallible>(
                SseEvent::default().event(event.name()).data(event.data()),
            )
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}
