//! Input validation: every limit the contract documents, checked before
//! anything is stored or run, with an error that names the limit.

use alloc::format;
use alloc::string::String;

use crate::model::{Checkpoint, Claim, GuardError, Policy, ResponseHandle};

/// Keys are 1 to 255 bytes: long enough for a UUID with a client scope,
/// short enough to index in every store.
pub const MAX_KEY_BYTES: usize = 255;
/// Fingerprints are 1 to 128 bytes; a canonical one is 71 (`sha256:` + 64 hex).
pub const MAX_FINGERPRINT_BYTES: usize = 128;

pub fn check_key(key: &str) -> Result<(), GuardError> {
    check_name("key", "keys", key, MAX_KEY_BYTES)
}

/// A name-like text (a key, a checkpoint's phase): 1 to `max` bytes of UTF-8
/// without control characters. `what` and `plural` name it in the error.
fn check_name(what: &str, plural: &str, text: &str, max: usize) -> Result<(), GuardError> {
    if text.is_empty() {
        return Err(invalid(format!(
            "{what} is empty; {plural} are 1 to {max} bytes"
        )));
    }
    if text.len() > max {
        return Err(invalid(format!(
            "{what} is {} bytes; {plural} are 1 to {max} bytes",
            text.len()
        )));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "{what} contains the control character {c:?}; {plural} are UTF-8 without control characters"
        )));
    }
    Ok(())
}

pub fn check_fingerprint(fingerprint: &str) -> Result<(), GuardError> {
    if fingerprint.is_empty() {
        return Err(invalid(
            "fingerprint is empty; fingerprints are 1 to 128 bytes of visible ASCII",
        ));
    }
    if fingerprint.len() > MAX_FINGERPRINT_BYTES {
        return Err(invalid(format!(
            "fingerprint is {} bytes; the limit is {MAX_FINGERPRINT_BYTES}",
            fingerprint.len()
        )));
    }
    if let Some(b) = fingerprint.bytes().find(|b| !b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "fingerprint contains byte 0x{b:02x}; fingerprints are visible ASCII ('!' to '~')"
        )));
    }
    Ok(())
}

pub fn check_policy(policy: &Policy) -> Result<(), GuardError> {
    if policy.lease_ms == 0 {
        return Err(invalid("lease is 0 ms; it must be at least 1 ms"));
    }
    if policy.lease_ms >= policy.retention_ms {
        return Err(invalid(format!(
            "lease ({} ms) must be shorter than retention ({} ms)",
            policy.lease_ms, policy.retention_ms
        )));
    }
    Ok(())
}

/// A claim's holder is never 0: 0 marks the records of 0.1 hosts, and no
/// `begin` makes a claim with it.
pub fn check_claim(claim: &Claim) -> Result<(), GuardError> {
    if claim.holder == 0 {
        return Err(invalid(format!(
            "the claim on key {:?} has holder 0; a claim's holder is never 0 (pass claims back as begin returned them)",
            claim.key
        )));
    }
    Ok(())
}

/// A checkpoint's phase is 1 to 64 bytes: a step's name, not its data.
pub const MAX_PHASE_BYTES: usize = 64;

pub fn check_checkpoint(checkpoint: &Checkpoint, policy: &Policy) -> Result<(), GuardError> {
    check_name(
        "checkpoint phase",
        "phases",
        &checkpoint.phase,
        MAX_PHASE_BYTES,
    )?;
    if checkpoint.data.len() > policy.max_response_bytes as usize {
        return Err(invalid(format!(
            "checkpoint data is {} bytes; the limit is {} bytes (max-response-bytes)",
            checkpoint.data.len(),
            policy.max_response_bytes
        )));
    }
    Ok(())
}

pub fn check_response(response: &impl ResponseHandle, policy: &Policy) -> Result<(), GuardError> {
    let status = response.status();
    if !(100..=999).contains(&status) {
        return Err(invalid(format!(
            "response status {status} is outside 100 to 999"
        )));
    }
    let size = response.size();
    if size > u64::from(policy.max_response_bytes) {
        return Err(invalid(format!(
            "response is {size} bytes; the limit is {} bytes",
            policy.max_response_bytes
        )));
    }
    Ok(())
}

fn invalid(why: impl Into<String>) -> GuardError {
    GuardError::InvalidInput(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Response;

    #[test]
    fn keys() {
        assert!(check_key("order-1").is_ok());
        assert!(check_key("a key with \"quotes\": and spaces").is_ok());
        assert!(check_key(&"k".repeat(255)).is_ok());
        let err = check_key("").unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
        let err = check_key(&"k".repeat(256)).unwrap_err().to_string();
        assert!(err.contains("256 bytes") && err.contains("255"), "{err}");
        assert!(check_key("a\nb").is_err());
    }

    #[test]
    fn fingerprints() {
        assert!(check_fingerprint("sku=A&qty=1").is_ok());
        assert!(check_fingerprint("").is_err());
        assert!(check_fingerprint("has space").is_err());
        assert!(check_fingerprint("é").is_err());
        let err = check_fingerprint(&"f".repeat(129)).unwrap_err().to_string();
        assert!(err.contains("128"), "{err}");
    }

    #[test]
    fn policies() {
        assert!(check_policy(&Policy::default()).is_ok());
        let zero = Policy {
            lease_ms: 0,
            ..Policy::default()
        };
        assert!(check_policy(&zero).is_err());
        let long = Policy {
            lease_ms: 10,
            retention_ms: 10,
            ..Policy::default()
        };
        assert!(
            check_policy(&long)
                .unwrap_err()
                .to_string()
                .contains("shorter")
        );
    }

    #[test]
    fn responses() {
        let policy = Policy {
            max_response_bytes: 10,
            ..Policy::default()
        };
        let ok = Response {
            status: 200,
            headers: vec![("a".into(), b"b".to_vec())],
            body: vec![0; 8],
        };
        assert!(check_response(&ok, &policy).is_ok());
        let big = Response {
            body: vec![0; 9],
            ..ok.clone()
        };
        let err = check_response(&big, &policy).unwrap_err().to_string();
        assert!(
            err.contains("11 bytes") && err.contains("10 bytes"),
            "{err}"
        );
        let bad = Response { status: 42, ..ok };
        assert!(check_response(&bad, &policy).is_err());
    }
}
