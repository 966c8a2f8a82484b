//! What every backend needs to turn a record into its own columns or bytes
//! and back, written once: the two error constructors, times and versions as
//! SQL integers, the columns both SQL backends write, and the headers blob —
//! the layout the SQLite `headers` column holds and a Redis value holds after
//! the status, byte for byte.
//!
//! ```text
//! headers := count:u32 (name_len:u32 name:utf8 value_len:u32 value)*     big-endian
//! ```

// Each backend uses its part (SQLite the SQL columns and the headers blob,
// Redis the byte layout, PostgreSQL the SQL columns); a build with fewer
// store features leaves the others' parts unused.
#![cfg_attr(
    not(all(feature = "sqlite", feature = "redis", feature = "postgres")),
    allow(dead_code)
)]

use super::{Record, StoreError};
use idem_guest::model::Checkpoint;

/// `store` could not be reached, or did not answer as it should.
pub(super) fn unavailable(store: &'static str, reason: impl Into<String>) -> StoreError {
    StoreError::Unavailable {
        store,
        reason: reason.into(),
        source: None,
    }
}

/// `store`'s driver failed with `error`: its text, and the error itself as
/// the source.
pub(super) fn driver_failed(
    store: &'static str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::Unavailable {
        store,
        reason: error.to_string(),
        source: Some(std::sync::Arc::new(error)),
    }
}

/// What `store` holds for `key` does not decode.
pub(super) fn corrupt(store: &'static str, key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        store,
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// Times and versions are u64; SQL integers are i64. Past `i64::MAX` (the
/// year 292 million) a time saturates, which keeps every comparison right.
pub(super) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// An integer column read back: negative only if something else wrote it.
pub(super) fn unsigned(column: &str, v: i64) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("{column} {v} is negative"))
}

/// A record as the SQL columns both SQL backends write (`wit/store-layout/`),
/// borrowed from it: times as SQL integers, the holder as the i64 of the
/// same 64 bits, the checkpoint as phase and data. The response's status and
/// headers are each backend's own: SQLite keeps the headers as one blob,
/// PostgreSQL as two arrays.
pub(super) struct SqlColumns<'r> {
    pub(super) fingerprint: &'r str,
    pub(super) state: &'static str,
    pub(super) lease_until_ms: i64,
    pub(super) expires_at_ms: i64,
    pub(super) body: Option<&'r [u8]>,
    pub(super) holder: i64,
    pub(super) phase: Option<&'r str>,
    pub(super) checkpoint: Option<&'r [u8]>,
}

impl<'r> SqlColumns<'r> {
    pub(super) fn new(record: &'r Record) -> Self {
        let checkpoint = record.checkpoint.as_ref();
        SqlColumns {
            fingerprint: &record.fingerprint,
            state: record.state.as_str(),
            lease_until_ms: int(record.lease_until_ms),
            expires_at_ms: int(record.expires_at_ms),
            body: record.response.as_ref().map(|r| r.body.as_slice()),
            holder: record.holder.cast_signed(),
            phase: checkpoint.map(|c| c.phase.as_str()),
            checkpoint: checkpoint.map(|c| c.data.as_slice()),
        }
    }
}

/// A checkpoint's two SQL columns (phase, data) read back: both NULL for
/// none; one without the other is corrupt.
pub(super) fn checkpoint_columns(
    phase: Option<String>,
    data: Option<Vec<u8>>,
) -> Result<Option<Checkpoint>, String> {
    match (phase, data) {
        (None, None) => Ok(None),
        (Some(phase), Some(data)) => Ok(Some(Checkpoint { phase, data })),
        _ => Err("the checkpoint's phase and data are only partly present".into()),
    }
}

/// How many bytes [`put_headers`] writes for `headers`.
pub(super) fn headers_len(headers: &[(String, Vec<u8>)]) -> usize {
    4 + headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum::<usize>()
}

/// Appends `headers` in the layout of the module docs.
pub(super) fn put_headers(out: &mut Vec<u8>, headers: &[(String, Vec<u8>)]) {
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        put(out, name.as_bytes());
        put(out, value);
    }
}

/// `headers` alone, as the SQLite column holds them.
pub(super) fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers_len(headers));
    put_headers(&mut out, headers);
    out
}

/// The inverse of [`encode_headers`]; says what is wrong with a blob that is not one.
pub(super) fn decode_headers(blob: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut reader = Reader::new(blob);
    let headers = reader.headers()?;
    if !reader.rest.is_empty() {
        return Err(format!(
            "has {} bytes after its {} headers",
            reader.rest.len(),
            headers.len()
        ));
    }
    Ok(headers)
}

/// A u32 length, then the bytes.
pub(super) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Reads the layouts above from the front of a byte string. Each method
/// says, when the bytes do not hold what it reads, what it was reading:
/// `ends inside the body (4 bytes needed, 3 left)`.
pub(super) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        self.split(n).ok_or_else(|| self.short(n, what))
    }

    fn split(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(head)
    }

    /// Built only on failure: a read that succeeds formats nothing.
    fn short(&self, n: usize, what: &str) -> String {
        format!(
            "ends inside {what} ({n} bytes needed, {} left)",
            self.rest.len()
        )
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returns N bytes"))
    }

    pub(super) fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(super) fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// A u32 length, then that many bytes (the inverse of [`put`]).
    pub(super) fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = match self.split(4) {
            Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize,
            None => return Err(self.short(4, &format!("{what}'s length"))),
        };
        self.take(n, what)
    }

    /// [`Reader::bytes`] that must be UTF-8.
    pub(super) fn text(&mut self, what: &str) -> Result<String, String> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{what} is not UTF-8: {e}"))
    }

    /// Headers as [`put_headers`] writes them.
    pub(super) fn headers(&mut self) -> Result<Vec<(String, Vec<u8>)>, String> {
        let count = u32::from_be_bytes(self.array("the header count")?) as usize;
        // Every header takes at least 8 bytes: a count beyond that is
        // corrupt, not a huge allocation.
        if count > self.rest.len() / 8 {
            return Err(format!(
                "claims {count} headers in {} bytes",
                self.rest.len()
            ));
        }
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let name = self.text("a header name")?;
            let value = self.bytes("a header value")?.to_vec();
            headers.push((name, value));
        }
        Ok(headers)
    }

    /// Whether everything has been read.
    pub(super) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// Nothing may follow what was read.
    pub(super) fn end(&self) -> Result<(), String> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(format!("has {} bytes after its end", self.rest.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver's error stays reachable as the source, for a caller that
    /// acts on its kind; the message is the driver's, as before.
    #[test]
    fn a_driver_error_is_kept_as_the_source() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = driver_failed("redis", refused);
        assert_eq!(err.to_string(), "redis store unavailable: refused");
        let source = std::error::Error::source(&err).expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    /// The blob as this layout has always written it: a record stored
    /// before must still decode, and be written again byte for byte.
    #[test]
    fn stored_header_blobs_still_decode() {
        let blob = b"\0\0\0\x02\0\0\0\x0ccontent-type\0\0\0\ntext/plain\0\0\0\x01x\0\0\0\x02\0\xff";
        let headers = vec![
            ("content-type".to_owned(), b"text/plain".to_vec()),
            ("x".to_owned(), vec![0, 255]),
        ];
        assert_eq!(encode_headers(&headers), blob);
        assert_eq!(headers_len(&headers), blob.len());
        assert_eq!(decode_headers(blob).unwrap(), headers);
    }

    #[test]
    fn headers_round_trip_and_bad_blobs_are_named() {
        let headers = vec![
            ("content-type".to_owned(), b"text/plain".to_vec()),
            (String::new(), vec![0, 255]),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
        assert_eq!(decode_headers(&encode_headers(&[])).unwrap(), vec![]);
        let blob = encode_headers(&headers);
        let says = |bytes: &[u8], what: &str| {
            let err = decode_headers(bytes).unwrap_err();
            assert!(err.contains(what), "{err:?} should say {what:?}");
        };
        says(&blob[..blob.len() - 1], "ends inside a header value");
        let mut trailing = blob.clone();
        trailing.push(0);
        says(&trailing, "has 1 bytes after its 2 headers");
        says(&[0xff, 0xff, 0xff, 0xff], "claims 4294967295 headers");
        says(b"", "ends inside the header count");
        says(&[0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0], "not UTF-8");
    }

    #[test]
    fn sql_integers_saturate_and_refuse_negatives() {
        assert_eq!(int(7), 7);
        assert_eq!(int(u64::MAX), i64::MAX);
        assert_eq!(unsigned("version", 7), Ok(7));
        assert_eq!(
            unsigned("version", -1).unwrap_err(),
            "version -1 is negative"
        );
    }
}

/// The records of `wit/store-layout/vectors.json`, for the backends' tests.
#[cfg(test)]
pub(super) mod vectors {
    use crate::store::{Record, State};
    use idem_guest::model::{Checkpoint, Response};
    use serde_json::Value as Json;

    pub(in crate::store) fn file() -> Json {
        serde_json::from_str(include_str!("../../../wit/store-layout/vectors.json")).unwrap()
    }

    pub(in crate::store) fn hex(s: &Json) -> Vec<u8> {
        let s = s.as_str().unwrap();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    pub(in crate::store) fn u64_of(s: &Json) -> u64 {
        s.as_str().unwrap().parse().unwrap()
    }

    pub(in crate::store) fn record(r: &Json) -> Record {
        Record {
            fingerprint: r["fingerprint"].as_str().unwrap().into(),
            state: State::parse(r["state"].as_str().unwrap()).unwrap(),
            holder: u64_of(&r["holder"]),
            lease_until_ms: u64_of(&r["lease_until_ms"]),
            expires_at_ms: u64_of(&r["expires_at_ms"]),
            response: (!r["response"].is_null()).then(|| Response {
                status: u16::try_from(r["response"]["status"].as_u64().unwrap()).unwrap(),
                headers: r["response"]["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| (h[0].as_str().unwrap().into(), hex(&h[1])))
                    .collect(),
                body: hex(&r["response"]["body"]),
            }),
            checkpoint: (!r["checkpoint"].is_null()).then(|| Checkpoint {
                phase: r["checkpoint"]["phase"].as_str().unwrap().into(),
                data: hex(&r["checkpoint"]["data"]),
            }),
        }
    }
}
