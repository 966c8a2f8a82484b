//! The admin API v1, on a listener of its own: keys, faults, stats, live
//! events and Prometheus metrics. Loopback by default; anywhere else a
//! bearer token is required, compared in constant time. Every body is a
//! type of the `idem-admin-api` crate, the contract the console decodes.
//!
//! Here the listener, the router and what every handler shares; the handlers
//! are in `keys.rs` (keys: list, read, release, expire, delete) and
//! `observe.rs` (faults, stats, the event stream, metrics).

mod keys;
mod observe;

use keys::{delete_key, expire_key, get_key, list_keys, release_key};
use observe::{events, get_faults, metrics, put_faults, stats};

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

/// The shortest admin token accepted on a listener off loopback, in bytes:
/// 128 bits of a hex or base64 secret (`openssl rand -hex 16` gives 32 bytes).
pub const MIN_TOKEN_BYTES: usize = 16;

/// Why the admin API would not be safe to serve with this listener and token.
#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    #[error(
        "the admin API would listen on {0}, which is not a loopback address, without a token; set --admin-token-file FILE (or IDEM_ADMIN_TOKEN, or --admin-token), or listen on 127.0.0.1"
    )]
    NoToken(std::net::SocketAddr),
    #[error(
        "the admin token is {len} bytes; on {addr}, which is not a loopback address, it must be at least {MIN_TOKEN_BYTES} bytes (e.g. `openssl rand -hex 16`)"
    )]
    ShortToken {
        addr: std::net::SocketAddr,
        len: usize,
    },
    #[error(
        "the admin token is only whitespace; on {0}, which is not a loopback address, it must be at least {MIN_TOKEN_BYTES} bytes that are not all whitespace"
    )]
    BlankToken(std::net::SocketAddr),
    /// A token no client could send: HTTP strips the whitespace around a
    /// header value, and a control character cannot be in one.
    #[error("the admin token cannot be sent in an HTTP header: {0}")]
    Unsendable(&'static str),
    #[error("the admin listener's address is unknown: {0}")]
    Address(#[from] std::io::Error),
}

impl AdminListener {
    /// Refuses a listener off loopback without a token, or with one shorter
    /// than [`MIN_TOKEN_BYTES`] or only whitespace; and on any address a
    /// token no client could send (whitespace at either end, a control
    /// character). An empty token counts as none.
    pub fn new(
        listener: TcpListener,
        token: Option<String>,
    ) -> Result<AdminListener, ExposureError> {
        let addr = listener.local_addr()?;
        let token = token.filter(|t| !t.is_empty());
        if let Some(refused) = refuse(token.as_deref(), addr) {
            return Err(refused);
        }
        Ok(AdminListener {
            listener,
            token: token.map(Arc::from),
        })
    }
}

/// Why `token` may not guard an admin API on `addr`, if it may not.
fn refuse(token: Option<&str>, addr: std::net::SocketAddr) -> Option<ExposureError> {
    let exposed = !addr.ip().is_loopback();
    match token {
        None if exposed => Some(ExposureError::NoToken(addr)),
        Some(t) if exposed && t.trim().is_empty() => Some(ExposureError::BlankToken(addr)),
        Some(t) if exposed && t.len() < MIN_TOKEN_BYTES => {
            Some(ExposureError::ShortToken { addr, len: t.len() })
        }
        Some(t) if t.trim() != t => Some(ExposureError::Unsendable(
            "it starts or ends with whitespace, which HTTP strips from a header value",
        )),
        Some(t) if t.chars().any(char::is_control) => {
            Some(ExposureError::Unsendable("it has a control character"))
        }
        // None on loopback, or a token that passes.
        _ => None,
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
