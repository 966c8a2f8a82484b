//! Model-based tests: random sequences of begin / complete / release / renew
//! / `run`, clock moves and one-shot store faults (error, timeout, lost
//! reply) from several callers, run against the component through
//! [`idem::Guard`] and against a small reference model of the contract
//! written here from `wit/guard.wit` and `wit/store.wit` (not from the
//! guest's code). Any divergence shrinks to a minimal failing sequence.
//!
//! The model tracks what the *store* holds, not what callers believe: a
//! write whose reply was lost is applied in the model too. Each record
//! names its holder (contract 0.2): the caller whose `begin` claimed it,
//! kept across renewals; a holder's write whose reply was lost, or whose
//! fence fell behind its own earlier write, is read back and carries on
//! (`wit/guard.wit`, "Holder identity").
//!
//! After every step the real store's record for each key must equal the
//! model's, and these invariants are checked on the real system directly:
//! - at most one holder's claims are current per key;
//! - a completed response never changes within its retention window;
//! - only the record's holder completes;
//! - a `run` answered unavailable never ran its handler.
//!
//! `IDEM_MODEL_CASES` (default 64) and `IDEM_MODEL_STEPS` (default 40) size the run.

use crate::conformance::BASE_MS;
use idem::store::{FaultRule, Op, Store};
use idem::{
    Claim, Decision, Faulty, Guard, GuardError, ManualClock, Outcome, Response, RunError, State,
};
use idem_harness::unique;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const LEASE_MS: u64 = 1_000;
const RETENTION_MS: u64 = 10_000;
const CALLERS: usize = 3;
const KEYS: usize = 2;
const FINGERPRINTS: [&str; 2] = ["fp-a", "fp-b"];
/// Clock moves around the lease and retention boundaries.
const ADVANCES_MS: [u64; 8] = [1, 250, 999, 1_000, 1_001, 4_000, 9_999, 10_000];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Error,
    Timeout,
    Lost,
}

#[derive(Clone, Debug)]
enum Step {
    /// `begin`; a `proceed` claim is kept by the caller.
    Begin {
        caller: usize,
        key: usize,
        fp: usize,
    },
    /// `Guard::run` with a handler that counts its runs.
    Run {
        key: usize,
        fp: usize,
        body: u8,
    },
    /// `complete` with one of the caller's claims (old ones included: zombies).
    Complete {
        caller: usize,
        claim: usize,
        body: u8,
    },
    Release {
        caller: usize,
        claim: usize,
    },
    Renew {
        caller: usize,
        claim: usize,
    },
    Advance {
        ms: u64,
    },
    /// The next call of this store operation fails so.
    Fault {
        op: Op,
        fault: Fault,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let caller = 0..CALLERS;
    let fp = 0..FINGERPRINTS.len();
    prop_oneof![
        4 => (caller.clone(), 0..KEYS, fp.clone()).prop_map(|(caller, key, fp)| Step::Begin { caller, key, fp }),
        2 => (0..KEYS, fp, any::<u8>()).prop_map(|(key, fp, body)| Step::Run { key, fp, body }),
        3 => (caller.clone(), 0..4usize, any::<u8>()).prop_map(|(caller, claim, body)| Step::Complete { caller, claim, body }),
        1 => (caller.clone(), 0..4usize).prop_map(|(caller, claim)| Step::Release { caller, claim }),
        1 => (caller, 0..4usize).prop_map(|(caller, claim)| Step::Renew { caller, claim }),
        3 => prop::sample::select(&ADVANCES_MS[..]).prop_map(|ms| Step::Advance { ms }),
        2 => (prop::sample::select(&[Op::Insert, Op::Replace, Op::Get][..]), prop::sample::select(&[Fault::Error, Fault::Timeout, Fault::Lost][..]))
            .prop_map(|(op, fault)| Step::Fault { op, fault }),
    ]
}

#[derive(Clone, Debug)]
struct ModelRecord {
    fingerprint: String,
    state: State,
    /// The model's id of the holder that wrote it; ids of writes whose
    /// reply was lost belong to no caller.
    holder: u64,
    lease_until_ms: u64,
    expires_at_ms: u64,
    response: Option<Response>,
    /// The store version, when the model can know it (an insert whose reply
    /// was lost may start from 1 or from the expired record's version).
    version: Option<u64>,
}

impl ModelRecord {
    /// The same record, version aside: what the guard compares on read-back.
    fn same(&self, other: &ModelRecord) -> bool {
        self.fingerprint == other.fingerprint
            && self.state == other.state
            && self.holder == other.holder
            && self.lease_until_ms == other.lease_until_ms
            && self.expires_at_ms == other.expires_at_ms
            && self.response == other.response
    }
}

/// The contract, as a caller-visible result.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Proceed,
    Replay(Response),
    InFlight(u64),
    Conflict,
    Unavailable,
    Stale,
    Invalid,
    Ok,
    Executed(Response),
    NotRecorded,
}

fn seen_error(e: &GuardError) -> Seen {
    match e {
        GuardError::Unavailable(_) => Seen::Unavailable,
        GuardError::StaleClaim(_) => Seen::Stale,
        GuardError::InvalidInput(_) => Seen::Invalid,
    }
}

/// The reference model: what the store holds and which fault is pending.
struct Model {
    now_ms: u64,
    records: Vec<Option<ModelRecord>>,
    pending: HashMap<Op, Fault>,
    next_holder: u64,
}

/// What a write attempt does under a pending fault.
enum Attempt {
    /// No fault: the write runs and its result is seen.
    Clean,
    /// Nothing applied; the caller sees unavailable.
    Failed,
    /// Applied (if it would have been); the caller sees unavailable.
    Lost,
}

impl Model {
    fn live(&self, key: usize) -> Option<&ModelRecord> {
        self.records[key]
            .as_ref()
            .filter(|r| self.now_ms < r.expires_at_ms)
    }

    fn attempt(&mut self, op: Op) -> Attempt {
        match self.pending.remove(&op) {
            None => Attempt::Clean,
            Some(Fault::Error | Fault::Timeout) => Attempt::Failed,
            Some(Fault::Lost) => Attempt::Lost,
        }
    }

    /// A new holder id (as `begin` draws one).
    fn new_holder(&mut self) -> u64 {
        self.next_holder += 1;
        self.next_holder
    }

    fn processing(&mut self, fingerprint: &str, version: Option<u64>) -> ModelRecord {
        ModelRecord {
            fingerprint: fingerprint.to_owned(),
            state: State::Processing,
            holder: self.new_holder(),
            lease_until_ms: self.now_ms + LEASE_MS,
            expires_at_ms: self.now_ms + RETENTION_MS,
            response: None,
            version,
        }
    }

    /// `begin`: returns what the caller sees and, on proceed, the new holder's id.
    ///
    /// The guard's first store call is the insert (which returns the live
    /// record when there is one, so a claim and the read explaining a refusal
    /// are one round trip); a takeover is a replace at the live version.
    fn begin(&mut self, key: usize, fingerprint: &str) -> (Seen, Option<u64>) {
        let attempt = self.attempt(Op::Insert);
        let Some(live) = self.live(key).cloned() else {
            return self.write_claim(key, attempt, fingerprint, None);
        };
        if !matches!(attempt, Attempt::Clean) {
            return (Seen::Unavailable, None);
        }
        if live.fingerprint != fingerprint {
            return (Seen::Conflict, None);
        }
        match live.state {
            State::Done => (
                Seen::Replay(live.response.clone().expect("done records hold a response")),
                None,
            ),
            State::Processing if self.now_ms < live.lease_until_ms => {
                (Seen::InFlight(live.lease_until_ms - self.now_ms), None)
            }
            State::Processing => {
                let version = live.version.map(|v| v + 1);
                let attempt = self.attempt(Op::Replace);
                self.write_claim(key, attempt, fingerprint, version)
            }
        }
    }

    /// A claim's write (the insert, or a takeover's replace at `version`)
    /// as its attempt went: refused, applied with its reply lost, or clean.
    fn write_claim(
        &mut self,
        key: usize,
        attempt: Attempt,
        fingerprint: &str,
        version: Option<u64>,
    ) -> (Seen, Option<u64>) {
        match attempt {
            Attempt::Failed => (Seen::Unavailable, None),
            Attempt::Lost => {
                self.records[key] = Some(self.processing(fingerprint, version));
                (Seen::Unavailable, None)
            }
            Attempt::Clean => {
                let record = self.processing(fingerprint, version);
                let holder = record.holder;
                self.records[key] = Some(record);
                (Seen::Proceed, Some(holder))
            }
        }
    }

    /// A holder's write (complete / release / renew) as `wit/guard.wit`
    /// says: a replace at the claim's fence; when it fails or is refused,
    /// the record is read back: another holder's (or none) is stale, a
    /// completion finding its own response stored succeeds, the
    /// same version means the write did not apply, the very record meant
    /// means its reply was lost, and the holder's own processing record at
    /// another version is written again there (at most 4 writes).
    /// `expected` is the claim's fence, or `None` for the version the
    /// holder's `begin` just wrote. `intended` is the record to write.
    fn write_as_holder(
        &mut self,
        key: usize,
        claim: &Held,
        expected: Option<u64>,
        intended: ModelRecord,
    ) -> Seen {
        // A claim whose record expired is refused before any store call.
        if self.now_ms >= claim.claim.expires_at_ms {
            return Seen::Stale;
        }
        let mut expected = expected;
        let mut failed = false;
        for _ in 0..4 {
            let live = self.live(key).cloned();
            let at_version = live.as_ref().is_some_and(|r| match expected {
                Some(v) => r.version == Some(v),
                None => r.holder == claim.holder,
            });
            let version_now = live.as_ref().and_then(|r| r.version);
            let apply = |m: &mut Model| {
                let mut record = intended.clone();
                record.version = version_now.map(|v| v + 1);
                m.records[key] = Some(record);
            };
            match self.attempt(Op::Replace) {
                Attempt::Clean if at_version => {
                    apply(self);
                    return Seen::Ok;
                }
                Attempt::Clean => failed = false,
                Attempt::Failed => failed = true,
                Attempt::Lost => {
                    if at_version {
                        apply(self);
                    }
                    failed = true;
                }
            }
            if !matches!(self.attempt(Op::Get), Attempt::Clean) {
                return Seen::Unavailable;
            }
            let Some(read) = self.live(key).filter(|r| r.holder == claim.holder).cloned() else {
                return Seen::Stale;
            };
            // The holder's own completion, stored already (contract 0.3):
            // done with this fingerprint and this response, whatever its expiry.
            if intended.state == State::Done
                && read.state == State::Done
                && read.fingerprint == intended.fingerprint
                && read.response == intended.response
            {
                return Seen::Ok;
            }
            let unchanged = match expected {
                Some(v) => read.version == Some(v),
                None => !read.same(&intended) && read.state == State::Processing,
            };
            if unchanged {
                return if failed {
                    Seen::Unavailable
                } else {
                    Seen::Stale
                };
            }
            if read.same(&intended) {
                return Seen::Ok;
            }
            if read.state == State::Done {
                return Seen::Stale;
            }
            expected = read.version;
        }
        if failed {
            Seen::Unavailable
        } else {
            Seen::Stale
        }
    }

    fn complete(
        &mut self,
        key: usize,
        claim: &Held,
        expected: Option<u64>,
        response: &Response,
    ) -> Seen {
        let intended = ModelRecord {
            fingerprint: claim.claim.fingerprint.clone(),
            state: State::Done,
            holder: claim.holder,
            lease_until_ms: 0,
            expires_at_ms: self.now_ms + RETENTION_MS,
            response: Some(response.clone()),
            version: None,
        };
        self.write_as_holder(key, claim, expected, intended)
    }

    fn release(&mut self, key: usize, claim: &Held) -> Seen {
        let intended = ModelRecord {
            fingerprint: claim.claim.fingerprint.clone(),
            state: State::Processing,
            holder: claim.holder,
            lease_until_ms: self.now_ms,
            expires_at_ms: claim.claim.expires_at_ms,
            response: None,
            version: None,
        };
        self.write_as_holder(key, claim, Some(claim.claim.fence), intended)
    }

    fn renew(&mut self, key: usize, claim: &Held) -> Seen {
        let intended = ModelRecord {
            fingerprint: claim.claim.fingerprint.clone(),
            state: State::Processing,
            holder: claim.holder,
            lease_until_ms: self.now_ms + LEASE_MS,
            expires_at_ms: (self.now_ms + RETENTION_MS).max(claim.claim.expires_at_ms),
            response: None,
            version: None,
        };
        self.write_as_holder(key, claim, Some(claim.claim.fence), intended)
    }
}

/// A claim a caller holds: the real one and the model's id of its holder.
#[derive(Clone, Debug)]
struct Held {
    key: usize,
    holder: u64,
    claim: Claim,
}

fn response(body: u8) -> Response {
    Response {
        status: 200,
        headers: vec![("x-body".into(), vec![body])],
        body: vec![body; usize::from(body % 7)],
    }
}

/// Runs one sequence against the component and the model; `Err` names the
/// first divergence or broken invariant.
// One arm per kind of step, side by side with the model's call: splitting
// it would scatter the comparison.
#[allow(clippy::too_many_lines)]
async fn run_sequence(store: Arc<dyn Store>, steps: Vec<Step>) -> Result<(), String> {
    let clock = ManualClock::new(BASE_MS);
    let (faulty_store, faults) = Faulty::new(store.clone());
    let guard = Guard::builder(faulty_store)
        .clock(clock.clone())
        .lease(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RETENTION_MS))
        .build()
        .map_err(|e| e.to_string())?;
    let keys: Vec<String> = (0..KEYS).map(|i| unique(&format!("model{i}"))).collect();
    let mut model = Model {
        now_ms: BASE_MS,
        records: vec![None; KEYS],
        pending: HashMap::new(),
        next_holder: 0,
    };
    let mut held: Vec<Vec<Held>> = vec![Vec::new(); CALLERS];
    // Responses the real system confirmed stored, until their window ends.
    let mut committed: Vec<Option<(Response, u64)>> = vec![None; KEYS];
    let runs = AtomicUsize::new(0);

    for (i, step) in steps.iter().enumerate() {
        let at = |what: String| format!("step {i} {step:?}: {what}");
        let (want, got) = match *step {
            Step::Begin { caller, key, fp } => {
                let (want, holder) = model.begin(key, FINGERPRINTS[fp]);
                let got = match guard.begin(&keys[key], FINGERPRINTS[fp]).await {
                    Ok(Decision::Proceed(claim)) => {
                        if let Some(holder) = holder {
                            held[caller].push(Held { key, holder, claim });
                        }
                        Seen::Proceed
                    }
                    Ok(Decision::Replay(r)) => Seen::Replay(r),
                    Ok(Decision::InFlight { retry_after_ms }) => Seen::InFlight(retry_after_ms),
                    Ok(Decision::Conflict) => Seen::Conflict,
                    Err(e) => seen_error(&e),
                };
                (want, got)
            }
            Step::Run { key, fp, body } => {
                let (mut want, holder) = model.begin(key, FINGERPRINTS[fp]);
                if want == Seen::Proceed {
                    // The run completes the claim its begin just wrote: the
                    // model knows its holder, not its version.
                    let claim_expiry = model.now_ms + RETENTION_MS;
                    let placeholder = Held {
                        key,
                        holder: holder.expect("proceed has a holder"),
                        claim: Claim {
                            key: keys[key].clone(),
                            fingerprint: FINGERPRINTS[fp].to_owned(),
                            fence: 0,
                            holder: 0,
                            lease_until_ms: 0,
                            expires_at_ms: claim_expiry,
                            checkpoint: None,
                        },
                    };
                    want = match model.complete(key, &placeholder, None, &response(body)) {
                        Seen::Ok => Seen::Executed(response(body)),
                        _ => Seen::NotRecorded,
                    };
                    // The model cannot know the fence; take the store's word
                    // for the version of a completed record.
                    if let Some(r) = model.records[key].as_mut() {
                        r.version = None;
                    }
                }
                let before = runs.load(Ordering::SeqCst);
                let outcome = guard
                    .run(&keys[key], FINGERPRINTS[fp], |_fence| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(response(body))
                    })
                    .await;
                let ran = runs.load(Ordering::SeqCst) - before;
                let got = match outcome {
                    Ok(Outcome::Executed(r)) => Seen::Executed(r),
                    Ok(Outcome::Replayed(r)) => Seen::Replay(r),
                    Ok(Outcome::InFlight { retry_after }) => {
                        Seen::InFlight(retry_after.as_millis() as u64)
                    }
                    Ok(Outcome::Conflict) => Seen::Conflict,
                    Ok(Outcome::Unavailable(_)) => Seen::Unavailable,
                    Err(RunError::NotRecorded { .. }) => Seen::NotRecorded,
                    Err(RunError::InvalidInput(_)) => Seen::Invalid,
                    Err(RunError::Handler(never)) => match never {},
                };
                let should_run = usize::from(matches!(got, Seen::Executed(_) | Seen::NotRecorded));
                if ran != should_run {
                    return Err(at(format!(
                        "the handler ran {ran} times for outcome {got:?}"
                    )));
                }
                (want, got)
            }
            Step::Complete {
                caller,
                claim,
                body,
            } => {
                let Some(h) = pick(&held[caller], claim) else {
                    continue;
                };
                let before = store
                    .get(&keys[h.key], model.now_ms)
                    .await
                    .map_err(|e| at(e.to_string()))?;
                let want = model.complete(h.key, &h, Some(h.claim.fence), &response(body));
                let (_, result) = guard.complete(h.claim.clone(), response(body)).await;
                if result.is_ok()
                    && before
                        .as_ref()
                        .is_none_or(|e| e.record.holder != h.claim.holder)
                {
                    return Err(at(format!(
                        "holder {} completed over another holder's record {before:?}",
                        h.claim.holder
                    )));
                }
                (
                    want,
                    result.map_or_else(|e| seen_error(&e), |_expires_at_ms| Seen::Ok),
                )
            }
            Step::Release { caller, claim } => {
                let Some(h) = pick(&held[caller], claim) else {
                    continue;
                };
                let want = model.release(h.key, &h);
                let got = guard
                    .release(h.claim.clone())
                    .await
                    .map_or_else(|e| seen_error(&e), |()| Seen::Ok);
                (want, got)
            }
            Step::Renew { caller, claim } => {
                let Some(h) = pick(&held[caller], claim) else {
                    continue;
                };
                let want = model.renew(h.key, &h);
                let got = match guard.renew(h.claim.clone()).await {
                    Ok(renewed) => {
                        if renewed.fence <= h.claim.fence {
                            return Err(at(format!(
                                "renew gave fence {} after {}",
                                renewed.fence, h.claim.fence
                            )));
                        }
                        if renewed.holder != h.claim.holder {
                            return Err(at(format!(
                                "renew changed the holder from {} to {}",
                                h.claim.holder, renewed.holder
                            )));
                        }
                        held[caller].push(Held {
                            key: h.key,
                            holder: h.holder,
                            claim: renewed,
                        });
                        Seen::Proceed
                    }
                    Err(e) => seen_error(&e),
                };
                (
                    if want == Seen::Ok {
                        Seen::Proceed
                    } else {
                        want
                    },
                    got,
                )
            }
            Step::Advance { ms } => {
                model.now_ms += ms;
                clock.advance(Duration::from_millis(ms));
                continue;
            }
            Step::Fault { op, fault } => {
                model.pending.insert(op, fault);
                let rule = match fault {
                    Fault::Error => FaultRule::error("injected by the model test"),
                    Fault::Timeout => FaultRule::timeout(Duration::ZERO),
                    Fault::Lost => FaultRule::lost(),
                };
                faults
                    .set(op, rule.times(1))
                    .map_err(|e| at(e.to_string()))?;
                continue;
            }
        };
        if want != got {
            return Err(at(format!(
                "the model says {want:?}, the component {got:?}"
            )));
        }
        check_store(&store, &keys, &mut model, &held, &mut committed)
            .await
            .map_err(at)?;
    }
    Ok(())
}

/// A caller's claim by index, newest first; `None` when it holds none.
fn pick(claims: &[Held], index: usize) -> Option<Held> {
    (!claims.is_empty()).then(|| claims[claims.len() - 1 - index % claims.len()].clone())
}

/// The real store holds what the model says; the invariants hold.
async fn check_store(
    store: &Arc<dyn Store>,
    keys: &[String],
    model: &mut Model,
    held: &[Vec<Held>],
    committed: &mut [Option<(Response, u64)>],
) -> Result<(), String> {
    let now = model.now_ms;
    for (k, key) in keys.iter().enumerate() {
        let real = store.get(key, now).await.map_err(|e| e.to_string())?;
        let want = model.live(k).cloned();
        match (&real, &want) {
            (None, None) => {}
            (Some(entry), Some(m)) => {
                let r = &entry.record;
                let same = r.fingerprint == m.fingerprint
                    && r.state == m.state
                    && (r.state == State::Done || r.lease_until_ms == m.lease_until_ms)
                    && r.expires_at_ms == m.expires_at_ms
                    && r.response == m.response
                    && m.version.is_none_or(|v| v == entry.version);
                if !same {
                    return Err(format!(
                        "key {k}: the store holds {entry:?}, the model {m:?}"
                    ));
                }
                if let Some(record) = model.records[k].as_mut() {
                    record.version = Some(entry.version);
                }
            }
            _ => {
                return Err(format!(
                    "key {k}: the store holds {real:?}, the model {want:?}"
                ));
            }
        }

        // At most one holder is current: copies of one holder's claim
        // (renewed, or read back after a lost reply) may share the fence.
        let mut current: Vec<u64> = held
            .iter()
            .flatten()
            .filter(|h| h.key == k && now < h.claim.expires_at_ms)
            .filter(|h| {
                real.as_ref().is_some_and(|e| {
                    e.version == h.claim.fence && e.record.state == State::Processing
                })
            })
            .map(|h| h.claim.holder)
            .collect();
        current.dedup();
        if current.len() > 1 {
            return Err(format!(
                "key {k}: claims of {} holders are current at once: {current:?}",
                current.len()
            ));
        }

        // A completed response never changes within its window.
        if let Some((response, until)) = &committed[k] {
            if now < *until {
                let stored = real.as_ref().and_then(|e| e.record.response.as_ref());
                if stored != Some(response) {
                    return Err(format!(
                        "key {k}: the completed response {response:?} changed to {stored:?} within its window"
                    ));
                }
            } else {
                committed[k] = None;
            }
        }
        if let Some(entry) = &real
            && entry.record.state == State::Done
            && committed[k].is_none()
        {
            committed[k] = Some((
                entry.record.response.clone().unwrap_or_default(),
                entry.record.expires_at_ms,
            ));
        }
    }
    Ok(())
}

fn env_or(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The conformance case: random sequences against `store`, shrunk on failure.
pub async fn model_based_sequences(store: Arc<dyn Store>) {
    let cases = env_or("IDEM_MODEL_CASES", 64);
    let max_steps = env_or("IDEM_MODEL_STEPS", 40) as usize;
    let handle = tokio::runtime::Handle::current();
    // The runner is synchronous: it runs on a blocking thread and blocks on
    // each sequence, while the test's runtime (of either flavor) drives I/O.
    let result = tokio::task::spawn_blocking(move || {
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        runner.run(&prop::collection::vec(step(), 1..=max_steps), |steps| {
            handle
                .block_on(run_sequence(store.clone(), steps))
                .map_err(TestCaseError::fail)
        })
    })
    .await
    .expect("the model runner panicked");
    if let Err(e) = result {
        panic!("the component diverged from the model: {e}");
    }
}
