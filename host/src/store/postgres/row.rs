//! A record as the statements' parameters, and a row back as an entry.

use super::NAME;
use crate::store::codec::{SqlColumns, checkpoint_columns, corrupt, unsigned};
use crate::store::{Entry, Record, Result, State};
use deadpool_postgres::tokio_postgres::{self, Row, types::ToSql};
use idem_guest::model::Response;

/// A record as the statements' parameters, in the layout's column order
/// (`wit/store-layout/`) after the version: fingerprint, state, lease,
/// expiry, status, header names, header values, body, holder, phase,
/// checkpoint data.
pub(super) struct RecordParams<'r> {
    columns: SqlColumns<'r>,
    status: Option<i32>,
    names: Option<Vec<String>>,
    values: Option<Vec<Vec<u8>>>,
}

impl<'r> RecordParams<'r> {
    pub(super) fn new(record: &'r Record) -> Self {
        let response = record.response.as_ref();
        RecordParams {
            columns: SqlColumns::new(record),
            status: response.map(|r| i32::from(r.status)),
            names: response.map(|r| r.headers.iter().map(|(n, _)| n.clone()).collect()),
            values: response.map(|r| r.headers.iter().map(|(_, v)| v.clone()).collect()),
        }
    }

    /// `leading` (key, version, now: as the statement wants), then the record.
    pub(super) fn after<'a>(
        &'a self,
        leading: &[&'a (dyn ToSql + Sync)],
    ) -> Vec<&'a (dyn ToSql + Sync)> {
        let c = &self.columns;
        let mut params = leading.to_vec();
        params.extend_from_slice(&[
            &c.fingerprint,
            &c.state,
            &c.lease_until_ms,
            &c.expires_at_ms,
            &self.status,
            &self.names,
            &self.values,
            &c.body,
            &c.holder,
            &c.phase,
            &c.checkpoint,
        ]);
        params
    }
}

/// Decodes the layout's columns starting at column `at`.
pub(super) fn decode(key: &str, row: &Row, at: usize) -> Result<Entry> {
    let col = |name: &str, e: tokio_postgres::Error| {
        corrupt(
            NAME,
            key,
            format!("the column {name:?} does not decode: {e}"),
        )
    };
    let version: i64 = row.try_get(at).map_err(|e| col("version", e))?;
    let fingerprint: String = row.try_get(at + 1).map_err(|e| col("fingerprint", e))?;
    let state: String = row.try_get(at + 2).map_err(|e| col("state", e))?;
    let lease: i64 = row.try_get(at + 3).map_err(|e| col("lease_until_ms", e))?;
    let exp: i64 = row.try_get(at + 4).map_err(|e| col("expires_at_ms", e))?;
    let status: Option<i32> = row.try_get(at + 5).map_err(|e| col("status", e))?;
    let names: Option<Vec<String>> = row.try_get(at + 6).map_err(|e| col("header_names", e))?;
    let values: Option<Vec<Vec<u8>>> = row.try_get(at + 7).map_err(|e| col("header_values", e))?;
    let body: Option<Vec<u8>> = row.try_get(at + 8).map_err(|e| col("body", e))?;
    let holder: i64 = row.try_get(at + 9).map_err(|e| col("holder", e))?;
    let phase: Option<String> = row.try_get(at + 10).map_err(|e| col("phase", e))?;
    let data: Option<Vec<u8>> = row.try_get(at + 11).map_err(|e| col("checkpoint", e))?;
    let unsigned = |name: &str, n: i64| unsigned(name, n).map_err(|e| corrupt(NAME, key, e));
    let state = State::parse(&state)
        .ok_or_else(|| corrupt(NAME, key, format!("unknown state {state:?}")))?;
    let response = match (status, names, values, body) {
        (None, None, None, None) => None,
        (Some(status), Some(names), Some(values), Some(body)) if names.len() == values.len() => {
            Some(Response {
                status: u16::try_from(status)
                    .map_err(|_| corrupt(NAME, key, format!("status {status} is out of range")))?,
                headers: names.into_iter().zip(values).collect(),
                body,
            })
        }
        _ => {
            return Err(corrupt(
                NAME,
                key,
                "the response columns are inconsistent (status, header names/values, body)",
            ));
        }
    };
    let checkpoint = checkpoint_columns(phase, data).map_err(|e| corrupt(NAME, key, e))?;
    Ok(Entry {
        version: unsigned("version", version)?,
        record: Record {
            fingerprint,
            state,
            holder: holder.cast_unsigned(),
            lease_until_ms: unsigned("lease_until_ms", lease)?,
            expires_at_ms: unsigned("expires_at_ms", exp)?,
            response,
            checkpoint,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::vectors::{file, hex, record};
    use serde_json::Value as Json;

    fn int_of(s: &Json) -> i64 {
        s.as_str().unwrap().parse().unwrap()
    }

    /// `wit/store-layout/vectors.json`: the columns every PostgreSQL store
    /// writes for these records (the Redis tests build the records).
    #[test]
    fn records_become_the_layouts_columns() {
        for v in file()["records"].as_array().unwrap() {
            let record = record(&v["record"]);
            let params = RecordParams::new(&record);
            let (p, c) = (&params, &params.columns);
            let row = &v["postgres"];
            let name = &v["name"];
            assert_eq!(
                c.fingerprint,
                row["fingerprint"].as_str().unwrap(),
                "{name}"
            );
            assert_eq!(c.state, row["state"].as_str().unwrap(), "{name}");
            assert_eq!(c.lease_until_ms, int_of(&row["lease_until_ms"]), "{name}");
            assert_eq!(c.expires_at_ms, int_of(&row["expires_at_ms"]), "{name}");
            assert_eq!(c.holder, int_of(&row["holder"]), "{name}");
            assert_eq!(p.status.map(i64::from), row["status"].as_i64(), "{name}");
            let names = row["header_names"].as_array().map(|a| {
                a.iter()
                    .map(|n| n.as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
            });
            assert_eq!(p.names, names, "{name}");
            let values = row["header_values"]
                .as_array()
                .map(|a| a.iter().map(hex).collect::<Vec<_>>());
            assert_eq!(p.values, values, "{name}");
            assert_eq!(
                c.body.map(<[u8]>::to_vec),
                (!row["body"].is_null()).then(|| hex(&row["body"])),
                "{name}"
            );
            assert_eq!(c.phase, row["phase"].as_str(), "{name}");
            assert_eq!(
                c.checkpoint.map(<[u8]>::to_vec),
                (!row["checkpoint"].is_null()).then(|| hex(&row["checkpoint"])),
                "{name}"
            );
        }
    }
}
