//! The `limits` fuzz target's check.

use super::input::Input;
use crate::limits::{
    MAX_FINGERPRINT_BYTES, MAX_KEY_BYTES, check_fingerprint, check_key, check_policy,
    check_response,
};
use crate::model::GuardError;

/// Each check accepts exactly the inputs the contract documents, and every
/// refusal is `invalid-input` naming the limit.
pub fn check_limits(data: &[u8]) {
    let mut input = Input(data);
    let text = input.string(300);
    let key_ok =
        !text.is_empty() && text.len() <= MAX_KEY_BYTES && !text.chars().any(char::is_control);
    check_text_verdict("key", &text, key_ok, check_key(&text));
    let fp_ok = !text.is_empty()
        && text.len() <= MAX_FINGERPRINT_BYTES
        && text.bytes().all(|b| (b'!'..=b'~').contains(&b));
    check_text_verdict("fingerprint", &text, fp_ok, check_fingerprint(&text));
    let policy = input.policy();
    let policy_ok = policy.lease_ms >= 1 && policy.lease_ms < policy.retention_ms;
    assert_eq!(check_policy(&policy).is_ok(), policy_ok, "{policy:?}");
    let response = input.response();
    let size = response.body.len()
        + response
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>();
    let response_ok =
        (100..=999).contains(&response.status) && size <= policy.max_response_bytes as usize;
    match check_response(&response, &policy) {
        Ok(()) => assert!(response_ok),
        Err(GuardError::InvalidInput(why)) => {
            assert!(!response_ok);
            let names_limit = why.contains(&format!("{size} bytes"))
                || why.contains(&format!("status {}", response.status));
            assert!(names_limit, "{why}");
        }
        Err(e) => panic!("{e}"),
    }
}

/// A check of `text` as a `what` accepts it exactly when `ok`, and a refusal
/// is `invalid-input` naming `what`.
fn check_text_verdict(what: &str, text: &str, ok: bool, verdict: Result<(), GuardError>) {
    match verdict {
        Ok(()) => assert!(ok, "{what} {text:?} accepted"),
        Err(GuardError::InvalidInput(why)) => {
            assert!(!ok, "{what} {text:?} refused: {why}");
            assert!(why.contains(what), "{why}");
        }
        Err(e) => panic!("{e}"),
    }
}
