//! The guard's operations over any implementation of the store primitives.
//!
//! The component runs these over the imported store; the host's native
//! benchmark runs the very same functions over its memory store.

use alloc::borrow::ToOwned;
use alloc::format;

use crate::decide::{Verdict, decide};
use crate::limits::{
    check_checkpoint, check_claim, check_fingerprint, check_key, check_policy, check_response,
};
use crate::model::{
    Checkpoint, Claim, Decision, Entry, GuardError, InsertOutcome, Policy, Record, ResponseHandle,
    State, StoreFailure,
};

/// The atomic store primitives of `wit/store.wit`, with the clock and the
/// randomness the guard imports beside them.
pub trait Primitives {
    /// How a response is held: a handle to the host's in the component,
    /// the response itself natively.
    type Response: ResponseHandle;
    fn now_ms(&mut self) -> u64;
    fn random_u64(&mut self) -> u64;
    fn get(
        &mut self,
        key: &str,
        now_ms: u64,
    ) -> Result<Option<Entry<Self::Response>>, StoreFailure>;
    fn insert(
        &mut self,
        key: &str,
        record: &Record<Self::Response>,
        now_ms: u64,
    ) -> Result<InsertOutcome<Self::Response>, StoreFailure>;
    /// Whether the record at `expected_version` became `expected_version + 1`.
    fn replace(
        &mut self,
        key: &str,
        expected_version: u64,
        record: &Record<Self::Response>,
        now_ms: u64,
    ) -> Result<bool, StoreFailure>;
}

/// How many times `begin` retries when a concurrent writer changed the
/// record between its insert and its takeover, and how many writes a
/// holder's call makes at most. Each retry sees a newer record, so more than
/// a couple means heavy churn on one key.
const MAX_ATTEMPTS: usize = 4;

pub fn begin<P: Primitives>(
    store: &mut P,
    key: &str,
    fingerprint: &str,
    policy: &Policy,
) -> Result<Decision<P::Response>, GuardError> {
    check_key(key)?;
    check_fingerprint(fingerprint)?;
    check_policy(policy)?;

    // 0 marks records written by 0.1 hosts, which had no holder.
    let holder = store.random_u64().max(1);
    for _ in 0..MAX_ATTEMPTS {
        let now = store.now_ms();
        let mut record = Record {
            fingerprint: fingerprint.to_owned(),
            state: State::Processing,
            holder,
            lease_until_ms: now.saturating_add(policy.lease_ms),
            expires_at_ms: now.saturating_add(policy.retention_ms),
            response: None,
            checkpoint: None,
        };
        let entry = match store
            .insert(key, &record, now)
            .map_err(|e| unavailable("insert", key, e))?
        {
            InsertOutcome::Inserted(version) => {
                return Ok(Decision::Proceed(claim(key, record, version)));
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
                // The recovery point survives the takeover.
                record.checkpoint = entry.record.checkpoint;
                let replaced = store
                    .replace(key, entry.version, &record, now)
                    .map_err(|e| unavailable("replace", key, e))?;
                if let Some(version) = written_at(replaced, entry.version) {
                    return Ok(Decision::Proceed(claim(key, record, version)));
                }
                // Someone wrote first (completed, took over, released): look again.
            }
        }
    }
    Ok(Decision::InFlight {
        retry_after_ms: policy.lease_ms.min(100),
    })
}

pub fn complete<P: Primitives>(
    store: &mut P,
    claim: &Claim,
    response: P::Response,
    policy: &Policy,
) -> Result<(), GuardError> {
    check_claim(claim)?;
    check_response(&response, policy)?;
    check_policy(policy)?;
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    let record = Record {
        state: State::Done,
        lease_until_ms: 0,
        expires_at_ms: now.saturating_add(policy.retention_ms),
        response: Some(response),
        ..held(claim, None)
    };
    write_as_holder(store, claim, record, now, OnMoved::KeepOurs).map(|_| ())
}

pub fn release<P: Primitives>(store: &mut P, claim: &Claim) -> Result<(), GuardError> {
    check_claim(claim)?;
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    // A lease that ends now: the next begin takes over at once, with a higher
    // fence. Deleting instead would restart the versions and let a zombie's
    // old fence match again.
    let record = Record {
        lease_until_ms: now,
        ..held(claim, claim.checkpoint.clone())
    };
    write_as_holder(store, claim, record, now, OnMoved::KeepStoredCheckpoint).map(|_| ())
}

pub fn renew<P: Primitives>(
    store: &mut P,
    claim: &Claim,
    policy: &Policy,
) -> Result<Claim, GuardError> {
    check_claim(claim)?;
    check_policy(policy)?;
    extend(
        store,
        claim,
        claim.checkpoint.clone(),
        policy,
        OnMoved::KeepStoredCheckpoint,
    )
}

pub fn checkpoint<P: Primitives>(
    store: &mut P,
    claim: &Claim,
    checkpoint: Checkpoint,
    policy: &Policy,
) -> Result<Claim, GuardError> {
    check_claim(claim)?;
    check_checkpoint(&checkpoint, policy)?;
    check_policy(policy)?;
    extend(store, claim, Some(checkpoint), policy, OnMoved::KeepOurs)
}

/// `begin` with the canonical fingerprint of the request's parts.
pub fn begin_request<P: Primitives>(
    store: &mut P,
    key: &str,
    method: &str,
    path: &str,
    headers: &[(alloc::string::String, alloc::vec::Vec<u8>)],
    body: &[u8],
    policy: &Policy,
) -> Result<Decision<P::Response>, GuardError> {
    let fingerprint = crate::fingerprint::fingerprint(method, path, headers, body);
    begin(store, key, &fingerprint, policy)
}

/// Renew and checkpoint: the lease from now, the record keeping `checkpoint`.
fn extend<P: Primitives>(
    store: &mut P,
    claim: &Claim,
    checkpoint: Option<Checkpoint>,
    policy: &Policy,
    on_moved: OnMoved,
) -> Result<Claim, GuardError> {
    let now = store.now_ms();
    check_not_expired(claim, now)?;
    let record = Record {
        lease_until_ms: now.saturating_add(policy.lease_ms),
        expires_at_ms: now
            .saturating_add(policy.retention_ms)
            .max(claim.expires_at_ms),
        ..held(claim, checkpoint)
    };
    let (version, record) = write_as_holder(store, claim, record, now, on_moved)?;
    Ok(self::claim(&claim.key, record, version))
}

/// The record as `claim` wrote it, processing under the claim's lease and
/// expiry with no response, keeping `checkpoint` (given, so that no write
/// clones a checkpoint it then drops). Each holder's write changes some of
/// these fields and keeps the rest.
fn held<R>(claim: &Claim, checkpoint: Option<Checkpoint>) -> Record<R> {
    Record {
        fingerprint: claim.fingerprint.clone(),
        state: State::Processing,
        holder: claim.holder,
        lease_until_ms: claim.lease_until_ms,
        expires_at_ms: claim.expires_at_ms,
        response: None,
        checkpoint,
    }
}

/// Which checkpoint a holder's write keeps when an earlier write of the
/// same claim moved the record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnMoved {
    /// `complete` (no checkpoint once done) and `checkpoint` (the newest).
    KeepOurs,
    /// `renew`, `release`: the stored one, which may be newer than the
    /// claim's (a checkpoint raced a renewal).
    KeepStoredCheckpoint,
}

/// Writes `record` over the claim's record, and when the write fails or is
/// refused, reads the record back and acts as `wit/guard.wit`'s interface
/// docs say (holder identity), in their order. Returns the version and the
/// record written (or found written).
fn write_as_holder<P: Primitives>(
    store: &mut P,
    claim: &Claim,
    mut record: Record<P::Response>,
    now: u64,
    on_moved: OnMoved,
) -> Result<(u64, Record<P::Response>), GuardError> {
    let key = &claim.key;
    let mut expected = claim.fence;
    let mut failure = None;
    for _ in 0..MAX_ATTEMPTS {
        match store.replace(key, expected, &record, now) {
            Ok(written) => match written_at(written, expected) {
                Some(version) => return Ok((version, record)),
                None => failure = None,
            },
            Err(e) => failure = Some(unavailable("replace", key, e)),
        }
        let entry = match store.get(key, now) {
            Ok(entry) => entry,
            Err(e) => return Err(failure.unwrap_or_else(|| unavailable("get", key, e))),
        };
        let Some(entry) = entry.filter(|e| e.record.holder == claim.holder) else {
            return Err(stale(claim));
        };
        if is_own_completion(&entry.record, &record) {
            // Stored already: this write applied with its reply lost, or an
            // earlier attempt of this same completion did.
            return Ok((entry.version, entry.record));
        }
        if entry.version == expected {
            // Not applied: the store's failure stands.
            return Err(failure.unwrap_or_else(|| stale(claim)));
        }
        if entry.record.same_as(&record) {
            return Ok((entry.version, entry.record)); // applied; its reply was lost
        }
        if entry.record.state == State::Done {
            return Err(GuardError::StaleClaim(format!(
                "the claim on key {key:?} already completed"
            )));
        }
        // An earlier write of this claim moved the version: write there.
        expected = entry.version;
        if on_moved == OnMoved::KeepStoredCheckpoint {
            record.checkpoint = entry.record.checkpoint;
        }
    }
    Err(failure.unwrap_or_else(|| {
        GuardError::Unavailable(format!(
            "the record for key {key:?} kept changing under its own holder ({MAX_ATTEMPTS} writes)"
        ))
    }))
}

/// Whether `stored` is the completion `meant` stores: done, by the same
/// holder, for the same fingerprint, with the same response — whatever its
/// expiry (a retry computes another) and version.
fn is_own_completion<R: ResponseHandle>(stored: &Record<R>, meant: &Record<R>) -> bool {
    meant.state == State::Done
        && stored.state == State::Done
        && stored.holder == meant.holder
        && stored.fingerprint == meant.fingerprint
        && match (&stored.response, &meant.response) {
            (Some(stored), Some(meant)) => stored.same_as(meant),
            _ => false,
        }
}

/// The version a replace at `expected` wrote, when it wrote: the contract
/// makes it `expected + 1`; at u64's end the store writes nothing.
fn written_at(written: bool, expected: u64) -> Option<u64> {
    expected.checked_add(1).filter(|_| written)
}

fn claim<R>(key: &str, record: Record<R>, fence: u64) -> Claim {
    Claim {
        key: key.to_owned(),
        fingerprint: record.fingerprint,
        fence,
        holder: record.holder,
        lease_until_ms: record.lease_until_ms,
        expires_at_ms: record.expires_at_ms,
        checkpoint: record.checkpoint,
    }
}

fn replay<R>(key: &str, entry: Entry<R>) -> Result<Decision<R>, GuardError> {
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
    use crate::model::Response;

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

    /// `begin` on key `k` with fingerprint `fp`, the tests' usual request.
    fn begin_k(s: &mut Map) -> Decision {
        begin(s, "k", "fp", &policy()).unwrap()
    }

    /// Completing `claim` with `body` is refused as stale, and key `k`
    /// still replays `kept`.
    fn assert_stale_completion(s: &mut Map, claim: &Claim, body: &str, kept: &str) {
        let err = complete(s, claim, ok(body), &policy()).unwrap_err();
        assert!(matches!(err, GuardError::StaleClaim(_)), "{err}");
        assert_eq!(begin_k(s), Decision::Replay(ok(kept)));
    }

    fn claim_k(s: &mut Map) -> Claim {
        proceed(begin_k(s))
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
        let c = claim_k(&mut s);
        assert_eq!(c.fence, 1);
        assert_eq!(
            begin_k(&mut s),
            Decision::InFlight {
                retry_after_ms: 1_000
            }
        );
        complete(&mut s, &c, ok("paid"), &policy()).unwrap();
        assert_eq!(begin_k(&mut s), Decision::Replay(ok("paid")));
        assert_eq!(
            begin(&mut s, "k", "other", &policy()).unwrap(),
            Decision::Conflict
        );
    }

    #[test]
    fn zombie_complete_after_takeover_is_refused() {
        let mut s = Map::default();
        let zombie = claim_k(&mut s);
        s.now += 1_000;
        let taker = claim_k(&mut s);
        assert!(taker.fence > zombie.fence);
        complete(&mut s, &taker, ok("taker"), &policy()).unwrap();
        assert_stale_completion(&mut s, &zombie, "zombie", "taker");
    }

    #[test]
    fn release_lets_the_retry_proceed_at_once() {
        let mut s = Map::default();
        let first = claim_k(&mut s);
        release(&mut s, &first).unwrap();
        let second = claim_k(&mut s);
        assert!(second.fence > first.fence);
        assert!(matches!(
            release(&mut s, &first),
            Err(GuardError::StaleClaim(_))
        ));
    }

    #[test]
    fn renew_extends_the_lease_and_raises_the_fence() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        s.now += 900;
        let renewed = renew(&mut s, &c, &policy()).unwrap();
        assert_eq!(renewed.lease_until_ms, 1_900);
        s.now += 500; // past the first lease, inside the renewed one
        assert!(matches!(begin_k(&mut s), Decision::InFlight { .. }));
        assert!(renewed.fence > c.fence);
        assert_eq!(renewed.holder, c.holder);
        // The claim before the renewal is the same holder's: its write lands
        // (the version it knew was moved by its own renewal).
        complete(&mut s, &c, ok("old copy"), &policy()).unwrap();
        assert_stale_completion(&mut s, &renewed, "new", "old copy");
    }

    #[test]
    fn a_lost_renewal_reply_is_not_a_takeover() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        s.now += 500;
        s.fail_next = Some(true); // applied, reply lost
        let renewed = renew(&mut s, &c, &policy()).unwrap();
        assert_eq!((renewed.fence, renewed.lease_until_ms), (2, 1_500));
        s.fail_next = Some(false); // not applied
        assert!(matches!(
            renew(&mut s, &renewed, &policy()),
            Err(GuardError::Unavailable(_))
        ));
        s.fail_next = Some(true);
        complete(&mut s, &renewed, ok("paid"), &policy()).unwrap();
        assert_eq!(s.writes, 3, "claim, renewal, completion: each once");
        assert_eq!(begin_k(&mut s), Decision::Replay(ok("paid")));
    }

    #[test]
    fn a_retried_completion_of_its_own_response_succeeds() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        complete(&mut s, &c, ok("paid"), &policy()).unwrap();
        // The caller never saw that reply; it retries later, when the
        // record's expiry would be another.
        s.now += 7;
        complete(&mut s, &c, ok("paid"), &policy()).unwrap();
        assert_eq!(s.writes, 2, "the claim and one completion");
        // Another response under the same claim is not this completion.
        let err = complete(&mut s, &c, ok("other"), &policy()).unwrap_err();
        assert!(
            matches!(&err, GuardError::StaleClaim(m) if m.contains("already completed")),
            "{err}"
        );
        // Nor is the same response under another holder's claim.
        let forged = Claim {
            holder: c.holder + 1,
            ..c.clone()
        };
        assert_stale_completion(&mut s, &forged, "paid", "paid");
    }

    #[test]
    fn a_claim_with_holder_0_is_invalid_input_before_anything_else() {
        let mut s = Map::default();
        let c = Claim {
            holder: 0,
            ..claim_k(&mut s)
        };
        let bad_policy = Policy {
            lease_ms: 0,
            ..policy()
        };
        let step = Checkpoint {
            phase: String::new(),
            data: vec![],
        };
        let holder_0 = |r: Result<(), GuardError>| matches!(r, Err(GuardError::InvalidInput(m)) if m.contains("holder 0"));
        // The claim is the first parameter: its limit is the one named.
        assert!(holder_0(complete(
            &mut s,
            &c,
            ok(&"x".repeat(99)),
            &bad_policy
        )));
        assert!(holder_0(release(&mut s, &c)));
        assert!(holder_0(renew(&mut s, &c, &bad_policy).map(|_| ())));
        assert!(holder_0(
            checkpoint(&mut s, &c, step, &bad_policy).map(|_| ())
        ));
        assert_eq!(s.writes, 1, "only the claim");
    }

    #[test]
    fn limits_are_checked_in_the_order_of_the_parameters() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        let bad_policy = Policy {
            lease_ms: 0,
            ..policy()
        };
        // complete(claim, response, policy): the response before the policy.
        let err = complete(&mut s, &c, ok(&"x".repeat(65)), &bad_policy).unwrap_err();
        assert!(err.to_string().contains("65 bytes"), "{err}");
        // save-checkpoint(claim, checkpoint, policy): the checkpoint first.
        let step = Checkpoint {
            phase: String::new(),
            data: vec![],
        };
        let err = checkpoint(&mut s, &c, step, &bad_policy).unwrap_err();
        assert!(err.to_string().contains("phase is empty"), "{err}");
        // A stale claim with a broken limit is told the limit.
        s.now += 3_600_000;
        let err = renew(&mut s, &c, &bad_policy).unwrap_err();
        assert!(matches!(err, GuardError::InvalidInput(_)), "{err}");
    }

    #[test]
    fn a_lost_write_then_the_next_write_of_the_same_claim_lands() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        s.fail_next = Some(true);
        // The renewal was applied but the read-back failed too? Here only
        // the reply is lost and the caller never learns the new fence: its
        // next write, with the old claim, still lands.
        let _ = renew(&mut s, &c, &policy()).unwrap();
        complete(&mut s, &c, ok("paid"), &policy()).unwrap();
        assert_eq!(begin_k(&mut s), Decision::Replay(ok("paid")));
    }

    #[test]
    fn a_takeover_carries_the_last_checkpoint() {
        let mut s = Map::default();
        let first = claim_k(&mut s);
        assert_eq!(first.checkpoint, None);
        let step = Checkpoint {
            phase: "charged".into(),
            data: b"ch_1".to_vec(),
        };
        let first = checkpoint(&mut s, &first, step.clone(), &policy()).unwrap();
        assert_eq!(first.checkpoint.as_ref(), Some(&step));
        // A renewal keeps it.
        let first = renew(&mut s, &first, &policy()).unwrap();
        s.now += 1_000; // the holder crashed; its lease ran out
        let taker = claim_k(&mut s);
        assert_ne!(taker.holder, first.holder);
        assert_eq!(taker.checkpoint, Some(step.clone()));
        assert!(matches!(
            checkpoint(&mut s, &first, step, &policy()),
            Err(GuardError::StaleClaim(_))
        ));
        complete(&mut s, &taker, ok("shipped"), &policy()).unwrap();
        assert_eq!(s.records["k"].record.checkpoint, None);
    }

    #[test]
    fn a_renewal_racing_a_checkpoint_keeps_the_checkpoint() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        let step = Checkpoint {
            phase: "reserved".into(),
            data: vec![],
        };
        let _after = checkpoint(&mut s, &c, step.clone(), &policy()).unwrap();
        // The renewal timer still holds the claim from before the checkpoint.
        let renewed = renew(&mut s, &c, &policy()).unwrap();
        assert_eq!(renewed.checkpoint, Some(step.clone()));
        assert_eq!(s.records["k"].record.checkpoint, Some(step));
    }

    #[test]
    fn checkpoint_limits() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
        for (phase, data, limit) in [
            ("", 0, "1 to 64"),
            (&*"p".repeat(65), 0, "1 to 64"),
            ("a\u{7f}", 0, "control"),
            ("p", 65, "limit is 64"),
        ] {
            let step = Checkpoint {
                phase: phase.into(),
                data: vec![0; data],
            };
            let err = checkpoint(&mut s, &c, step, &policy()).unwrap_err();
            assert!(
                matches!(&err, GuardError::InvalidInput(m) if m.contains(limit)),
                "{err}"
            );
        }
        assert_eq!(s.writes, 1);
    }

    #[test]
    fn expiry_makes_the_key_new_and_refuses_old_claims() {
        let mut s = Map::default();
        let c = claim_k(&mut s);
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
        let c = claim_k(&mut s);
        let err = complete(&mut s, &c, ok(&"x".repeat(65)), &policy()).unwrap_err();
        assert!(
            err.to_string().contains("65 bytes") && err.to_string().contains("64"),
            "{err}"
        );
        assert_eq!(s.writes, 1, "an oversized response is not stored");
    }
}
