//! Error responses: `application/problem+json` (RFC 9457) in the `ietf`
//! profile, Stripe's `{"error":{...}}` in the `stripe` one.

use super::config::Profile;
use http::StatusCode;
use std::time::Duration;

/// Every way the gateway itself answers instead of the upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A guarded request without a key, where one is required.
    KeyMissing { header: String },
    /// The key header is not a valid key; the text says why.
    KeyMalformed(String),
    /// The key was used with another request (method, path, body or fingerprinted headers).
    KeyMismatch,
    /// The first request with this key is still running.
    InFlight { retry_after: Duration },
    /// The idempotency store failed: nothing was forwarded.
    StoreUnavailable(String),
    /// The request body is over the limit.
    BodyTooLarge { limit: usize },
    /// The request is bad in a way the gateway noticed (not the key).
    BadRequest(String),
    /// The upstream could not be reached or broke off.
    UpstreamFailed(String),
    /// The upstream did not answer within the timeout.
    UpstreamTimeout(Duration),
    /// The upstream ran the request, but its response is over the
    /// stored-response limit. This answer is stored in its place, so the
    /// key is done: repeats get it too, and the request never runs again.
    ResponseTooLarge { limit: usize },
    /// The upstream ran the request, but its response could not be
    /// recorded (the store failed, or the claim was taken over meanwhile).
    /// The client is not handed a response that a replay might contradict.
    NotRecorded { why: String, retry_after: Duration },
    /// The request body did not arrive in time (too slow a client).
    BodyTimeout { after: Duration, min_rate: u64 },
    /// More requests at once than the gateway takes: guarded ones
    /// (`max-concurrent`), or those it forwards unguarded
    /// (`max-concurrent-unguarded`), each class within its own limit.
    Overloaded { limit: usize, guarded: bool },
    /// The gateway's own HTTP layer (not the upstream) failed.
    Internal(String),
}

impl Problem {
    pub fn status(&self) -> StatusCode {
        match self {
            Problem::KeyMissing { .. } | Problem::KeyMalformed(_) | Problem::BadRequest(_) => {
                StatusCode::BAD_REQUEST
            }
            Problem::KeyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight { .. } => StatusCode::CONFLICT,
            Problem::StoreUnavailable(_)
            | Problem::Overloaded { .. }
            | Problem::NotRecorded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Problem::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Problem::UpstreamFailed(_) | Problem::ResponseTooLarge { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Problem::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Problem::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short stable name (the end of the problem type URI and the event
    /// detail) and the title, one row per problem.
    fn names(&self) -> (&'static str, &'static str) {
        match self {
            Problem::KeyMissing { .. } => ("idempotency-key-missing", "Idempotency-Key is missing"),
            Problem::KeyMalformed(_) => {
                ("idempotency-key-malformed", "Idempotency-Key is malformed")
            }
            Problem::KeyMismatch => (
                "idempotency-key-mismatch",
                "Idempotency-Key is already used for another request",
            ),
            Problem::InFlight { .. } => (
                "idempotency-key-in-flight",
                "A request with this Idempotency-Key is being processed",
            ),
            Problem::StoreUnavailable(_) => {
                ("store-unavailable", "The idempotency store is unavailable")
            }
            Problem::BodyTooLarge { .. } => ("body-too-large", "Request body too large"),
            Problem::BodyTimeout { .. } => ("body-timeout", "Request body too slow"),
            Problem::NotRecorded { .. } => (
                "response-not-recorded",
                "The request ran but its response could not be recorded",
            ),
            Problem::BadRequest(_) => ("bad-request", "Bad request"),
            Problem::UpstreamFailed(_) => ("upstream-failed", "The upstream failed"),
            Problem::UpstreamTimeout(_) => ("upstream-timeout", "The upstream timed out"),
            Problem::ResponseTooLarge { .. } => (
                "response-too-large",
                "The request ran; its response was too large to keep",
            ),
            Problem::Overloaded { .. } => ("overloaded", "Too many concurrent requests"),
            Problem::Internal(_) => ("internal", "Internal gateway error"),
        }
    }

    /// A short stable name: the end of the problem type URI and the event detail.
    pub fn slug(&self) -> &'static str {
        self.names().0
    }

    fn title(&self) -> &'static str {
        self.names().1
    }

    pub fn detail(&self) -> String {
        match self {
            Problem::KeyMissing { header } => format!("this endpoint requires an {header} header"),
            Problem::KeyMalformed(why) | Problem::BadRequest(why) | Problem::Internal(why) => why.clone(),
            Problem::KeyMismatch => {
                "the key was first used with another method, path, body or fingerprinted header; use a new key for a new request".into()
            }
            Problem::InFlight { retry_after } => {
                format!("retry after {} ms, when the first request has finished or its lease has run out", retry_after.as_millis())
            }
            Problem::StoreUnavailable(why) => format!("the request was not forwarded: {why}"),
            Problem::BodyTooLarge { limit } => format!("the request body is over the limit of {limit} bytes"),
            Problem::UpstreamFailed(why) => format!("the upstream failed: {why}"),
            Problem::UpstreamTimeout(after) => format!("the upstream did not answer within {} ms", after.as_millis()),
            Problem::ResponseTooLarge { limit } => format!(
                "the upstream ran the request, but its response was over the limit of {limit} bytes (body plus headers) and was not kept; the key is done and this answer is what every repeat gets, so the request is never run again"
            ),
            Problem::NotRecorded { why, retry_after } => format!(
                "the upstream ran the request, but its response could not be recorded ({why}), so it is not given out: a replay could contradict it. Retry after {} ms: the retry gets the recorded outcome, or, once the key's lease has run out, runs the request again (the upstream sees a higher Idempotency-Fence)",
                retry_after.as_millis()
            ),
            Problem::BodyTimeout { after, min_rate } => format!(
                "the request body did not arrive in time: it must arrive within {} ms and, after its first 2 s, at {min_rate} bytes/s or faster",
                after.as_millis()
            ),
            Problem::Overloaded { limit, guarded: true } => format!("the gateway handles at most {limit} guarded requests at once (max-concurrent); retry shortly"),
            Problem::Overloaded { limit, guarded: false } => format!("the gateway forwards at most {limit} unguarded requests (without a key, or of a method it does not guard) at once (max-concurrent-unguarded); retry shortly"),
        }
    }

    fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Problem::InFlight { retry_after } | Problem::NotRecorded { retry_after, .. } => {
                Some(retry_after.as_millis().div_ceil(1000).max(1) as u64)
            }
            Problem::StoreUnavailable(_) | Problem::Overloaded { .. } => Some(1),
            _ => None,
        }
    }

    /// The response a client sees, in the profile's shape: status, content
    /// type, JSON body, and `Retry-After` in seconds where a retry may work.
    pub fn render(&self, profile: Profile) -> Rendered {
        let status = self.status();
        let (status, content_type, body) = match profile {
            Profile::Ietf => (
                status,
                "application/problem+json",
                serde_json::json!({
                    "type": format!("https://idem.dev/problems/{}", self.slug()),
                    "title": self.title(),
                    "status": status.as_u16(),
                    "detail": self.detail(),
                }),
            ),
            Profile::Stripe => {
                let (status, kind, code) = match self {
                    Problem::KeyMismatch => (StatusCode::BAD_REQUEST, "idempotency_error", None),
                    Problem::InFlight { .. } => (
                        StatusCode::CONFLICT,
                        "idempotency_error",
                        Some("idempotency_key_in_use"),
                    ),
                    Problem::KeyMissing { .. }
                    | Problem::KeyMalformed(_)
                    | Problem::BadRequest(_)
                    | Problem::BodyTooLarge { .. }
                    | Problem::BodyTimeout { .. } => (status, "invalid_request_error", None),
                    _ => (status, "api_error", None),
                };
                let mut error = serde_json::json!({"type": kind, "message": self.detail()});
                if let Some(code) = code {
                    error["code"] = code.into();
                }
                (
                    status,
                    "application/json",
                    serde_json::json!({ "error": error }),
                )
            }
        };
        Rendered {
            status,
            content_type,
            body: body.to_string(),
            retry_after_secs: self.retry_after_secs(),
        }
    }

    /// The response a client sees, in the profile's shape.
    #[cfg(feature = "engine")]
    pub fn into_response(self, profile: Profile) -> axum::http::Response<axum::body::Body> {
        use axum::http::{HeaderValue, header};
        let rendered = self.render(profile);
        let mut response = axum::http::Response::new(axum::body::Body::from(rendered.body));
        *response.status_mut() = rendered.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(rendered.content_type),
        );
        if let Some(secs) = rendered.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A problem as HTTP parts, before any framework builds the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub status: StatusCode,
    pub content_type: &'static str,
    /// JSON.
    pub body: String,
    /// `Retry-After`, in whole seconds.
    pub retry_after_secs: Option<u64>,
}
