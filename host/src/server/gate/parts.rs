//! From HTTP to the guard and back: the read half of a guarded request
//! ([`read`]: the client's key, its scope, the whole body, and so the parts
//! that make the fingerprint), and a stored response as HTTP.

#[allow(clippy::wildcard_imports)]
use super::*;
use bytes::BytesMut;
use hyper::body::Frame;
use std::cell::RefCell;

/// The key a client sent, if any: a structured-field string (`"…"`, as the
/// draft specifies) or, as many clients send it, a bare token. `None`
/// without a key header; an error for a malformed key or more than one.
pub fn client_key(headers: &HeaderMap, config: &Config) -> Result<Option<String>, KeyError> {
    let mut values = headers.get_all(config.key_header.as_str()).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated {
            header: config.key_header.clone(),
        });
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

/// A guarded request once read and checked: all the guard's decision
/// needs, handed to it whole (see [`Gate::handle`]).
#[derive(Debug)]
pub(super) struct Read {
    /// The store key: the client's scope, `/`, the client's key.
    pub(super) scoped: String,
    /// The request's head, forwarded as it came if the request runs.
    pub(super) parts: axum::http::request::Parts,
    /// The whole body, at most `max_request_bytes`.
    pub(super) body: Bytes,
}

/// Why [`read`] handed no request to the guard.
#[derive(Debug)]
pub(super) enum Unread {
    /// No key, and none is required: the request is forwarded unguarded.
    Unkeyed(Request<Body>),
    /// The request is refused (a 400, 408 or 413) before it takes a slot;
    /// `scoped` is its store key once known, empty before.
    Refused { scoped: String, problem: Problem },
}

/// The read half of a guarded request: the client's key, scoped by its
/// client header, and the whole body, read before a slot is taken so that
/// slow clients hold connections (capped apart), never the slots others
/// need.
pub(super) async fn read(req: Request<Body>, config: &Config) -> Result<Read, Unread> {
    let key = match client_key(req.headers(), config) {
        Ok(Some(key)) => key,
        Ok(None) if !config.require_key => return Err(Unread::Unkeyed(req)),
        Ok(None) => {
            let header = config.key_header.clone();
            return Err(Unread::refused("", Problem::KeyMissing { header }));
        }
        Err(why) => return Err(Unread::refused("", Problem::KeyMalformed(why.to_string()))),
    };
    let scoped = scoped_key(req.headers(), config, &key);
    let (parts, body) = req.into_parts();
    match read_body(body, config).await {
        Ok(body) => Ok(Read {
            scoped,
            parts,
            body,
        }),
        Err(problem) => Err(Unread::Refused { scoped, problem }),
    }
}

impl Unread {
    fn refused(scoped: &str, problem: Problem) -> Unread {
        Unread::Refused {
            scoped: scoped.into(),
            problem,
        }
    }
}

/// Reads a guarded request's body: at most `max_request_bytes`, within
/// the slow-client bounds of [`Paced`]. A body that comes in one frame (a
/// small one usually does) is kept as it came, not copied.
async fn read_body(body: Body, config: &Config) -> Result<Bytes, Problem> {
    let limit = config.max_request_bytes;
    let mut paced = Paced::new(body, config.body_read_timeout, config.min_body_rate);
    let mut whole = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = paced.frame().await {
        let data = match frame.map(Frame::into_data) {
            Ok(Ok(data)) => data,
            Ok(Err(_trailers)) => continue,
            Err(e) if e.is::<TooSlow>() => return Err(body_timeout(config)),
            Err(e) => {
                return Err(Problem::BadRequest(format!(
                    "the request body could not be read: {e}"
                )));
            }
        };
        let so_far = joined.as_ref().map_or(whole.len(), BytesMut::len);
        if data.len() > limit.saturating_sub(so_far) {
            return Err(Problem::BodyTooLarge { limit });
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if whole.is_empty() => whole = data,
            None => {
                let mut both = BytesMut::with_capacity(so_far + data.len());
                both.extend_from_slice(&whole);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(whole, BytesMut::freeze))
}

/// The answer to a body that fell behind the slow-client bounds.
pub(super) fn body_timeout(config: &Config) -> Problem {
    Problem::BodyTimeout {
        after: config.body_read_timeout,
        min_rate: config.min_body_rate,
    }
}

impl Read {
    /// The request's canonical fingerprint (`wit/guard.wit`): the method,
    /// the path with its query, the configured headers and the body —
    /// [`RequestParts::fingerprint`](crate::RequestParts::fingerprint) of
    /// them, computed without copying them into one (the body never
    /// crosses into the component; benchmarks/log.md, "Contract 0.2 (issue
    /// 19)", measures the choice).
    pub(super) fn fingerprint(&self, config: &Config) -> String {
        let parts = &self.parts;
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
        let headers = fingerprinted_headers(&parts.headers, &config.fingerprint_headers);
        idem_guest::fingerprint::fingerprint(parts.method.as_str(), path, &headers, &self.body)
    }

    /// The store key, and the request as it came, to forward.
    pub(super) fn into_request(self) -> (String, Request<Body>) {
        let request = Request::from_parts(self.parts, Body::from(self.body));
        (self.scoped, request)
    }
}

/// The stored response as HTTP, headers in their stored order.
/// The expiry header's value: the HTTP-date (RFC 9110 IMF-fixdate, in GMT)
/// of `expires_at_ms` (ms since the Unix epoch on the store's clock),
/// rounded down to the whole second so that a client never believes a
/// retry safe for longer than it is. `None` past the year 9999, which an
/// HTTP-date cannot name.
pub(crate) fn expiry_date(expires_at_ms: u64) -> Option<HeaderValue> {
    const LAST_HTTP_DATE_SECS: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    thread_local! {
        /// The last value made on this thread: keys claimed within a second
        /// of each other expire in the same second, and a replayed key's
        /// expiry does not move, so most requests need no formatting.
        static LAST: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let secs = expires_at_ms / 1000;
    if secs > LAST_HTTP_DATE_SECS {
        return None;
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((at, value)) = last.as_ref()
            && *at == secs
        {
            return Some(value.clone());
        }
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let value = HeaderValue::from_str(&httpdate::fmt_http_date(at)).ok()?;
        *last = Some((secs, value.clone()));
        Some(value)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn post(headers: &[(&str, &str)], body: &'static str) -> Request<Body> {
        let mut request = Request::post("/orders?sku=A");
        for &(name, value) in headers {
            request = request.header(name, value);
        }
        request.body(Body::from(body)).unwrap()
    }

    fn refused(unread: Unread) -> (String, Problem) {
        match unread {
            Unread::Refused { scoped, problem } => (scoped, problem),
            Unread::Unkeyed(_) => panic!("forwarded unguarded, not refused"),
        }
    }

    #[tokio::test]
    async fn a_keyed_request_is_read_whole_with_its_scope_and_fingerprint() {
        let config = Config::default();
        let headers = [
            ("idempotency-key", "\"order-1\""),
            ("authorization", "Bearer alice"),
            ("content-type", "application/json"),
        ];
        let read = read(post(&headers, r#"{"qty":1}"#), &config).await.unwrap();
        assert_eq!(
            read.scoped,
            crate::server::parse::scoped_key(Some(b"Bearer alice"), "order-1")
        );
        // The library's own fingerprint of the same parts.
        let parts = crate::RequestParts {
            method: "POST".into(),
            path: "/orders?sku=A".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: br#"{"qty":1}"#.to_vec(),
        };
        assert_eq!(read.fingerprint(&config), parts.fingerprint());
        // What is forwarded is the request as it came, body and all.
        let (scoped, forwarded) = read.into_request();
        assert_eq!(
            scoped,
            crate::server::parse::scoped_key(Some(b"Bearer alice"), "order-1")
        );
        assert_eq!(forwarded.uri(), "/orders?sku=A");
        assert_eq!(forwarded.headers()["authorization"], "Bearer alice");
        let body = forwarded.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, r#"{"qty":1}"#);
    }

    #[tokio::test]
    async fn without_a_key_a_request_passes_unless_one_is_required() {
        let config = Config::default();
        let unread = read(post(&[], "x"), &config).await.unwrap_err();
        assert!(matches!(unread, Unread::Unkeyed(ref r) if r.uri() == "/orders?sku=A"));
        let config = Config {
            require_key: true,
            ..Config::default()
        };
        let unread = read(post(&[], "x"), &config).await.unwrap_err();
        let header = "idempotency-key".to_owned();
        assert_eq!(
            refused(unread),
            (String::new(), Problem::KeyMissing { header })
        );
    }

    #[tokio::test]
    async fn a_bad_key_or_body_is_refused_before_the_guard() {
        let config = Config {
            max_request_bytes: 4,
            ..Config::default()
        };
        let twice = post(&[("idempotency-key", "a"), ("idempotency-key", "b")], "");
        let why = "more than one idempotency-key header; send exactly one";
        assert_eq!(
            refused(read(twice, &config).await.unwrap_err()),
            (String::new(), Problem::KeyMalformed(why.into()))
        );
        let large = post(&[("idempotency-key", "k")], "12345");
        assert_eq!(
            refused(read(large, &config).await.unwrap_err()),
            (
                crate::server::parse::scoped_key(None, "k"),
                Problem::BodyTooLarge { limit: 4 }
            )
        );
    }
}
