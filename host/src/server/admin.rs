//! The admin API v1, on a listener of its own: keys, faults, stats, live
//! events and Prometheus metrics. Loopback by default; anywhere else a
//! bearer token is required, compared in constant time.

use super::Gateway;
use super::events::{Event, Verdict};
use crate::store::{Entry, FaultRule, ListQuery, Op, State as KeyState};
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
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
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

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail.into(),
    });
    let mut response = (status, body.to_string()).into_response();
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

    fn key_json(&self, key: &str, entry: &Entry, now_ms: u64) -> Value {
        let r = &entry.record;
        let processing = r.state == KeyState::Processing;
        json!({
            "key": key,
            "state": r.state.as_str(),
            // A done record was written by `complete` at the claim's fence + 1.
            "fence": if processing { entry.version } else { entry.version.saturating_sub(1) },
            "version": entry.version,
            "lease_until_ms": r.lease_until_ms,
            "lease_remaining_ms": if processing { r.lease_until_ms.saturating_sub(now_ms) } else { 0 },
            "expires_at_ms": r.expires_at_ms,
            "expires_in_ms": r.expires_at_ms.saturating_sub(now_ms),
            "fingerprint": r.fingerprint,
            "status": r.response.as_ref().map(|resp| resp.status),
            "replays": self.gateway.observer().replays(key),
        })
    }
}

#[derive(Deserialize)]
struct ListParams {
    state: Option<String>,
    prefix: Option<String>,
    /// Matches anywhere in the client's own key (after the client scope
    /// and its `/`), ignoring ASCII case.
    search: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
    sort: Option<String>,
    order: Option<String>,
}

#[allow(clippy::too_many_lines)] // parameter checks, then two ways to page
async fn list_keys(
    State(admin): State<Admin>,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(p) = match params {
        Ok(p) => p,
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let state = match p.state.as_deref() {
        None => None,
        Some(s) => match KeyState::parse(s) {
            Some(state) => Some(state),
            None => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    format!("state {s:?} is not processing or done"),
                );
            }
        },
    };
    let limit = p.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return problem(
            StatusCode::BAD_REQUEST,
            format!("limit {limit} is outside 1 to 1000"),
        );
    }
    let sort = p.sort.as_deref().unwrap_or("key");
    if !["key", "expires", "lease", "replays"].contains(&sort) {
        return problem(
            StatusCode::BAD_REQUEST,
            format!("sort {sort:?} is not key, expires, lease or replays"),
        );
    }
    let descending = match p.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(o) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("order {o:?} is not asc or desc"),
            );
        }
    };
    let now = admin.now_ms();
    let store = admin.gateway.guard().store();
    let prefix = p.prefix.unwrap_or_default();
    let search = p.search.filter(|s| !s.is_empty());

    if sort == "key" && !descending && search.is_none() {
        // Key order is the store's own: page with its cursor.
        let query = ListQuery {
            prefix,
            state,
            after: p.after,
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
        let keys: Vec<Value> = rows
            .iter()
            .map(|(k, e)| admin.key_json(k, e, now))
            .collect();
        return Json(json!({"now_ms": now, "keys": keys, "next": next.flatten(), "total": null}))
            .into_response();
    }

    // Other orders: sort a bounded scan; the cursor is an offset.
    let offset = match p.after.as_deref().map(str::parse::<usize>) {
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
    match sort {
        "expires" => rows.sort_by_key(|(k, e)| (e.record.expires_at_ms, k.clone())),
        "lease" => rows.sort_by_key(|(k, e)| (e.record.lease_until_ms, k.clone())),
        "replays" => rows.sort_by_cached_key(|(k, _)| (observer.replays(k), k.clone())),
        _ => {}
    }
    if descending {
        rows.reverse();
    }
    let total = rows.len();
    let page: Vec<Value> = rows
        .iter()
        .skip(offset)
        .take(limit)
        .map(|(k, e)| admin.key_json(k, e, now))
        .collect();
    let next = (offset + limit < total).then(|| (offset + limit).to_string());
    Json(json!({"now_ms": now, "keys": page, "next": next, "total": total})).into_response()
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
        Ok(Some(entry)) => {
            let mut body = admin.key_json(&key, &entry, now);
            body["response"] = entry.record.response.as_ref().map_or(Value::Null, |r| {
                json!({
                    "status": r.status,
                    "headers": r.headers.iter().map(|(n, v)| json!([n, String::from_utf8_lossy(v)])).collect::<Vec<_>>(),
                    "body_bytes": r.body.len(),
                    "body_preview": String::from_utf8_lossy(&r.body).chars().take(BODY_PREVIEW_CHARS).collect::<String>(),
                    "body_base64": base64::engine::general_purpose::STANDARD.encode(&r.body),
                })
            });
            Json(body).into_response()
        }
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
        Ok(Some(version)) => {
            Json(admin.key_json(key, &Entry { record, version }, now)).into_response()
        }
        Ok(None) => problem(
            StatusCode::CONFLICT,
            format!("key {key:?} changed while it was being rewritten; try again"),
        ),
        Err(e) => unavailable(&e),
    }
}

fn faults_json(admin: &Admin) -> Value {
    let faults = admin.gateway.faults();
    let rules = faults.rules();
    let by_op: BTreeMap<&str, FaultRule> = Op::ALL
        .into_iter()
        .map(|op| (op.as_str(), rules.get(&op).cloned().unwrap_or_default()))
        .collect();
    json!({"faults": by_op, "injected": faults.injected()})
}

async fn get_faults(State(admin): State<Admin>) -> Response {
    Json(faults_json(&admin)).into_response()
}

async fn put_faults(State(admin): State<Admin>, body: axum::body::Bytes) -> Response {
    let bad = |why: String| problem(StatusCode::BAD_REQUEST, why);
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad(format!("the body is not JSON: {e}")),
    };
    let Some(faults) = value.get("faults").and_then(Value::as_object) else {
        return bad("the body must be {\"faults\":{\"insert\":RULE,...}}".into());
    };
    let mut changes = Vec::new();
    for (name, rule) in faults {
        let op: Op = match name.parse() {
            Ok(op) => op,
            Err(e) => return bad(format!("faults.{name}: {e}")),
        };
        match serde_json::from_value::<FaultRule>(rule.clone()) {
            Ok(rule) => changes.push((op, rule)),
            Err(e) => return bad(format!("faults.{name}: {e}")),
        }
    }
    // All or nothing: on a rule that does not validate, restore the old ones.
    let handle = admin.gateway.faults();
    let before = handle.rules();
    for (op, rule) in &changes {
        if let Err(e) = handle.set(*op, rule.clone()) {
            for op in Op::ALL {
                let _ = handle.set(op, before.get(&op).cloned().unwrap_or_default());
            }
            return bad(format!(
                "faults.{}: {}; probability is 0 to 1 and latency_ms at most 60000",
                op.as_str(),
                e.0
            ));
        }
    }
    for (op, rule) in changes {
        admin.gateway.observer().fault_changed(op, rule);
    }
    Json(faults_json(&admin)).into_response()
}

fn outcome_map(f: impl Fn(Verdict) -> Value) -> Value {
    Value::Object(
        Verdict::ALL
            .into_iter()
            .map(|v| (v.as_str().to_owned(), f(v)))
            .collect(),
    )
}

async fn stats(State(admin): State<Admin>) -> Response {
    let observer = admin.gateway.observer();
    let pool = admin.gateway.guard().pool_stats();
    Json(json!({
        "uptime_ms": observer.uptime().as_millis() as u64,
        "store": admin.gateway.guard().store().name(),
        "outcomes": outcome_map(|v| observer.count(v).into()),
        "rates_per_s": outcome_map(|v| observer.rate(v).into()),
        "store_latency_us": observer.store_latency_us(),
        "pool": {"instantiated": pool.instantiated, "failed": pool.failed, "idle": pool.idle, "in_use": pool.in_use},
        "purge": admin.gateway.guard().purge_stats(),
    }))
    .into_response()
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
    match event {
        Event::Decision(d) => SseEvent::default()
            .event("decision")
            .data(serde_json::to_string(d).unwrap_or_default()),
        Event::Fault(f) => SseEvent::default()
            .event("fault")
            .data(serde_json::to_string(f).unwrap_or_default()),
    }
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
