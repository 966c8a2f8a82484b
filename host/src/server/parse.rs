//! What the gateway reads from a request before the guard sees it: the
//! idempotency key, the client's scope, the headers that are part of the
//! fingerprint, the hop-by-hop headers it must not forward. Pure functions
//! over bytes and header maps, so the `gateway` fuzz target (`fuzz/`) runs
//! them without the engine (`idem` with `default-features = false`).
//!
//! ```
//! use idem::server::parse::{idempotency_key, scoped_key};
//! assert_eq!(idempotency_key(b"\"order-1\"").unwrap(), "order-1");
//! assert_eq!(scoped_key(None, "order-1"), "anon/order-1");
//! ```

use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// The largest key a client may send. The store key adds a 16-character
/// client scope and a `/`, and the guard's limit is 255 bytes.
pub const MAX_KEY_BYTES: usize = 200;

/// Headers that belong to one connection and are never forwarded or stored.
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The key in one `Idempotency-Key` header value: a structured-field string
/// (`"…"`, as the draft specifies, escaping only `"` and `\`) or, as many
/// clients send it, a bare token of visible ASCII. 1 to [`MAX_KEY_BYTES`]
/// bytes once unquoted. The error says what is wrong, for a 400.
pub fn idempotency_key(raw: &[u8]) -> Result<String, KeyError> {
    let key = if let Some(rest) = raw.strip_prefix(b"\"") {
        let inner = rest.strip_suffix(b"\"").ok_or(KeyError::Unclosed)?;
        let mut key = Vec::with_capacity(inner.len());
        let mut bytes = inner.iter();
        while let Some(&b) = bytes.next() {
            match b {
                b'\\' => match bytes.next() {
                    Some(&e @ (b'"' | b'\\')) => key.push(e),
                    _ => return Err(KeyError::BadEscape),
                },
                b'"' => return Err(KeyError::UnescapedQuote),
                0x20..=0x7e => key.push(b),
                other => return Err(KeyError::QuotedByte(other)),
            }
        }
        key
    } else {
        if let Some(&b) = raw.iter().find(|b| !b.is_ascii_graphic()) {
            return Err(KeyError::TokenByte(b));
        }
        raw.to_vec()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong(key.len()));
    }
    String::from_utf8(key).map_err(|source| KeyError::NotUtf8 { source })
}

/// Why a client's key was refused (a `400`): the message says what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the quoted key has no closing '\"'")]
    Unclosed,
    #[error("a quoted key may only escape '\"' and '\\'")]
    BadEscape,
    #[error("a quoted key contains an unescaped '\"'")]
    UnescapedQuote,
    /// A byte outside printable ASCII inside the quotes.
    #[error("the key contains byte 0x{0:02x}; keys are printable ASCII")]
    QuotedByte(u8),
    /// A byte outside visible ASCII in an unquoted key.
    #[error(
        "the key contains byte 0x{0:02x}; an unquoted key is visible ASCII without spaces (quote it as a structured-field string otherwise)"
    )]
    TokenByte(u8),
    #[error("the key is empty; keys are 1 to {MAX_KEY_BYTES} bytes")]
    Empty,
    /// Longer than [`MAX_KEY_BYTES`]: the key's length in bytes.
    #[error("the key is {0} bytes; the limit is {MAX_KEY_BYTES}")]
    TooLong(usize),
    /// More than one key header (the gateway's `client_key`).
    #[error("more than one {header} header; send exactly one")]
    Repeated { header: String },
    #[error("the key is not UTF-8")]
    NotUtf8 { source: std::string::FromUtf8Error },
}

/// The store key for a client's key: the client's scope, `/`, the key. The
/// scope is the first 16 hex digits of the SHA-256 of the client header's
/// value (`anon` without one), so two clients never share a record, no
/// secret is stored, and the scope never contains a `/`.
pub fn scoped_key(client: Option<&[u8]>, key: &str) -> String {
    let scope = client.map_or_else(
        || "anon".to_owned(),
        |v| {
            let digest = Sha256::digest(v);
            digest[..8]
                .iter()
                .fold(String::with_capacity(16), |mut hex, b| {
                    let _ = write!(hex, "{b:02x}");
                    hex
                })
        },
    );
    format!("{scope}/{key}")
}

/// The headers that are part of the fingerprint: every value of each header
/// named in `names` (lower case), in the order the names and values come.
pub fn fingerprinted_headers(headers: &HeaderMap, names: &[String]) -> Vec<(String, Vec<u8>)> {
    names
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name.as_str())
                .iter()
                .map(move |v| (name.clone(), v.as_bytes().to_vec()))
        })
        .collect()
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none (an HTTP/1.1 client sends no `Connection`
    // to keep a connection alive): one look at the names they do carry
    // costs less than one removal by name, which parses and hashes it.
    if !headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(&name.as_str()))
    {
        return;
    }
    let named: Vec<String> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let map = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, http::HeaderValue::from_static(value));
            }
            map
        };
        let names = |map: &HeaderMap| {
            map.iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect::<Vec<_>>()
        };
        // None there: the map is left as it was, every value in order.
        let plain = [
            ("host", "a"),
            ("x-one", "1"),
            ("x-one", "2"),
            ("content-length", "3"),
        ];
        let mut kept = map(&plain);
        strip_hop_by_hop(&mut kept);
        assert_eq!(names(&kept), names(&map(&plain)));
        // One there: it goes, and so does every header `Connection` names.
        let mut stripped = map(&[
            ("host", "a"),
            ("connection", "X-Private, keep-alive"),
            ("x-private", "secret"),
            ("te", "trailers"),
            ("x-one", "1"),
            ("upgrade", "h2c"),
        ]);
        strip_hop_by_hop(&mut stripped);
        assert_eq!(names(&stripped), ["host: a", "x-one: 1"]);
    }

    #[test]
    fn keys_parse_as_strings_or_tokens() {
        assert_eq!(
            idempotency_key(b"\"8e03978e-40d5\"").unwrap(),
            "8e03978e-40d5"
        );
        assert_eq!(idempotency_key(b"\"a \\\"b\\\\\"").unwrap(), "a \"b\\");
        assert_eq!(idempotency_key(b"order-1").unwrap(), "order-1");
        let refused = |raw: &[u8]| idempotency_key(raw).unwrap_err();
        assert_eq!(refused(b"\"open"), KeyError::Unclosed);
        assert_eq!(refused(b"has space"), KeyError::TokenByte(b' '));
        assert_eq!(refused(b"\"\""), KeyError::Empty);
        assert_eq!(refused(&[b'k'; 201]), KeyError::TooLong(201));
        assert_eq!(refused(b"\"a\\nb\""), KeyError::BadEscape);
        // The messages, as a 400's detail says them.
        for (raw, says) in [
            (&b"\"open"[..], "the quoted key has no closing '\"'"),
            (
                b"has space",
                "the key contains byte 0x20; an unquoted key is visible ASCII without spaces (quote it as a structured-field string otherwise)",
            ),
            (b"\"\"", "the key is empty; keys are 1 to 200 bytes"),
            (&[b'k'; 201], "the key is 201 bytes; the limit is 200"),
            (b"\"a\\nb\"", "a quoted key may only escape '\"' and '\\'"),
            (b"\"a\"b\"", "a quoted key contains an unescaped '\"'"),
            (
                b"\"tab\there\"",
                "the key contains byte 0x09; keys are printable ASCII",
            ),
        ] {
            assert_eq!(refused(raw).to_string(), says, "{raw:?}");
        }
    }

    #[test]
    fn scopes_differ_by_client_and_hide_the_secret() {
        let (ka, kb) = (
            scoped_key(Some(b"Bearer alice"), "k"),
            scoped_key(Some(b"Bearer bob"), "k"),
        );
        assert_ne!(ka, kb);
        assert!(!ka.contains("alice"));
        assert_eq!(scoped_key(None, "k"), "anon/k");
        assert_eq!(ka.len(), 16 + 2);
    }
}
