//! A record as the DynamoDB item stored for it, and back
//! (`wit/store-layout/README.md`, DynamoDB).

use super::NAME;
use crate::store::codec::corrupt;
use crate::store::{Entry, Record, Result, State};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_guest::model::{Checkpoint, Response};
use std::collections::HashMap;

/// The attributes of an item, as the SDK hands them.
pub(super) type Item = HashMap<String, AttributeValue>;

/// The partition key: the idempotency key, a string.
pub(super) const KEY: &str = "key";
pub(super) const VERSION: &str = "version";
pub(super) const FINGERPRINT: &str = "fingerprint";
pub(super) const STATE: &str = "state";
pub(super) const LEASE_UNTIL_MS: &str = "lease_until_ms";
pub(super) const EXPIRES_AT_MS: &str = "expires_at_ms";
/// DynamoDB's TTL attribute: when DynamoDB may delete the item, in seconds.
pub(super) const TTL: &str = "ttl";
pub(super) const HOLDER: &str = "holder";
pub(super) const STATUS: &str = "status";
pub(super) const HEADER_NAMES: &str = "header_names";
pub(super) const HEADER_VALUES: &str = "header_values";
pub(super) const BODY: &str = "body";
pub(super) const PHASE: &str = "phase";
pub(super) const CHECKPOINT: &str = "checkpoint";

/// The attributes a record may lack (no response, no checkpoint), which a
/// claim over an expired item must remove.
pub(super) const OPTIONAL: [&str; 6] =
    [STATUS, HEADER_NAMES, HEADER_VALUES, BODY, PHASE, CHECKPOINT];

/// DynamoDB deletes an item by its TTL this long after the record expired
/// (in seconds): its deleter runs on AWS's clock, which hosts know only to
/// within their error bound, so a record a guard still sees as live is never
/// deleted under it.
pub(super) const TTL_GRACE_S: u64 = 60;

/// The TTL attribute for a record expiring at `expires_at_ms`.
pub(super) fn ttl_s(expires_at_ms: u64) -> u64 {
    expires_at_ms.div_ceil(1_000) + TTL_GRACE_S
}

pub(super) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The record's attributes without `key` and `version`: a claim sets the
/// version by an update expression, a completion writes it whole.
pub(super) fn record_attributes(record: &Record) -> Item {
    let mut item = Item::with_capacity(13);
    item.insert(
        FINGERPRINT.into(),
        AttributeValue::S(record.fingerprint.clone()),
    );
    item.insert(
        STATE.into(),
        AttributeValue::S(record.state.as_str().into()),
    );
    item.insert(LEASE_UNTIL_MS.into(), n(record.lease_until_ms));
    item.insert(EXPIRES_AT_MS.into(), n(record.expires_at_ms));
    item.insert(TTL.into(), n(ttl_s(record.expires_at_ms)));
    item.insert(HOLDER.into(), n(record.holder));
    if let Some(response) = &record.response {
        item.insert(STATUS.into(), n(u64::from(response.status)));
        let (names, values) = response
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    AttributeValue::S(name.clone()),
                    AttributeValue::B(Blob::new(value.clone())),
                )
            })
            .unzip();
        item.insert(HEADER_NAMES.into(), AttributeValue::L(names));
        item.insert(HEADER_VALUES.into(), AttributeValue::L(values));
        item.insert(
            BODY.into(),
            AttributeValue::B(Blob::new(response.body.clone())),
        );
    }
    if let Some(checkpoint) = &record.checkpoint {
        item.insert(PHASE.into(), AttributeValue::S(checkpoint.phase.clone()));
        item.insert(
            CHECKPOINT.into(),
            AttributeValue::B(Blob::new(checkpoint.data.clone())),
        );
    }
    item
}

/// The whole item for `record` at `version` under `key`.
pub(super) fn encode(key: &str, version: u64, record: &Record) -> Item {
    let mut item = record_attributes(record);
    item.insert(KEY.into(), AttributeValue::S(key.into()));
    item.insert(VERSION.into(), n(version));
    item
}

/// The record an item holds, whatever its expiry; corrupt (naming `key`)
/// when an attribute is missing, of another type, or out of range.
pub(super) fn decode(key: &str, item: &Item) -> Result<Entry> {
    read(item).map_err(|reason| corrupt(NAME, key, reason))
}

fn read(item: &Item) -> Result<Entry, String> {
    let state = string(item, STATE)?;
    let state =
        State::parse(state).ok_or_else(|| format!("state {state:?} is not processing or done"))?;
    let response = match (
        item.get(STATUS),
        item.get(HEADER_NAMES),
        item.get(HEADER_VALUES),
        item.get(BODY),
    ) {
        (None, None, None, None) => None,
        (Some(_), Some(_), Some(_), Some(_)) => Some(response(item)?),
        _ => return Err(
            "the response's status, header_names, header_values and body are only partly present"
                .into(),
        ),
    };
    let checkpoint = match (item.get(PHASE), item.get(CHECKPOINT)) {
        (None, None) => None,
        (Some(_), Some(_)) => Some(Checkpoint {
            phase: string(item, PHASE)?.to_owned(),
            data: binary(item.get(CHECKPOINT), CHECKPOINT)?.to_vec(),
        }),
        _ => return Err("the checkpoint's phase and data are only partly present".into()),
    };
    Ok(Entry {
        version: number(item, VERSION)?,
        record: Record {
            fingerprint: string(item, FINGERPRINT)?.to_owned(),
            state,
            holder: number(item, HOLDER)?,
            lease_until_ms: number(item, LEASE_UNTIL_MS)?,
            expires_at_ms: number(item, EXPIRES_AT_MS)?,
            response,
            checkpoint,
        },
    })
}

fn response(item: &Item) -> Result<Response, String> {
    let status = number(item, STATUS)?;
    let status = u16::try_from(status).map_err(|_| format!("status {status} is past 65535"))?;
    let names = list(item, HEADER_NAMES)?;
    let values = list(item, HEADER_VALUES)?;
    if names.len() != values.len() {
        return Err(format!(
            "{} header names but {} header values",
            names.len(),
            values.len()
        ));
    }
    let headers = names
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let name = name
                .as_s()
                .map_err(|_| "a header name is not a string".to_owned())?;
            Ok((name.clone(), binary(Some(value), HEADER_VALUES)?.to_vec()))
        })
        .collect::<Result<_, String>>()?;
    Ok(Response {
        status,
        headers,
        body: binary(item.get(BODY), BODY)?.to_vec(),
    })
}

fn string<'i>(item: &'i Item, name: &str) -> Result<&'i str, String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Ok(s),
        Some(_) => Err(format!("{name} is not a string")),
        None => Err(format!("{name} is missing")),
    }
}

/// A u64 number attribute: decimal digits only (DynamoDB keeps numbers as
/// decimals of up to 38 digits, so every u64 round-trips exactly).
pub(super) fn number(item: &Item, name: &str) -> Result<u64, String> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text
            .parse::<u64>()
            .map_err(|_| format!("{name} {text} is not a whole number from 0 to 2^64 - 1")),
        Some(_) => Err(format!("{name} is not a number")),
        None => Err(format!("{name} is missing")),
    }
}

fn list<'i>(item: &'i Item, name: &str) -> Result<&'i [AttributeValue], String> {
    match item.get(name) {
        Some(AttributeValue::L(list)) => Ok(list),
        _ => Err(format!("{name} is not a list")),
    }
}

fn binary<'i>(value: Option<&'i AttributeValue>, name: &str) -> Result<&'i [u8], String> {
    match value {
        Some(AttributeValue::B(blob)) => Ok(blob.as_ref()),
        _ => Err(format!("{name} is not binary")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use crate::store::codec::vectors::{file, hex, record, u64_of};
    use serde_json::Value as Json;

    /// An item of the vectors' DynamoDB JSON (`B` values in hex).
    fn item_of(json: &Json) -> Item {
        json.as_object()
            .unwrap()
            .iter()
            .map(|(name, value)| (name.clone(), attribute(value)))
            .collect()
    }

    fn attribute(json: &Json) -> AttributeValue {
        let (kind, value) = json.as_object().unwrap().iter().next().unwrap();
        match kind.as_str() {
            "S" => AttributeValue::S(value.as_str().unwrap().into()),
            "N" => AttributeValue::N(value.as_str().unwrap().into()),
            "B" => AttributeValue::B(Blob::new(hex(value))),
            "L" => AttributeValue::L(value.as_array().unwrap().iter().map(attribute).collect()),
            other => panic!("no such attribute type in the vectors: {other}"),
        }
    }

    /// `wit/store-layout/vectors.json`: the item every DynamoDB store writes
    /// for each record, and reads back as it.
    #[test]
    fn records_become_the_layouts_items_and_back() {
        for v in file()["records"].as_array().unwrap() {
            let (name, version) = (&v["name"], u64_of(&v["version"]));
            let record = record(&v["record"]);
            let mut expected = item_of(&v["dynamodb"]);
            expected.insert(KEY.into(), AttributeValue::S("k".into()));
            assert_eq!(encode("k", version, &record), expected, "{name}");
            let entry = decode("k", &expected).unwrap();
            assert_eq!((entry.version, entry.record), (version, record), "{name}");
        }
    }

    #[test]
    fn corrupt_items_name_the_key() {
        let corrupt = file()["corrupt_dynamodb"].as_array().unwrap().clone();
        assert!(!corrupt.is_empty());
        for v in corrupt {
            match decode("order-9", &item_of(&v["dynamodb"])) {
                Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "order-9", "{}", v["name"]),
                other => panic!("{}: read as {other:?}", v["name"]),
            }
        }
    }
}
