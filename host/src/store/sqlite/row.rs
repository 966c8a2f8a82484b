//! A record as a row: the columns, the statements that read and write
//! them, and the decoding of a row back into an entry.

use super::STORE;
use crate::Response;
use crate::store::codec::{
    SqlColumns, checkpoint_columns, corrupt, decode_headers, encode_headers, unsigned,
};
use crate::store::{Entry, Record, Result, State};
use rusqlite::{Row, ToSql};

/// A record's columns, in the order [`decode`] reads them and the write
/// statements number their parameters (`?1` the key, `?2` the version,
/// `?3` to `?12` the record as [`RecordColumns`] gives it).
macro_rules! columns {
    () => {
        "key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body, \
         holder, phase, checkpoint"
    };
}
pub(super) const COLUMNS: &str = columns!();

/// Sets the record's columns from `?3` to `?12`.
macro_rules! set_record {
    () => {
        "fingerprint = ?3, state = ?4, lease_until_ms = ?5, expires_at_ms = ?6, status = ?7, \
         headers = ?8, body = ?9, holder = ?10, phase = ?11, checkpoint = ?12"
    };
}

/// The write statements. Each is prepared once per connection and found
/// again in its statement cache.
pub(super) mod sql {
    pub const BEGIN: &str = "BEGIN IMMEDIATE";
    pub const COMMIT: &str = "COMMIT";
    pub const SELECT: &str = concat!("SELECT ", columns!(), " FROM records WHERE key = ?1");
    pub const INSERT: &str = concat!(
        "INSERT INTO records (",
        columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    );
    /// Inside the write transaction, so nothing changes the row between the
    /// read that found it expired and this write.
    pub const OVERWRITE: &str = concat!(
        "UPDATE records SET version = ?2, ",
        set_record!(),
        " WHERE key = ?1"
    );
    pub const REPLACE: &str = concat!(
        "UPDATE records SET version = version + 1, ",
        set_record!(),
        " WHERE key = ?1 AND version = ?2 AND expires_at_ms > ?13"
    );
    pub const DELETE: &str = "DELETE FROM records WHERE key = ?1 AND (?2 IS NULL OR version = ?2) \
                              AND expires_at_ms > ?3";
    pub const PURGE: &str = "DELETE FROM records WHERE rowid IN
         (SELECT rowid FROM records WHERE expires_at_ms <= ?1 LIMIT ?2)";
}

/// A record as the write statements' parameters `?3` to `?12`.
pub(super) struct RecordColumns<'r> {
    columns: SqlColumns<'r>,
    status: Option<u16>,
    headers: Option<Vec<u8>>,
}

impl<'r> RecordColumns<'r> {
    pub(super) fn new(record: &'r Record) -> Self {
        let response = record.response.as_ref();
        RecordColumns {
            columns: SqlColumns::new(record),
            status: response.map(|r| r.status),
            headers: response.map(|r| encode_headers(&r.headers)),
        }
    }

    /// The statement's parameters: `key` and `version` (`?1`, `?2`), the
    /// record (`?3` to `?12`), then `trailing`.
    pub(super) fn params<'a>(
        &'a self,
        key: &'a dyn ToSql,
        version: &'a i64,
        trailing: &[&'a dyn ToSql],
    ) -> Vec<&'a dyn ToSql> {
        let c = &self.columns;
        let mut params: Vec<&dyn ToSql> = vec![
            key,
            version,
            &c.fingerprint,
            &c.state,
            &c.lease_until_ms,
            &c.expires_at_ms,
            &self.status,
            &self.headers,
            &c.body,
            &c.holder,
            &c.phase,
            &c.checkpoint,
        ];
        params.extend_from_slice(trailing);
        params
    }
}

/// One row as an entry, or `Corrupt` naming the key and what is wrong.
pub(super) fn decode(key: &str, row: &Row<'_>) -> Result<Entry> {
    let bad = |e: rusqlite::Error| corrupt(STORE, key, e.to_string());
    let unsigned = |column: &str, v: i64| unsigned(column, v).map_err(|e| corrupt(STORE, key, e));
    let version = unsigned("version", row.get::<_, i64>(1).map_err(bad)?)?;
    let fingerprint: String = row.get(2).map_err(bad)?;
    let state_text: String = row.get(3).map_err(bad)?;
    let state = State::parse(&state_text)
        .ok_or_else(|| corrupt(STORE, key, format!("unknown state {state_text:?}")))?;
    let lease_until_ms = unsigned("lease_until_ms", row.get::<_, i64>(4).map_err(bad)?)?;
    let expires_at_ms = unsigned("expires_at_ms", row.get::<_, i64>(5).map_err(bad)?)?;
    let status: Option<i64> = row.get(6).map_err(bad)?;
    let headers: Option<Vec<u8>> = row.get(7).map_err(bad)?;
    let body: Option<Vec<u8>> = row.get(8).map_err(bad)?;
    let response = match (status, headers, body) {
        (None, None, None) => None,
        (Some(status), Some(headers), Some(body)) => Some(Response {
            status: u16::try_from(status).map_err(|_| {
                corrupt(STORE, key, format!("status {status} is not an HTTP status"))
            })?,
            headers: decode_headers(&headers)
                .map_err(|reason| corrupt(STORE, key, format!("headers blob {reason}")))?,
            body,
        }),
        _ => {
            return Err(corrupt(
                STORE,
                key,
                "the response's status, headers and body are only partly present",
            ));
        }
    };
    let holder = row.get::<_, i64>(9).map_err(bad)?.cast_unsigned();
    let phase: Option<String> = row.get(10).map_err(bad)?;
    let data: Option<Vec<u8>> = row.get(11).map_err(bad)?;
    let checkpoint = checkpoint_columns(phase, data).map_err(|e| corrupt(STORE, key, e))?;
    Ok(Entry {
        record: Record {
            fingerprint,
            state,
            holder,
            lease_until_ms,
            expires_at_ms,
            response,
            checkpoint,
        },
        version,
    })
}

/// The smallest string above every string starting with `prefix`, or `None`
/// when there is none; key order is UTF-8 byte order, which is char order.
pub(super) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_bounds_exactly_the_keys_with_the_prefix() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_end("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(prefix_end(&format!("a{}", char::MAX)).as_deref(), Some("b"));
        assert_eq!(prefix_end(&char::MAX.to_string()), None);
        for key in ["ab", "ab\u{10ffff}", "abz", "ab/1"] {
            assert!(
                key >= "ab" && key < prefix_end("ab").unwrap().as_str(),
                "{key}"
            );
        }
    }
}
