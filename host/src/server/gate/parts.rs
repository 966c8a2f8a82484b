//! From HTTP to the guard and back: the client's key, its scope, the
//! request parts that make the fingerprint, a stored response as HTTP.

#[allow(clippy::wildcard_imports)]
use super::*;

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
/// without one), `/`, the key. See [`crate::server::parse::scoped_key`].
pub fn scoped_key(headers: &HeaderMap, config: &Config, key: &str) -> String {
    let client = config
        .client_header
        .as_deref()
        .and_then(|h| headers.get(h))
        .map(HeaderValue::as_bytes);
    crate::server::parse::scoped_key(client, key)
}

/// The request's canonical fingerprint (`wit/guard.wit`), computed natively
/// with the component's own code (see `RequestParts::fingerprint`): the
/// method, the path with its query, the configured headers and the body.
pub(super) fn fingerprint(
    parts: &axum::http::request::Parts,
    body: &Bytes,
    config: &Config,
) -> String {
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let headers = fingerprinted_headers(&parts.headers, &config.fingerprint_headers);
    idem_guest::fingerprint::fingerprint(parts.method.as_str(), path, &headers, body)
}

/// The stored response as HTTP, headers in their stored order.
/// The expiry header's value: the HTTP-date (RFC 9110 IMF-fixdate, in GMT)
/// of `expires_at_ms` (ms since the Unix epoch on the store's clock),
/// rounded down to the whole second so that a client never believes a
/// retry safe for longer than it is. `None` past the year 9999, which an
/// HTTP-date cannot name.
pub(crate) fn expiry_date(expires_at_ms: u64) -> Option<HeaderValue> {
    const LAST_HTTP_DATE_SECS: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let secs = expires_at_ms / 1000;
    if secs > LAST_HTTP_DATE_SECS {
        return None;
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    HeaderValue::from_str(&httpdate::fmt_http_date(at)).ok()
}

pub(crate) fn to_http(stored: &Stored) -> HttpResponse {
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
