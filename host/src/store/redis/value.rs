//! A record as the string stored for it, and back.

use super::NAME;
use crate::store::codec::{self, Reader, corrupt};
use crate::store::{Entry, Record, Result, State};
use idem_guest::model::{Checkpoint, Response};
use std::io::Write as _;

/// The header `"{version} {expires_at_ms}\n"` fits in this many bytes (two u64s).
pub(super) const HEADER_MAX: usize = 42;

/// A record as the string stored for it: the header
/// `"{version} {expires_at_ms}\n"` (ASCII, read by the scripts), then
/// `lease_until_ms` (u64), the state (u8: 0 processing, 1 done), the
/// fingerprint (u32 length, UTF-8), and the response: a u8 0 for none, or 1,
/// the status (u16), the headers (the blob of [`codec`]) and the body (u32
/// length, bytes); then (since contract 0.2) the holder (u64) and the
/// checkpoint: a u8 0 for none, or 1, the phase (u32 length, UTF-8) and the
/// data (u32 length, bytes). Big-endian.
///
/// A value that ends right after the response was written by a 0.1 host: it
/// reads as holder 0 with no checkpoint, and is written back in this layout.
pub(super) fn encode(version: u64, record: &Record) -> Vec<u8> {
    let response_len = record
        .response
        .as_ref()
        .map_or(0, |r| 2 + codec::headers_len(&r.headers) + 4 + r.body.len());
    let checkpoint_len = record
        .checkpoint
        .as_ref()
        .map_or(0, |c| 8 + c.phase.len() + c.data.len());
    let mut out = Vec::with_capacity(
        HEADER_MAX + 23 + record.fingerprint.len() + response_len + checkpoint_len,
    );
    // Written in place: no intermediate String on every claim.
    let _ = writeln!(out, "{version} {}", record.expires_at_ms);
    out.extend_from_slice(&record.lease_until_ms.to_be_bytes());
    out.push(match record.state {
        State::Processing => 0,
        State::Done => 1,
    });
    codec::put(&mut out, record.fingerprint.as_bytes());
    match &record.response {
        None => out.push(0),
        Some(r) => {
            out.push(1);
            out.extend_from_slice(&r.status.to_be_bytes());
            codec::put_headers(&mut out, &r.headers);
            codec::put(&mut out, &r.body);
        }
    }
    out.extend_from_slice(&record.holder.to_be_bytes());
    match &record.checkpoint {
        None => out.push(0),
        Some(c) => {
            out.push(1);
            codec::put(&mut out, c.phase.as_bytes());
            codec::put(&mut out, &c.data);
        }
    }
    out
}

/// The length of the header, and the version and expiry it holds.
pub(super) fn header(value: &[u8]) -> Option<(usize, u64, u64)> {
    let end = value.iter().take(HEADER_MAX).position(|&b| b == b'\n')?;
    let text = std::str::from_utf8(&value[..end]).ok()?;
    let (version, expires) = text.split_once(' ')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(version) || !digits(expires) {
        return None;
    }
    Some((end + 1, version.parse().ok()?, expires.parse().ok()?))
}

/// The inverse of [`encode`]; `Corrupt` naming the key and what is wrong.
pub(super) fn decode(key: &str, value: &[u8]) -> Result<Entry> {
    let bad = |what: String| corrupt(NAME, key, format!("the stored record {what}"));
    let (start, version, expires_at_ms) =
        header(value).ok_or_else(|| bad("has no \"{version} {expires_at_ms}\" header".into()))?;
    let record = decode_after_header(&mut Reader::new(&value[start..]), expires_at_ms);
    Ok(Entry {
        record: record.map_err(bad)?,
        version,
    })
}

fn decode_after_header(r: &mut Reader<'_>, expires_at_ms: u64) -> Result<Record, String> {
    let lease_until_ms = r.u64("the lease")?;
    let state = match r.u8("the state")? {
        0 => State::Processing,
        1 => State::Done,
        other => return Err(format!("has an unknown state {other}")),
    };
    let fingerprint = r.text("the fingerprint")?;
    let response = match r.u8("the response flag")? {
        0 => None,
        1 => Some(Response {
            status: r.u16("the status")?,
            headers: r.headers()?,
            body: r.bytes("the body")?.to_vec(),
        }),
        other => return Err(format!("has an unknown response flag {other}")),
    };
    // A 0.1 host's value ends here.
    let (holder, checkpoint) = if r.is_empty() {
        (0, None)
    } else {
        let holder = r.u64("the holder")?;
        let checkpoint = match r.u8("the checkpoint flag")? {
            0 => None,
            1 => Some(Checkpoint {
                phase: r.text("the checkpoint's phase")?,
                data: r.bytes("the checkpoint's data")?.to_vec(),
            }),
            other => return Err(format!("has an unknown checkpoint flag {other}")),
        };
        (holder, checkpoint)
    };
    r.end()?;
    Ok(Record {
        fingerprint,
        state,
        holder,
        lease_until_ms,
        expires_at_ms,
        response,
        checkpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    /// `wit/store-layout/vectors.json`: what every store in every language
    /// writes for these records, byte for byte.
    mod vectors {
        use super::*;
        use crate::store::codec::vectors::{file, hex, record, u64_of};

        #[test]
        fn records_encode_and_decode_as_the_layout_says() {
            let file = file();
            let records = file["records"].as_array().unwrap();
            assert!(records.len() >= 5);
            for v in records {
                let (name, version) = (&v["name"], u64_of(&v["version"]));
                let expected = record(&v["record"]);
                assert_eq!(encode(version, &expected), hex(&v["redis"]), "{name}");
                let entry = decode("k", &hex(&v["redis"])).unwrap();
                assert_eq!((entry.version, entry.record), (version, expected), "{name}");
            }
        }

        #[test]
        fn values_of_0_1_hosts_read_as_holder_0_without_a_checkpoint() {
            for v in file()["legacy_redis"].as_array().unwrap() {
                let entry = decode("k", &hex(&v["redis"])).unwrap();
                assert_eq!(entry.version, u64_of(&v["version"]), "{}", v["name"]);
                assert_eq!(entry.record, record(&v["record"]), "{}", v["name"]);
            }
        }

        #[test]
        fn corrupt_values_are_refused() {
            for v in file()["corrupt_redis"].as_array().unwrap() {
                let err = decode("k", &hex(&v["redis"])).unwrap_err();
                assert!(
                    matches!(err, StoreError::Corrupt { .. }),
                    "{}: {err:?}",
                    v["name"]
                );
            }
        }
    }

    fn sample(response: bool) -> Record {
        Record {
            fingerprint: "sha256:ü".into(),
            state: if response {
                State::Done
            } else {
                State::Processing
            },
            holder: u64::MAX - 1,
            checkpoint: (!response).then(|| Checkpoint {
                phase: "charged".into(),
                data: vec![0, b'\n', 255],
            }),
            lease_until_ms: 1_792_382_430_000,
            expires_at_ms: u64::MAX,
            response: response.then(|| Response {
                status: 201,
                headers: vec![
                    ("a".to_owned(), vec![0, 255]),
                    (String::new(), vec![]),
                    ("ü".to_owned(), b"x".to_vec()),
                ],
                body: b"\n0 0\n".to_vec(),
            }),
        }
    }

    #[test]
    fn records_round_trip() {
        for response in [false, true] {
            let record = sample(response);
            let value = encode(7, &record);
            assert!(value.starts_with(b"7 18446744073709551615\n"));
            assert_eq!(decode("k", &value).unwrap(), Entry { record, version: 7 });
        }
    }

    /// Values as 0.1 hosts wrote them (ending after the response): whatever
    /// the code becomes, they must still decode, as holder 0 with no
    /// checkpoint.
    #[test]
    fn values_of_0_1_hosts_still_decode() {
        let done = b"7 90000\n\0\0\0\0\0\0\x03\xe8\x01\0\0\0\x05fp-\xc3\xbc\x01\0\xc9\
            \0\0\0\x02\0\0\0\x0ccontent-type\0\0\0\ntext/plain\0\0\0\x01x\0\0\0\x02\0\xff\
            \0\0\0\x04paid";
        let record = Record {
            fingerprint: "fp-ü".into(),
            state: State::Done,
            holder: 0,
            lease_until_ms: 1_000,
            expires_at_ms: 90_000,
            response: Some(Response {
                status: 201,
                headers: vec![
                    ("content-type".to_owned(), b"text/plain".to_vec()),
                    ("x".to_owned(), vec![0, 255]),
                ],
                body: b"paid".to_vec(),
            }),
            checkpoint: None,
        };
        let processing = b"1 18446744073709551615\n\0\0\0\0\0\0\x01\xf4\0\0\0\0\x02fp\0";
        let claim = Record {
            fingerprint: "fp".into(),
            state: State::Processing,
            holder: 0,
            lease_until_ms: 500,
            expires_at_ms: u64::MAX,
            response: None,
            checkpoint: None,
        };
        for (bytes, version, record) in [(&done[..], 7, record), (&processing[..], 1, claim)] {
            assert_eq!(decode("k", bytes).unwrap(), Entry { record, version });
        }
    }

    /// Values as this layout (contract 0.2) writes them: a record stored
    /// before must still decode, and be written again byte for byte.
    #[test]
    fn stored_bytes_still_decode() {
        let processing = b"2 18446744073709551615\n\0\0\0\0\0\0\x01\xf4\0\0\0\0\x02fp\0\
            \x01\x02\x03\x04\x05\x06\x07\x08\x01\0\0\0\x07charged\0\0\0\x02\0\xff";
        let claim = Record {
            fingerprint: "fp".into(),
            state: State::Processing,
            holder: 0x0102_0304_0506_0708,
            lease_until_ms: 500,
            expires_at_ms: u64::MAX,
            response: None,
            checkpoint: Some(Checkpoint {
                phase: "charged".into(),
                data: vec![0, 255],
            }),
        };
        let done = b"3 90000\n\0\0\0\0\0\0\x03\xe8\x01\0\0\0\x02fp\x01\0\xc8\0\0\0\0\0\0\0\x02ok\
            \0\0\0\0\0\0\0\x09\0";
        let record = Record {
            fingerprint: "fp".into(),
            state: State::Done,
            holder: 9,
            lease_until_ms: 1_000,
            expires_at_ms: 90_000,
            response: Some(Response {
                status: 200,
                headers: vec![],
                body: b"ok".to_vec(),
            }),
            checkpoint: None,
        };
        for (bytes, version, record) in [(&processing[..], 2, claim), (&done[..], 3, record)] {
            assert_eq!(encode(version, &record), bytes);
            assert_eq!(decode("k", bytes).unwrap(), Entry { record, version });
        }
    }

    #[test]
    fn bad_values_are_corrupt_naming_the_key() {
        let value = encode(3, &sample(true));
        let mut trailing = encode(3, &sample(false));
        trailing.push(0);
        let mut bad_checkpoint = encode(3, &sample(true));
        *bad_checkpoint.last_mut().unwrap() = 7;
        let mut bad_state = encode(3, &sample(false));
        let at = header(&bad_state).unwrap().0 + 8;
        bad_state[at] = 9;
        for (bytes, says) in [
            (&b"garbage"[..], "header"),
            (b"1 x\n", "header"),
            (b"-1 5\n", "header"),
            (&value[..value.len() - 10], "ends inside the body"),
            (&bad_state, "unknown state 9"),
            (&trailing[..trailing.len()], "after its end"),
            (&bad_checkpoint, "unknown checkpoint flag 7"),
            (&value[..value.len() - 3], "ends inside the holder"),
        ] {
            match decode("the-key", bytes) {
                Err(StoreError::Corrupt { key, reason, .. }) => {
                    assert_eq!(key, "the-key");
                    assert!(reason.contains(says), "{reason:?} should say {says:?}");
                }
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
            }
        }
    }
}
