//! The guard's operations over any implementation of the store primitives.
//!
//! The component runs these over the imported store; the host's native
//! benchmark runs the very same functions over its memory store.

use alloc::borrow::ToOwned;
use alloc::format;

use crate::decide::{Verdict, decide};
use crate::limits::{check_fingerprint, check_key, check_policy, check_response};
use crate::model::{
    Claim, Decision, Entry, GuardError, InsertOutcome, Policy, Record, Response, State,
    StoreFailure,
};

/// The atomic store primitives of `wit/store.wit`.
pub trait Primitives {
    fn now_ms(&mut self) -> u64;
    fn insert(
        &mut self,
        key: &str,
        record: &Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreFailure>;
    fn replace(
        &mut self,
        key: &str,
        expected_version: u64,
        record: &Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreFailure>;
}

/// How many times `begin` retries when a concurrent writer changed the
/// record between its insert and its takeover. Each retry sees a newer
/// record, so more than a couple means heavy churn on one key.
const MAX_ATTEMPTS: usize = 4;

pub fn begin(
    store: &mut impl Primitives,
    key: &str,
    fingerprint: &str,
    policy: &Policy,
) -> Result<Decision, GuardError> {
    check_key(key)?;
    check_fingerprint(fingerprint)?;
    check_policy(policy)?;

    for _ in 0..MAX_ATTEMPTS {
        let now = store.now_ms();
        let record = Record {
            fingerprint: fingerprint.to_owned(),
            state: State::Processing,
            lease_until_ms: now.saturating_add(policy.lease_ms),
            expires_at_ms: now.saturating_add(policy.retention_ms),
            response: None,
        };
        let entry = match store
            .insert(key, &record, now)
            .map_err(|e| unavailable("insert", key, e))?
        {
            InsertOutcome::Inserted(version) => {
                return Ok(Decision::Proceed(claim(key, &record, version)));
            }
            InsertOutcome::Existing(entry) => entry,
        };
        match decide(Some(&entry), now, fingerprint) {
            Verdict::Replay => return replay(key, entry),
            Verdict::InFlight { retry_after_ms } => {
                return Ok(Decision::InFlight { retry_after_ms });
            }
            Verdict::Conflict => return Ok(Decision::Conflict),
            // The store called it live but it expired by our clock: insert again.
            Verdict::Claim => {}
            Verdict::TakeOver => {
                let replaced = store
                    .replace(key, entry.version, &record, now)
                    .map_err(|e| unavailable("replace", key, e))?;
                if let Some(version) = replaced {
                    return Ok(Decision::Proceed(claim(key, &record, version)));
                }
                // Someone wrote first (completed, took over, released): look again.
            }
        }
    }
    Ok(Decision::InFlight {
        retry_after_ms: policy.lease_ms.min(100),
    })
}

pub fn complete(
    store: &mut impl Primitives,
    claim: &Claim,
    response: Response,
    policy: &Policy,
) -> Result<(), GuardError> {
    check_policy(policy)?;
    check_response(&response, policy)?;
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    let record = Record {
        fingerprint: claim.fingerprint.clone(),
        state: State::Done,
        lease_until_ms: 0,
        expires_at_ms: now.saturating_add(policy.retention_ms),
        response: Some(response),
    };
    match store
        .replace(&claim.key, claim.fence, &record, now)
        .map_err(|e| unavailable("replace", &claim.key, e))?
    {
        Some(_) => Ok(()),
        None => Err(stale(claim)),
    }
}

pub fn release(store: &mut impl Primitives, claim: &Claim) -> Result<(), GuardError> {
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    // A lease that ends now: the next begin takes over at once, with a higher
    // fence. Deleting instead would restart the versions and let a zombie's
    // old fence match again.
    let record = Record {
        fingerprint: claim.fingerprint.clone(),
        state: State::Processing,
        lease_until_ms: now,
        expires_at_ms: claim.expires_at_ms,
        response: None,
    };
    match store
        .replace(&claim.key, claim.fence, &record, now)
        .map_err(|e| unavailable("replace", &claim.key, e))?
    {
        Some(_) => Ok(()),
        None => Err(stale(claim)),
    }
}

pub fn renew(
    store: &mut impl Primitives,
    claim: &Claim,
    policy: &Policy,
) -> Result<Claim, GuardError> {
    check_policy(policy)?;
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    let record = Record {
        fingerprint: claim.fingerprint.clone(),
        state: State::Processing,
        lease_until_ms: now.saturating_add(policy.lease_ms),
        expires_at_ms: now
            .saturating_add(policy.retention_ms)
            .max(claim.expires_at_ms),
        response: None,
    };
    match store
        .replace(&claim.key, claim.fence, &record, now)
        .map_err(|e| unavailable("replace", &claim.key, e))?
    {
        Some(version) => Ok(self::claim(&claim.key, &record, version)),
        None => Err(stale(claim)),
    }
}

fn claim(key: &str, record: &Record, fence: u64) -> Claim {
    Claim {
        key: key.to_owned(),
        fingerprint: record.fingerprint.clone(),
        fence,
        lease_until_ms: record.lease_until_ms,
        expires_at_ms: record.expires_at_ms,
    }
}

fn replay(key: &str, entry: Entry) -> Result<Decision, GuardError> {
    match entry.record.response {
        Some(response) => Ok(Decision::Replay(response)),
        None => Err(GuardError::Unavailable(format!(
            "record for key {key:?} is done but holds no response"
        ))),
    }
}

/// Once the record a claim wrote has expired, a new record may hold the key
/// with versions counted afresh; refusing here keeps an old fence from ever
/// matching it.
fn check_not_expired(claim: &Claim, now_ms: u64) -> Result<(), GuardError> {
    if now_ms >= claim.expires_at_ms {
        return Err(GuardError::StaleClaim(format!(
            "the claim on key {:?} expired with its record at {} ms",
            claim.key, claim.expires_at_ms
        )));
    }
    Ok(())
}

fn stale(claim: &Claim) -> GuardError {
    GuardError::StaleClaim(format!(
        "fence {} no longer holds key {:?} (taken over, released or expired)",
        claim.fence, claim.key
    ))
}

fn unavailable(op: &str, key: &str, failure: StoreFailure) -> GuardError {
    match failure {
        StoreFailure::Unavailable(why) => {
            GuardError::Unavailable(format!("store {op} of key {key:?} failed: {why}"))
        }
        StoreFailure::Corrupt(why) => {
            GuardError::Unavailable(format!("store {op} of key {key:?}: corrupt record: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::store::Map;

    fn policy() -> Policy {
        Policy {
            lease_ms: 1_000,
            retention_ms: 3_600_000,
            max_response_bytes: 64,
        }
    }

    fn ok(body: &str) -> Response {
        Response {
            status: 200,
            headers: vec![],
            body: body.as_bytes().to_vec(),
        }
    }

    fn proceed(d: Decision) -> Claim {
        match d {
            Decision::Proceed(c) => c,
            other => panic!("expected proceed, got {other:?}"),
        }
    }

    #[test]
    fn claim_complete_replay_conflict() {
        let mut s = Map::default();
        let c = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        assert_eq!(c.fence, 1);
        assert_eq!(
            begin(&mut s, "k", "fp", &policy()).unwrap(),
            Decision::InFlight {
                retry_after_ms: 1_000
            }
        );
        complete(&mut s, &c, ok("paid"), &policy()).unwrap();
        assert_eq!(
            begin(&mut s, "k", "fp", &policy()).unwrap(),
            Decision::Replay(ok("paid"))
        );
        assert_eq!(
            begin(&mut s, "k", "other", &policy()).unwrap(),
            Decision::Conflict
        );
    }

    #[test]
    fn zombie_complete_after_takeover_is_refused() {
        let mut s = Map::default();
        let zombie = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        s.now += 1_000;
        let taker = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        assert!(taker.fence > zombie.fence);
        complete(&mut s, &taker, ok("taker"), &policy()).unwrap();
        let err = complete(&mut s, &zombie, ok("zombie"), &policy()).unwrap_err();
        assert!(matches!(err, GuardError::StaleClaim(_)), "{err}");
        assert_eq!(
            begin(&mut s, "k", "fp", &policy()).unwrap(),
            Decision::Replay(ok("taker"))
        );
    }

    #[test]
    fn release_lets_the_retry_proceed_at_once() {
        let mut s = Map::default();
        let first = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        release(&mut s, &first).unwrap();
        let second = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        assert!(second.fence > first.fence);
        assert!(matches!(
            release(&mut s, &first),
            Err(GuardError::StaleClaim(_))
        ));
    }

    #[test]
    fn renew_extends_the_lease_and_raises_the_fence() {
        let mut s = Map::default();
        let c = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        s.now += 900;
        let renewed = renew(&mut s, &c, &policy()).unwrap();
        assert_eq!(renewed.lease_until_ms, 1_900);
        s.now += 500; // past the first lease, inside the renewed one
        assert!(matches!(
            begin(&mut s, "k", "fp", &policy()).unwrap(),
            Decision::InFlight { .. }
        ));
        assert!(matches!(
            complete(&mut s, &c, ok("old"), &policy()),
            Err(GuardError::StaleClaim(_))
        ));
        complete(&mut s, &renewed, ok("new"), &policy()).unwrap();
    }

    #[test]
    fn expiry_makes_the_key_new_and_refuses_old_claims() {
        let mut s = Map::default();
        let c = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        s.now += 3_600_000;
        assert!(matches!(
            complete(&mut s, &c, ok("late"), &policy()),
            Err(GuardError::StaleClaim(_))
        ));
        let again = proceed(begin(&mut s, "k", "other-fp", &policy()).unwrap());
        assert!(again.fence > c.fence);
    }

    #[test]
    fn bad_input_writes_nothing() {
        let mut s = Map::default();
        assert!(matches!(
            begin(&mut s, "", "fp", &policy()),
            Err(GuardError::InvalidInput(_))
        ));
        assert!(matches!(
            begin(&mut s, &"k".repeat(256), "fp", &policy()),
            Err(GuardError::InvalidInput(_))
        ));
        assert!(matches!(
            begin(&mut s, "k", "bad fp", &policy()),
            Err(GuardError::InvalidInput(_))
        ));
        assert_eq!(s.writes, 0);
        let c = proceed(begin(&mut s, "k", "fp", &policy()).unwrap());
        let err = complete(&mut s, &c, ok(&"x".repeat(65)), &policy()).unwrap_err();
        assert!(
            err.to_string().contains("65 bytes") && err.to_string().contains("64"),
            "{err}"
        );
        assert_eq!(s.writes, 1, "an oversized response is not stored");
    }
}
