//! The admin API v1, on a listener of its own: keys, faults, stats, live
//! events and Prometheus metrics. Loopback by default; anywhere else a
//! bearer token is required, compared in constant time. Every body is a
//! type of the `idem-admin-api` crate, the contract the console decodes.

use super::Gateway;
use super::events::{Event, Verdict};
use crate::store::{Entry, ListQuery, Op, State as KeyState};
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use idem_admin_api as api;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

/// Records scanned at most to sort keys by something other than the key.
const MAX_SORT_SCAN: usize = 10_000;
/// Records read at most to search keys (`?search=`), in batches of
/// [`MAX_SORT_SCAN`]; at most that many matches are sorted and paged.
const MAX_SEARCH_SCAN: usize = 1_000_000;
const BODY_PREVIEW_CHARS: usize = 1024;

/// The admin API's listener and the token it requires, checked together.
pub struct AdminListener {
    pub(crate) listener: TcpListener,
    pub(crate) token: Option<Arc<str>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    #[error(
        "the admin API would listen on {0}, which is not a loopback address, without a token; set --admin-token (or IDEM_ADMIN_TOKEN), or listen on 127.0.0.1"
    )]
    NoToken(std::net::SocketAddr),
    #[error("the admin listener's address is unknown: {0}")]
    Address(#[from] std::io::Error),
}

impl AdminListener {
    /// Refuses a listener off loopback without a token. An empty token counts as none.
    pub fn new(
        listener: TcpListener,
        token: Option<String>,
    ) -> Result<AdminListener, ExposureError> {
        let addr = listener.local_addr()?;
        let token = token.filter(|t| !t.is_empty());
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(ExposureError::NoToken(addr));
        }
        Ok(AdminListener {
            listener,
            token: token.map(Arc::from),
        })
    }
}

#[derive(Clone)]
struct Admin {
    gateway: Gateway,
    token: Option<Arc<str>>,
    stop: watch::Receiver<bool>,
}

/// The admin routes. `stop` ends open event streams at shutdown.
pub fn router(gateway: Gateway, token: Option<Arc<str>>, stop: watch::Receiver<bool>) -> Router {
    let admin = Admin {
        gateway,
        token,
        stop,
    };
    Router::new()
        .route("/v1/keys", get(list_keys))
        .route("/v1/keys/{key}", get(get_key).delete(delete_key))
        .route("/v1/keys/{key}/release", post(release_key))
        .route("/v1/keys/{key}/expire", post(expire_key))
        .route("/v1/faults", get(get_faults).put(put_faults))
        .route("/v1/stats", get(stats))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "no such admin endpoint; see Admin API v1",
            )
        })
        .layer(middleware::from_fn_with_state(admin.clone(), authorize))
        .with_state(admin)
}

async fn authorize(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    if let Some(token) = &admin.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if !given.is_some_and(|given| same_secret(given, token.as_bytes())) {
            let mut response = problem(
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required: Authorization: Bearer TOKEN",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(req).await
}

/// Compares digests so neither the token's bytes nor its length leak
/// through timing.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// `body` as JSON. Through a `serde_json::Value`, whose objects keep their
/// keys sorted: the bytes are those the API sent before it had types.
fn json(body: &impl Serialize) -> Response {
    match serde_json::to_value(body) {
        Ok(value) => Json(value).into_response(),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer does not serialize: {e}"),
        ),
    }
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let body = api::Problem::new(
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        detail,
    );
    let text = serde_json::to_value(&body)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let mut response = (status, text).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

fn unavailable(e: &impl std::fmt::Display) -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the store failed: {e}"),
    )
}

impl Admin {
    fn now_ms(&self) -> u64 {
        self.gateway.guard().clock().now_ms()
    }

    fn key_info(&self, key: &str, entry: &Entry, now_ms: u64) -> api::KeyInfo {
        let r = &entry.record;
        let processing = r.state == KeyState::Processing;
        api::KeyInfo {
            key: key.to_owned(),
            state: if processing {
                api::KeyState::Processing
            } else {
                api::KeyState::Done
            },
            // A done record was written by `complete` at the claim's fence + 1.
            fence: if processing {
                entry.version
            } else {
                entry.version.saturating_sub(1)
            },
            version: entry.version,
            lease_until_ms: r.lease_until_ms,
            lease_remaining_ms: if processing {
                r.lease_until_ms.saturating_sub(now_ms)
            } else {
                0
            },
            expires_at_ms: r.expires_at_ms,
            expires_in_ms: r.expires_at_ms.saturating_sub(now_ms),
            fingerprint: r.fingerprint.clone(),
            status: r.response.as_ref().map(|resp| resp.status),
            replays: self.gateway.observer().replays(key),
        }
    }
}

async fn list_keys(
    State(admin): State<Admin>,
    params: Result<Query<api::KeyListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let asked = match params.check() {
        Ok(query) => query,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let state = asked.state.map(|state| match state {
        api::KeyState::Processing => KeyState::Processing,
        api::KeyState::Done => KeyState::Done,
    });
    let limit = asked.limit as usize;
    let descending = asked.order == api::Order::Desc;
    let now = admin.now_ms();
    let store = admin.gateway.guard().store();
    let prefix = asked.prefix;
    let search = Some(asked.search).filter(|s| !s.is_empty());

    if asked.sort == api::Sort::Key && !descending && search.is_none() {
        // Key order is the store's own: page with its cursor.
        let query = ListQuery {
            prefix,
            state,
            after: asked.after,
            limit: limit + 1,
        };
        let mut rows = match store.list(&query, now).await {
            Ok(rows) => rows,
            Err(e) => return unavailable(&e),
        };
        let next = (rows.len() > limit).then(|| {
            rows.truncate(limit);
            rows.last().map(|(k, _)| k.clone())
        });
        return json(&api::KeyPage {
            now_ms: now,
            keys: rows
                .iter()
                .map(|(k, e)| admin.key_info(k, e, now))
                .collect(),
            next: next.flatten(),
            total: None,
        });
    }

    // Other orders: sort a bounded scan; the cursor is an offset.
    let offset = match asked.after.as_deref().map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "after must be the `next` value of the previous page",
            );
        }
    };
    let query = ListQuery {
        prefix,
        state,
        after: None,
        limit: MAX_SORT_SCAN,
    };
    let rows = match &search {
        None => store.list(&query, now).await,
        Some(search) => scan_matching(store.as_ref(), query, search, now).await,
    };
    let mut rows = match rows {
        Ok(rows) => rows,
        Err(e) => return unavailable(&e),
    };
    let observer = admin.gateway.observer();
    match asked.sort {
        api::Sort::Expires => rows.sort_by_key(|(k, e)| (e.record.expires_at_ms, k.clone())),
        api::Sort::Lease => rows.sort_by_key(|(k, e)| (e.record.lease_until_ms, k.clone())),
        api::Sort::Replays => rows.sort_by_cached_key(|(k, _)| (observer.replays(k), k.clone())),
        api::Sort::Key => {}
    }
    if descending {
        rows.reverse();
    }
    let total = rows.len();
    json(&api::KeyPage {
        now_ms: now,
        keys: rows
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(k, e)| admin.key_info(k, e, now))
            .collect(),
        next: (offset + limit < total).then(|| (offset + limit).to_string()),
        total: Some(total as u64),
    })
}

/// The records of `query` whose client key contains `search` (ASCII case
/// ignored), in key order: at most [`MAX_SORT_SCAN`] of them, from at most
/// [`MAX_SEARCH_SCAN`] records read.
async fn scan_matching(
    store: &dyn crate::store::Store,
    mut query: ListQuery,
    search: &str,
    now: u64,
) -> Result<Vec<(String, Entry)>, crate::store::StoreError> {
    let needle = search.to_ascii_lowercase();
    let matches = |key: &str| {
        let own = key.split_once('/').map_or(key, |(_, own)| own);
        own.to_ascii_lowercase().contains(&needle)
    };
    let mut found = Vec::new();
    let mut read = 0;
    loop {
        let batch = store.list(&query, now).await?;
        read += batch.len();
        let last = (batch.len() == query.limit).then(|| batch.last().map(|(k, _)| k.clone()));
        found.extend(batch.into_iter().filter(|(k, _)| matches(k)));
        match last.flatten() {
            Some(after) if found.len() < MAX_SORT_SCAN && read < MAX_SEARCH_SCAN => {
                query.after = Some(after);
            }
            _ => break,
        }
    }
    found.truncate(MAX_SORT_SCAN);
    Ok(found)
}

async fn get_key(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    let now = admin.now_ms();
    match admin.gateway.guard().store().get(&key, now).await {
        Ok(Some(entry)) => json(&api::KeyDetail {
            info: admin.key_info(&key, &entry, now),
            response: entry.record.response.as_ref().map(|r| api::StoredResponse {
                status: r.status,
                headers: r
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
                body_bytes: r.body.len() as u64,
                body_preview: String::from_utf8_lossy(&r.body)
                    .chars()
                    .take(BODY_PREVIEW_CHARS)
                    .collect(),
                body_base64: base64::engine::general_purpose::STANDARD.encode(&r.body),
            }),
        }),
        Ok(None) => no_key(&key),
        Err(e) => unavailable(&e),
    }
}

fn no_key(key: &str) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        format!("no live record for key {key:?}"),
    )
}

async fn delete_key(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    match admin.gateway.guard().store().delete(&key, None).await {
        Ok(true) => {
            admin.gateway.observer().forget_replays(&key);
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => no_key(&key),
        Err(e) => unavailable(&e),
    }
}

#[allow(clippy::result_large_err)] // the error is the response itself
async fn release_key(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    rewrite(&admin, &key, |record, now| {
        if record.state != KeyState::Processing {
            return Err(problem(
                StatusCode::CONFLICT,
                format!("key {key:?} is {}, not processing", record.state.as_str()),
            ));
        }
        record.lease_until_ms = now;
        Ok(())
    })
    .await
}

#[allow(clippy::result_large_err)]
async fn expire_key(State(admin): State<Admin>, Path(key): Path<String>) -> Response {
    rewrite(&admin, &key, |record, now| {
        record.expires_at_ms = now;
        record.lease_until_ms = record.lease_until_ms.min(now);
        Ok(())
    })
    .await
}

/// Reads a key's record, changes it, and writes it back only if no one
/// wrote in between (version check), so an operator never clobbers a
/// request that is completing.
async fn rewrite(
    admin: &Admin,
    key: &str,
    change: impl FnOnce(&mut crate::Record, u64) -> Result<(), Response>,
) -> Response {
    let store = admin.gateway.guard().store();
    let now = admin.now_ms();
    let entry = match store.get(key, now).await {
        Ok(Some(entry)) => entry,
        Ok(None) => return no_key(key),
        Err(e) => return unavailable(&e),
    };
    let mut record = entry.record.clone();
    if let Err(response) = change(&mut record, now) {
        return response;
    }
    match store.replace(key, entry.version, record.clone(), now).await {
        Ok(Some(version)) => json(&admin.key_info(key, &Entry { record, version }, now)),
        Ok(None) => problem(
            StatusCode::CONFLICT,
            format!("key {key:?} changed while it was being rewritten; try again"),
        ),
        Err(e) => unavailable(&e),
    }
}

fn faults(admin: &Admin) -> api::Faults {
    let faults = admin.gateway.faults();
    let rules = faults.rules();
    let mut set = api::FaultSet::default();
    for op in Op::ALL {
        *set.rule_mut(op) = rules.get(&op).cloned().unwrap_or_default();
    }
    api::Faults {
        faults: set,
        injected: faults.injected(),
    }
}

async fn get_faults(State(admin): State<Admin>) -> Response {
    json(&faults(&admin))
}

async fn put_faults(State(admin): State<Admin>, body: axum::body::Bytes) -> Response {
    let bad = |why: String| problem(StatusCode::BAD_REQUEST, why);
    let set = match api::SetFaults::from_json(&body) {
        Ok(set) => set,
        Err(why) => return bad(why),
    };
    // All or nothing: every rule is checked before any is set.
    if let Err(why) = set.validate() {
        return bad(why);
    }
    let changes = set.faults;
    let handle = admin.gateway.faults();
    let before = handle.rules();
    for (op, rule) in &changes {
        if let Err(e) = handle.set(*op, rule.clone()) {
            // Not reached (the rules were validated); restore the old ones anyway.
            for op in Op::ALL {
                let _ = handle.set(op, before.get(&op).cloned().unwrap_or_default());
            }
            return bad(format!("faults.{op}: {}", e.0));
        }
    }
    for (op, rule) in changes {
        admin.gateway.observer().fault_changed(op, rule);
    }
    json(&faults(&admin))
}

/// The contract's name for a verdict.
fn outcome(verdict: Verdict) -> api::Outcome {
    match verdict {
        Verdict::Executed => api::Outcome::Executed,
        Verdict::Replayed => api::Outcome::Replayed,
        Verdict::InFlight => api::Outcome::InFlight,
        Verdict::Conflict => api::Outcome::Conflict,
        Verdict::Unavailable => api::Outcome::Unavailable,
        Verdict::Invalid => api::Outcome::Invalid,
    }
}

async fn stats(State(admin): State<Admin>) -> Response {
    let observer = admin.gateway.observer();
    let guard = admin.gateway.guard();
    let pool = guard.pool_stats();
    let latency = observer.store_latency_us();
    let mut stats = api::Stats {
        uptime_ms: observer.uptime().as_millis() as u64,
        store: guard.store().name().to_owned(),
        store_latency_us: api::Latency {
            p50: latency.p50,
            p90: latency.p90,
            p99: latency.p99,
            max: latency.max,
        },
        pool: api::Pool {
            instantiated: pool.instantiated,
            failed: pool.failed,
            idle: pool.idle as u64,
            in_use: pool.in_use,
        },
        purge: guard.purge_stats().map(|p| api::Purge {
            runs: p.runs,
            purged: p.purged,
            errors: p.errors,
            last_purged: p.last_purged,
            last_took_us: p.last_took_us,
            last_error: p.last_error,
            every_ms: p.every_ms,
        }),
        ..api::Stats::default()
    };
    for verdict in Verdict::ALL {
        *stats.outcomes.get_mut(outcome(verdict)) = observer.count(verdict);
        *stats.rates_per_s.get_mut(outcome(verdict)) = observer.rate(verdict);
    }
    json(&stats)
}

async fn events(State(admin): State<Admin>) -> Response {
    let observer = admin.gateway.observer();
    let limit = admin.gateway.gate().config().max_event_listeners;
    if observer.listeners() >= limit {
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the live event stream has its limit of {limit} listeners (max-event-listeners); retry later"
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    }
    let rx = observer.subscribe();
    let stream =
        futures_util::stream::unfold((rx, admin.stop.clone()), |(mut rx, mut stop)| async move {
            loop {
                tokio::select! {
                    received = rx.recv() => match received {
                        Ok(event) => return Some((Ok::<_, Infallible>(to_sse(&event)), (rx, stop))),
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                    () = super::serve::stopped(&mut stop) => return None,
                }
            }
        });
    Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(10))
                .text("keep-alive"),
        )
        .into_response()
}

fn to_sse(event: &Event) -> SseEvent {
    let event = match event {
        Event::Decision(d) => api::Event::Decision(api::DecisionEvent {
            ts_ms: d.ts_ms,
            key: d.key.clone(),
            outcome: outcome(d.outcome),
            status: d.status,
            latency_us: d.latency_us,
            detail: d.detail.clone(),
        }),
        Event::Fault(f) => api::Event::Fault(api::FaultEvent {
            ts_ms: f.ts_ms,
            op: f.op,
            rule: f.rule.clone(),
        }),
    };
    SseEvent::default().event(event.name()).data(event.data())
}

#[allow(clippy::too_many_lines)] // one block per metric
async fn metrics(State(admin): State<Admin>) -> Response {
    use std::fmt::Write as _;
    let observer = admin.gateway.observer();
    let pool = admin.gateway.guard().pool_stats();
    let latency = observer.store_latency_us();
    let mut text = String::new();
    // Every metric with its HELP and TYPE; durations in seconds, as
    // Prometheus names them (`_seconds`).
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    let plain = |value: &dyn std::fmt::Display| vec![(String::new(), value.to_string())];
    family(
        "idem_outcomes_total",
        "counter",
        "Guarded requests by what the gateway did.",
        &Verdict::ALL
            .iter()
            .map(|v| {
                (
                    format!("{{outcome=\"{}\"}}", v.as_str()),
                    observer.count(*v).to_string(),
                )
            })
            .collect::<Vec<_>>(),
    );
    #[allow(clippy::cast_precision_loss)] // microseconds as seconds: exact to 2^53 µs
    let seconds = |us: u64| format!("{}", us as f64 / 1e6);
    family(
        "idem_store_latency_seconds",
        "summary",
        "Latency of the latest store operations, in seconds (quantile 1 is the maximum).",
        &[
            ("0.5", latency.p50),
            ("0.9", latency.p90),
            ("0.99", latency.p99),
            ("1", latency.max),
        ]
        .map(|(q, us)| (format!("{{quantile=\"{q}\"}}"), seconds(us))),
    );
    family(
        "idem_faults_injected_total",
        "counter",
        "Store operations a fault rule made fail, delay or lose their reply.",
        &plain(&admin.gateway.faults().injected()),
    );
    family(
        "idem_pool_instantiated_total",
        "counter",
        "Guard component instances created.",
        &plain(&pool.instantiated),
    );
    family(
        "idem_pool_failed_total",
        "counter",
        "Guard component instantiations that failed.",
        &plain(&pool.failed),
    );
    family(
        "idem_pool_idle",
        "gauge",
        "Guard component instances ready for a call.",
        &plain(&pool.idle),
    );
    family(
        "idem_pool_in_use",
        "gauge",
        "Guard component instances serving a call now.",
        &plain(&pool.in_use),
    );
    family(
        "idem_uptime_seconds",
        "gauge",
        "Seconds since the gateway started.",
        &plain(&observer.uptime().as_secs()),
    );
    if let Some(purge) = admin.gateway.guard().purge_stats() {
        let _ = writeln!(
            text,
            "# HELP idem_purge_runs_total Purge periods run (each frees every record expired by its start).\n# TYPE idem_purge_runs_total counter\nidem_purge_runs_total {}",
            purge.runs
        );
        let _ = writeln!(
            text,
            "# HELP idem_purged_records_total Expired records freed by the purge.\n# TYPE idem_purged_records_total counter\nidem_purged_records_total {}",
            purge.purged
        );
        let _ = writeln!(
            text,
            "# HELP idem_purge_errors_total Purge periods stopped by a store error or timeout.\n# TYPE idem_purge_errors_total counter\nidem_purge_errors_total {}",
            purge.errors
        );
        let _ = writeln!(
            text,
            "# HELP idem_purge_last_duration_seconds How long the latest purge period took.\n# TYPE idem_purge_last_duration_seconds gauge\nidem_purge_last_duration_seconds {}",
            Duration::from_micros(purge.last_took_us).as_secs_f64()
        );
    }
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"", b"s3cret"));
    }
}
