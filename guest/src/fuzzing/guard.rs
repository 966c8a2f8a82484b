//! The `guard` fuzz target's check.

use std::collections::HashMap;

use super::input::Input;
use super::store::Map;
use crate::guard;
use crate::limits::{
    MAX_FINGERPRINT_BYTES, MAX_KEY_BYTES, check_fingerprint, check_key, check_policy,
    check_response,
};
use crate::model::{Claim, Decision, Entry, GuardError, Policy, State};

const KEYS: &[&str] = &["k", "k2"];
const FINGERPRINTS: &[&str] = &["fp", "fp2"];

fn valid_inputs(key: &str, fingerprint: &str, policy: &Policy) -> bool {
    check_key(key).is_ok() && check_fingerprint(fingerprint).is_ok() && check_policy(policy).is_ok()
}

/// Sequences of begin / complete / release / renew, clock moves and store
/// faults over an in-memory store, with arbitrary keys, fingerprints,
/// policies and responses. After each operation:
/// - invalid input is refused as such and writes nothing;
/// - `proceed` means the store holds a processing record at the claim's fence;
/// - `replay` returns the response stored under the request's fingerprint;
/// - `in-flight`'s retry-after is at least 1 ms and at most the longest lease granted;
/// - a store failure never proceeds;
/// - at most one claim ever issued is current per key;
/// - a completed response never changes while its record lives;
/// - a stale claim never writes.
// One arm per operation, each next to its checks.
#[allow(clippy::too_many_lines)]
pub fn check_guard(data: &[u8]) {
    let mut input = Input(data);
    let mut store = Map {
        now: input.ms() % (1 << 40),
        ..Map::default()
    };
    let mut claims: Vec<Claim> = Vec::new();
    let mut longest_lease = 0;
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        let before = store.records.clone();
        let writes = store.writes;
        let op = input.u8() % 8;
        match op {
            0..=2 => {
                let key = input.name(KEYS, MAX_KEY_BYTES + 2);
                let fingerprint = input.name(FINGERPRINTS, MAX_FINGERPRINT_BYTES + 2);
                let policy = input.call_policy();
                let faulted = store.fail_next.is_some();
                let result = guard::begin(&mut store, &key, &fingerprint, &policy);
                if faulted && valid_inputs(&key, &fingerprint, &policy) {
                    assert!(
                        matches!(result, Err(GuardError::Unavailable(_))),
                        "a failed store call gave {result:?}"
                    );
                }
                if !valid_inputs(&key, &fingerprint, &policy) {
                    assert!(
                        matches!(result, Err(GuardError::InvalidInput(_))),
                        "invalid input gave {result:?}"
                    );
                    assert_eq!(store.writes, writes, "invalid input wrote");
                    continue;
                }
                if check_policy(&policy).is_ok() {
                    longest_lease = longest_lease.max(policy.lease_ms);
                }
                let stored = before.get(&key).filter(|e| e.record.is_live(store.now));
                match result {
                    Ok(Decision::Proceed(claim)) => {
                        let now_held = &store.records[&key];
                        assert_eq!(
                            now_held.version, claim.fence,
                            "proceed without the store holding the claim's fence"
                        );
                        assert_eq!(now_held.record.state, State::Processing);
                        assert_eq!(now_held.record.fingerprint, fingerprint);
                        assert_eq!(now_held.record.lease_until_ms, claim.lease_until_ms);
                        assert_eq!(now_held.record.holder, claim.holder);
                        assert_ne!(claim.holder, 0, "a claim without a holder");
                        if let Some(old) = stored {
                            assert!(
                                old.record.state == State::Processing
                                    && old.record.fingerprint == fingerprint,
                                "proceed over {old:?}"
                            );
                            assert!(
                                store.now >= old.record.lease_until_ms,
                                "takeover within the lease"
                            );
                            assert!(claim.fence > old.version);
                        }
                        claims.push(claim);
                    }
                    Ok(Decision::Replay(response)) => {
                        let old = stored.expect("replay of an absent record");
                        assert_eq!(
                            old.record.fingerprint, fingerprint,
                            "replay of another fingerprint's response"
                        );
                        assert_eq!(
                            old.record.response.as_ref(),
                            Some(&response),
                            "replayed bytes differ from the stored ones"
                        );
                    }
                    Ok(Decision::InFlight { retry_after_ms }) => {
                        assert!(
                            (1..=longest_lease).contains(&retry_after_ms),
                            "retry after {retry_after_ms} ms; longest lease {longest_lease}"
                        );
                        assert_eq!(store.writes, writes);
                    }
                    Ok(Decision::Conflict) => {
                        assert!(
                            stored.is_some_and(|e| e.record.fingerprint != fingerprint),
                            "conflict without another fingerprint"
                        );
                        assert_eq!(store.writes, writes);
                    }
                    Err(GuardError::Unavailable(_)) => {
                        assert!(faulted, "unavailable without a store failure");
                    }
                    Err(e) => panic!("begin with valid input failed: {e}"),
                }
            }
            3..=4 | 6 => {
                let Some(claim) = pick(&claims, &mut input) else {
                    continue;
                };
                let policy = input.call_policy();
                let current = is_current(&before, &claim, store.now);
                let faulted = store.fail_next.is_some();
                let lost = store.fail_next == Some(true);
                if op == 6 && check_policy(&policy).is_ok() {
                    // A renew whose reply is lost still writes this lease.
                    longest_lease = longest_lease.max(policy.lease_ms);
                }
                let result = match op {
                    3 | 4 => {
                        let response = input.response();
                        let valid = check_policy(&policy).is_ok()
                            && check_response(&response, &policy).is_ok();
                        let result = guard::complete(&mut store, &claim, response.clone(), &policy);
                        if !valid {
                            assert!(
                                matches!(result, Err(GuardError::InvalidInput(_))),
                                "invalid response or policy gave {result:?}"
                            );
                        } else if result.is_ok() {
                            let e = &store.records[&claim.key];
                            assert_eq!(
                                (e.record.state, e.record.response.as_ref()),
                                (State::Done, Some(&response))
                            );
                        }
                        result.map(|()| None)
                    }
                    _ => match guard::renew(&mut store, &claim, &policy) {
                        Ok(renewed) => {
                            assert!(renewed.fence > claim.fence);
                            assert_eq!(renewed.holder, claim.holder);
                            Ok(Some(renewed))
                        }
                        Err(e) => Err(e),
                    },
                };
                assert!(
                    current || store.writes == writes,
                    "a stale claim (fence {}) wrote over {:?}",
                    claim.fence,
                    before.get(&claim.key)
                );
                // A write that failed without applying fails the call, unless
                // the claim was behind its own holder's record: then the
                // read-back writes again at the record's version, and that
                // write may succeed.
                let at_fence = before
                    .get(&claim.key)
                    .is_some_and(|e| e.version == claim.fence);
                assert!(
                    !(faulted && !lost && result.is_ok() && at_fence),
                    "a store call that failed without applying succeeded"
                );
                if result.is_err() && store.writes != writes {
                    assert!(faulted && current, "a refused call wrote");
                }
                if let Ok(Some(renewed)) = result {
                    claims.push(renewed);
                }
            }
            5 => {
                let Some(claim) = pick(&claims, &mut input) else {
                    continue;
                };
                let current = is_current(&before, &claim, store.now);
                let result = guard::release(&mut store, &claim);
                assert!(current || store.writes == writes, "a stale claim released");
                if result.is_ok() {
                    assert!(store.records[&claim.key].record.lease_until_ms <= store.now);
                }
            }
            _ => match input.u8() % 4 {
                0 => store.fail_next = Some(input.u8() % 2 == 0),
                _ => store.now = store.now.saturating_add(input.ms() % 2_000),
            },
        }
        check_store_invariants(&store, &before, &claims);
    }
}

fn pick(claims: &[Claim], input: &mut Input<'_>) -> Option<Claim> {
    (!claims.is_empty()).then(|| claims[usize::from(input.u8()) % claims.len()].clone())
}

/// Whether `claim`'s holder held its key in the store as it was before the
/// operation: a claim may write over a later write of its own holder (a
/// lost reply), never over another holder's.
fn is_current(before: &HashMap<String, Entry>, claim: &Claim, now: u64) -> bool {
    now < claim.expires_at_ms
        && before.get(&claim.key).is_some_and(|e| {
            e.record.is_live(now)
                && e.record.state == State::Processing
                && claim.holder != 0
                && e.record.holder == claim.holder
        })
}

fn check_store_invariants(store: &Map, before: &HashMap<String, Entry>, claims: &[Claim]) {
    for (key, entry) in &store.records {
        if !entry.record.is_live(store.now) {
            continue;
        }
        // Copies of one holder's claim (renewed, or read back after a lost
        // reply) may share the fence: count holders, not copies.
        let mut current: Vec<u64> = claims
            .iter()
            .filter(|c| {
                &c.key == key
                    && c.fence == entry.version
                    && store.now < c.expires_at_ms
                    && entry.record.state == State::Processing
            })
            .map(|c| c.holder)
            .collect();
        current.sort_unstable();
        current.dedup();
        assert!(
            current.len() <= 1,
            "claims of {} holders are current on {key:?}",
            current.len()
        );
        if let Some(old) = before
            .get(key)
            .filter(|e| e.record.is_live(store.now) && e.record.state == State::Done)
        {
            assert_eq!(old, entry, "a completed record changed within its window");
        }
        assert_eq!(
            entry.record.response.is_some(),
            entry.record.state == State::Done,
            "{entry:?}"
        );
    }
}
