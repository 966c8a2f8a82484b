//! Checks for the fuzz targets (`fuzz/`) and for their regression test: each
//! takes arbitrary bytes, decodes them into inputs, runs the guard's logic
//! and panics when an invariant breaks — not only when the code panics.
//!
//! Shared here so that a crash the fuzzer finds, saved under
//! `fuzz/regressions/<target>/`, replays through the very same check in
//! `cargo test -p idem-guest`.

use std::collections::HashMap;

use crate::decide::{Verdict, decide};
use crate::guard::{self, Primitives};
use crate::limits::{
    MAX_FINGERPRINT_BYTES, MAX_KEY_BYTES, check_fingerprint, check_key, check_policy,
    check_response,
};
use crate::model::{
    Claim, Decision, Entry, GuardError, InsertOutcome, Policy, Record, Response, State,
    StoreFailure,
};

/// One fuzz target's check.
pub type Check = fn(&[u8]);

/// The fuzz targets, by name.
pub const TARGETS: &[(&str, Check)] = &[
    ("decide", check_decide),
    ("guard", check_guard),
    ("limits", check_limits),
    ("fingerprint", check_fingerprint_canonical),
];

/// Reads inputs from the fuzzer's bytes; past the end, zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.u8()))
    }

    /// Mostly small numbers, sometimes huge ones (overflow edges).
    fn ms(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => self.u64(),
            1 => u64::MAX - u64::from(self.u8()),
            _ => u64::from(self.u8()) * 16 + u64::from(self.u8() % 16),
        }
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = (usize::from(self.u8()) | (usize::from(self.u8()) << 8)) % (max + 1);
        let len = len.min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        taken.to_vec()
    }

    fn string(&mut self, max: usize) -> String {
        String::from_utf8_lossy(&self.bytes(max)).into_owned()
    }

    /// A key or fingerprint from a small set (so they collide), or arbitrary text.
    fn name(&mut self, pool: &[&str], max: usize) -> String {
        let pick = usize::from(self.u8());
        match pool.get(pick % (pool.len() + 1)) {
            Some(name) => (*name).to_string(),
            None => self.string(max),
        }
    }

    fn policy(&mut self) -> Policy {
        Policy {
            lease_ms: self.ms(),
            retention_ms: self.ms(),
            max_response_bytes: u32::from(self.u8()) * 4,
        }
    }

    fn response(&mut self) -> Response {
        let status = match self.u8() % 4 {
            0 => u16::from(self.u8()) | (u16::from(self.u8()) << 8),
            _ => 200 + u16::from(self.u8() % 8),
        };
        let headers = (0..self.u8() % 3)
            .map(|_| (self.string(8), self.bytes(8)))
            .collect();
        Response {
            status,
            headers,
            body: self.bytes(64),
        }
    }

    fn record(&mut self) -> Record {
        let state = if self.u8().is_multiple_of(2) {
            State::Processing
        } else {
            State::Done
        };
        Record {
            fingerprint: self.name(&["fp", "fp2"], 8),
            state,
            lease_until_ms: self.ms(),
            expires_at_ms: self.ms(),
            response: (state == State::Done).then(|| self.response()),
        }
    }
}

/// `decide` returns the verdict the contract names for every stored record,
/// time and fingerprint.
pub fn check_decide(data: &[u8]) {
    let mut input = Input(data);
    let stored = (input.u8() % 4 != 0).then(|| Entry {
        record: input.record(),
        version: input.u64(),
    });
    let now = input.ms();
    let fingerprint = input.name(&["fp", "fp2"], 8);
    let verdict = decide(stored.as_ref(), now, &fingerprint);
    let live = stored
        .as_ref()
        .filter(|e| now < e.record.expires_at_ms)
        .map(|e| &e.record);
    match verdict {
        Verdict::Claim => assert!(live.is_none(), "claim over a live record {live:?}"),
        Verdict::Conflict => assert!(
            live.is_some_and(|r| r.fingerprint != fingerprint),
            "conflict without another fingerprint"
        ),
        Verdict::Replay => {
            let r = live.expect("replay needs a live record");
            assert_eq!(
                r.fingerprint, fingerprint,
                "replay of another fingerprint's response"
            );
            assert_eq!(r.state, State::Done);
        }
        Verdict::InFlight { retry_after_ms } => {
            let r = live.expect("in flight needs a live record");
            assert_eq!(
                (r.fingerprint.as_str(), r.state),
                (fingerprint.as_str(), State::Processing)
            );
            assert!(
                retry_after_ms >= 1 && now + retry_after_ms == r.lease_until_ms,
                "retry after {retry_after_ms} ms at {now} for {r:?}"
            );
        }
        Verdict::TakeOver => {
            let r = live.expect("takeover needs a live record");
            assert_eq!(
                (r.fingerprint.as_str(), r.state),
                (fingerprint.as_str(), State::Processing)
            );
            assert!(now >= r.lease_until_ms, "takeover within the lease");
        }
    }
}

/// A store of one process's memory, with faults the input schedules.
#[derive(Default)]
struct Map {
    now: u64,
    records: HashMap<String, Entry>,
    writes: usize,
    /// The next store call fails (and, if `lost`, is applied first).
    fail_next: Option<bool>,
}

impl Map {
    fn fault(&mut self) -> Option<bool> {
        self.fail_next.take()
    }
}

impl Primitives for Map {
    fn now_ms(&mut self) -> u64 {
        self.now
    }

    fn insert(
        &mut self,
        key: &str,
        record: &Record,
        now: u64,
    ) -> Result<InsertOutcome, StoreFailure> {
        let fault = self.fault();
        if fault == Some(false) {
            return Err(StoreFailure::Unavailable("injected".into()));
        }
        let outcome = match self.records.get(key) {
            Some(e) if e.record.is_live(now) => InsertOutcome::Existing(e.clone()),
            old => {
                let version = old.map_or(1, |e| e.version + 1);
                self.records.insert(
                    key.into(),
                    Entry {
                        record: record.clone(),
                        version,
                    },
                );
                self.writes += 1;
                InsertOutcome::Inserted(version)
            }
        };
        if fault == Some(true) {
            return Err(StoreFailure::Unavailable("reply lost".into()));
        }
        Ok(outcome)
    }

    fn replace(
        &mut self,
        key: &str,
        expected: u64,
        record: &Record,
        now: u64,
    ) -> Result<Option<u64>, StoreFailure> {
        let fault = self.fault();
        if fault == Some(false) {
            return Err(StoreFailure::Corrupt("injected".into()));
        }
        let outcome = match self.records.get_mut(key) {
            Some(e) if e.record.is_live(now) && e.version == expected => {
                *e = Entry {
                    record: record.clone(),
                    version: expected + 1,
                };
                self.writes += 1;
                Some(expected + 1)
            }
            _ => None,
        };
        if fault == Some(true) {
            return Err(StoreFailure::Unavailable("reply lost".into()));
        }
        Ok(outcome)
    }
}

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
                let policy = if input.u8() % 4 == 0 {
                    input.policy()
                } else {
                    Policy {
                        lease_ms: 100,
                        retention_ms: 1_000,
                        max_response_bytes: 64,
                    }
                };
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
                let policy = if input.u8() % 4 == 0 {
                    input.policy()
                } else {
                    Policy {
                        lease_ms: 100,
                        retention_ms: 1_000,
                        max_response_bytes: 64,
                    }
                };
                let current = before
                    .get(&claim.key)
                    .is_some_and(|e| e.version == claim.fence && e.record.is_live(store.now));
                let faulted = store.fail_next.is_some();
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
                            assert_eq!(renewed.fence, claim.fence + 1);
                            Ok(Some(renewed))
                        }
                        Err(e) => Err(e),
                    },
                };
                assert!(
                    result.is_err() || current,
                    "a stale claim (fence {}) wrote over {:?}",
                    claim.fence,
                    before.get(&claim.key)
                );
                assert!(
                    !(faulted && result.is_ok()),
                    "a failed store call succeeded"
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
                let current = before
                    .get(&claim.key)
                    .is_some_and(|e| e.version == claim.fence && e.record.is_live(store.now));
                let result = guard::release(&mut store, &claim);
                assert!(result.is_err() || current, "a stale claim released");
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

fn check_store_invariants(store: &Map, before: &HashMap<String, Entry>, claims: &[Claim]) {
    for (key, entry) in &store.records {
        if !entry.record.is_live(store.now) {
            continue;
        }
        let current = claims
            .iter()
            .filter(|c| {
                &c.key == key
                    && c.fence == entry.version
                    && store.now < c.expires_at_ms
                    && entry.record.state == State::Processing
            })
            .count();
        assert!(current <= 1, "{current} claims are current on {key:?}");
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

/// Each check accepts exactly the inputs the contract documents, and every
/// refusal is `invalid-input` naming the limit.
pub fn check_limits(data: &[u8]) {
    let mut input = Input(data);
    let text = input.string(300);
    let key_ok =
        !text.is_empty() && text.len() <= MAX_KEY_BYTES && !text.chars().any(char::is_control);
    match check_key(&text) {
        Ok(()) => assert!(key_ok, "key {text:?} accepted"),
        Err(GuardError::InvalidInput(why)) => {
            assert!(!key_ok, "key {text:?} refused: {why}");
            assert!(why.contains("key"), "{why}");
        }
        Err(e) => panic!("{e}"),
    }
    let fp_ok = !text.is_empty()
        && text.len() <= MAX_FINGERPRINT_BYTES
        && text.bytes().all(|b| (b'!'..=b'~').contains(&b));
    match check_fingerprint(&text) {
        Ok(()) => assert!(fp_ok, "fingerprint {text:?} accepted"),
        Err(GuardError::InvalidInput(why)) => {
            assert!(!fp_ok, "fingerprint {text:?} refused: {why}");
            assert!(why.contains("fingerprint"), "{why}");
        }
        Err(e) => panic!("{e}"),
    }
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

/// The fingerprint is canonical: `sha256:` and 64 lowercase hex digits, a
/// valid fingerprint, blind to header order and name case and method case,
/// and changed by any change to a part.
pub fn check_fingerprint_canonical(data: &[u8]) {
    let mut input = Input(data);
    let method = input.string(12);
    let path = input.string(64);
    let headers: Vec<(String, Vec<u8>)> = (0..input.u8() % 5)
        .map(|_| (input.string(12), input.bytes(12)))
        .collect();
    let body = input.bytes(256);
    let fp = crate::fingerprint::fingerprint(&method, &path, &headers, &body);
    assert_eq!(fp.len(), 71, "{fp}");
    assert!(
        fp.starts_with("sha256:")
            && fp[7..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{fp}"
    );
    assert!(check_fingerprint(&fp).is_ok());

    let mut shuffled: Vec<(String, Vec<u8>)> = headers
        .iter()
        .rev()
        .map(|(n, v)| (n.to_ascii_uppercase(), v.clone()))
        .collect();
    if !shuffled.is_empty() {
        let turn = usize::from(input.u8()) % shuffled.len();
        shuffled.rotate_left(turn);
    }
    assert_eq!(
        fp,
        crate::fingerprint::fingerprint(&method.to_ascii_lowercase(), &path, &shuffled, &body),
        "order or case changed the fingerprint"
    );

    let mut longer = body.clone();
    longer.push(input.u8());
    assert_ne!(
        fp,
        crate::fingerprint::fingerprint(&method, &path, &headers, &longer),
        "a body byte did not matter"
    );
    let moved = format!(
        "{path}{}",
        method.chars().next().map(String::from).unwrap_or_default()
    );
    if !method.is_empty() {
        let rest: String = method.chars().skip(1).collect();
        assert_ne!(
            fp,
            crate::fingerprint::fingerprint(&rest, &moved, &headers, &body),
            "moving bytes between parts did not matter"
        );
    }
    let mut more = headers.clone();
    more.push((String::new(), vec![]));
    assert_ne!(
        fp,
        crate::fingerprint::fingerprint(&method, &path, &more, &body),
        "an empty header did not matter"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file saved under `fuzz/regressions/<target>/` replays through its check.
    #[test]
    fn fuzz_regressions_replay() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
        let mut replayed = 0;
        for (name, check) in TARGETS {
            let dir = root.join(name);
            let Ok(files) = std::fs::read_dir(&dir) else {
                continue;
            };
            for file in files {
                let path = file.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&bytes));
                assert!(outcome.is_ok(), "regression {} fails", path.display());
                replayed += 1;
            }
        }
        assert!(
            replayed >= TARGETS.len(),
            "expected at least one regression input per target under {}",
            root.display()
        );
    }
}
