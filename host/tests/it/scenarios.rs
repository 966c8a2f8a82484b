//! The conformance scenarios (`conformance/*.json`, format in
//! `conformance/README.md`) run against the component through `idem::Guard`,
//! over a `Faulty` store and a `ManualClock`: the memory store, and every
//! other store too (SQLite, Redis, PostgreSQL), each scenario in a namespace
//! of its own (a new file, key prefix or table). The JavaScript and Python
//! hosts run the very same files; a host that disagrees with any step fails.
//!
//! The runner ([`play`]) drives any [`GuardHost`]: [`RustHost`] here, and
//! the guard composed with a store component in `composed.rs`.

use idem::store::Store;
use idem::{
    Checkpoint, Claim, Clock, Decision, Entry, FaultHandle, FaultRule, Faulty, Guard, GuardError,
    ManualClock, MemoryStore, Op, Outcome, Policy, RequestParts, Response, RunError, State,
};
use idem_harness::{server_url, unique};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

pub(crate) fn load(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Runs every scenario, each on a fresh store from `open`.
async fn every_scenario_passes_on<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let files = scenario_files();
    assert!(
        files.len() >= 15,
        "expected the full conformance suite, found {} files",
        files.len()
    );
    let mut failures = Vec::new();
    let mut steps = 0;
    for path in &files {
        let scenario = load(path);
        match run_scenario(&scenario, open().await).await {
            Ok(n) => steps += n,
            Err(why) => failures.push(format!(
                "{}: {why}",
                path.file_name().unwrap().to_string_lossy()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
    assert!(steps > 100, "only {steps} checked steps");
}

#[tokio::test]
async fn every_conformance_scenario_passes_in_the_rust_host() {
    every_scenario_passes_on(|| async { Arc::new(MemoryStore::new()) as Arc<dyn Store> }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_scenario_passes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    every_scenario_passes_on(|| {
        let path = dir.path().join(format!("{}.db", unique("scenario")));
        async move {
            let store = idem::store::SqliteStore::open(path, Default::default()).unwrap();
            Arc::new(store) as Arc<dyn Store>
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_scenario_passes_on_redis() {
    let Some(url) = server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    every_scenario_passes_on(|| {
        let url = format!("{url}?prefix={}:", unique("scenario"));
        async move { idem::store::open(&url).await.unwrap() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_scenario_passes_on_postgres() {
    use crate::netstores::postgres::{self, drop_table, raw, table, with};
    let Some(url) = postgres::url() else { return };
    let table = table();
    let store_url = with(&url, &format!("table={table}"));
    // One table for the run; each scenario's keys are its own (the table is
    // emptied in between by `open`).
    let client = Arc::new(raw(&url).await);
    every_scenario_passes_on(|| {
        let (store_url, client, table) = (store_url.clone(), client.clone(), table.clone());
        async move {
            let store = idem::store::open(&store_url).await.unwrap();
            client
                .batch_execute(&format!("DELETE FROM {table}"))
                .await
                .unwrap();
            store
        }
    })
    .await;
    drop_table(&client, &table).await;
}

/// The gateway hashes requests natively (`RequestParts::fingerprint`, the
/// component's code compiled for the host): on 500 random requests — any
/// bytes, names in mixed case, duplicate headers — it agrees with the
/// component byte for byte.
#[tokio::test]
async fn the_native_fingerprint_is_the_components_on_random_requests() {
    let guard = Guard::builder(MemoryStore::new()).build().unwrap();
    let mut rng = fastrand::Rng::with_seed(19);
    let text = |rng: &mut fastrand::Rng, n: usize| -> String {
        (0..rng.usize(..n))
            .map(|_| {
                rng.choice(['a', 'B', '-', '/', '?', '=', 'ü', ' ', '\u{1F600}'])
                    .unwrap()
            })
            .collect()
    };
    for _ in 0..500 {
        let headers = (0..rng.usize(..5))
            .map(|_| {
                let name = text(&mut rng, 8);
                let value = (0..rng.usize(..12)).map(|_| rng.u8(..)).collect();
                (name, value)
            })
            .collect::<Vec<_>>();
        let parts = RequestParts {
            method: text(&mut rng, 8),
            path: text(&mut rng, 30),
            headers: [headers.clone(), headers[..headers.len() / 2].to_vec()].concat(),
            body: (0..rng.usize(..300)).map(|_| rng.u8(..)).collect(),
        };
        assert_eq!(
            guard.fingerprint(&parts).await.unwrap(),
            parts.fingerprint(),
            "{parts:?}"
        );
    }
}

/// The runner must be able to fail: for every scenario, breaking one
/// expectation (a decision, an outcome, an error kind or an effect count)
/// makes it fail at that step.
#[tokio::test]
async fn a_wrong_expectation_fails_the_scenario() {
    for path in scenario_files() {
        let scenario = load(&path);
        let steps = scenario["steps"].as_array().unwrap();
        let mut broken = 0;
        for (i, step) in steps.iter().enumerate() {
            let Some(wrong) = mutate(&step["expect"]) else {
                continue;
            };
            let mut mutant = scenario.clone();
            mutant["steps"][i]["expect"] = wrong;
            let err = run_scenario(&mutant, Arc::new(MemoryStore::new()))
                .await
                .expect_err(&format!("{}: step {i} mutated but passed", path.display()));
            assert!(
                err.starts_with(&format!("step {i} ")),
                "{}: mutated step {i}, failed elsewhere: {err}",
                path.display()
            );
            broken += 1;
        }
        assert!(broken > 0, "{}: no step could be broken", path.display());
    }
}

/// A plausible wrong answer for an expectation, or `None` if there is nothing to flip.
fn mutate(expect: &Value) -> Option<Value> {
    let mut wrong = expect.as_object()?.clone();
    // A decision, an outcome or an error turns into the other of a pair.
    let flipped = [
        ("decision", "proceed", "in-flight"),
        ("outcome", "executed", "replayed"),
        ("error", "stale-claim", "unavailable"),
    ]
    .into_iter()
    .find_map(|(field, one, other)| {
        let was = wrong.get(field)?.as_str()?;
        Some((field, if was == one { other } else { one }))
    });
    if let Some((field, other)) = flipped {
        wrong.insert(field.into(), json!(other));
    } else if wrong.contains_key("ok") {
        wrong.insert("error".into(), json!("unavailable"));
        wrong.remove("ok");
    } else if let Some(absent) = wrong.get("absent").and_then(Value::as_bool) {
        wrong.insert("absent".into(), json!(!absent));
    } else if let Some((name, n)) = wrong
        .iter()
        .find_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
    {
        wrong.insert(name, json!(n + 1));
    } else if let Some((name, text)) = wrong
        .iter()
        .find_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
    {
        wrong.insert(name, json!(format!("{text}!")));
    } else {
        return None;
    }
    Some(Value::Object(wrong))
}

/// A guard host as the scenarios drive it: the guard's calls, the host's
/// high-level `run`, its clock, and its store's faults and records.
/// [`RustHost`] is `idem::Guard` over a `Faulty` store; `composed.rs` has
/// the guard composed with a store component, whose store is inside.
pub(crate) trait GuardHost {
    /// The clock the guard reads (`clock` steps move it).
    fn clock(&self) -> &ManualClock;

    async fn begin(&mut self, key: &str, fingerprint: &str) -> Result<Decision, GuardError>;

    async fn complete(&mut self, claim: Claim, response: Response) -> Result<(), GuardError>;

    async fn release(&mut self, claim: Claim) -> Result<(), GuardError>;

    async fn renew(&mut self, claim: Claim) -> Result<Claim, GuardError>;

    async fn save_checkpoint(
        &mut self,
        claim: Claim,
        checkpoint: Checkpoint,
    ) -> Result<Claim, GuardError>;

    async fn fingerprint(&mut self, parts: &RequestParts) -> Result<String, GuardError>;

    /// From now on the store's `op` fails as `rule` says (a `fault` step).
    fn set_fault(&mut self, op: Op, rule: FaultRule) -> Result<(), String>;

    fn clear_faults(&mut self);

    /// The live record for `key` at the clock's time, read from the store
    /// past its faults (a `peek` step).
    async fn peek(&mut self, key: &str) -> Result<Option<Entry>, String>;

    /// The host's high-level run (`Guard::run_resumable` in the Rust host).
    /// This default is that lifecycle over the calls above, for a host with
    /// no run of its own: begin; on a claim the handler (which counts its
    /// side effect, saves its checkpoints through `save_checkpoint`, then
    /// fails or answers); then `complete`, or `release` if it failed.
    async fn run(&mut self, key: &str, fingerprint: &str, handler: Handler) -> Ran {
        let mut claim = match self.begin(key, fingerprint).await {
            Ok(Decision::Proceed(claim)) => claim,
            Ok(Decision::Replay(response)) => return Ran::outcome(Outcome::Replayed(response)),
            Ok(Decision::InFlight { retry_after_ms }) => {
                return Ran::outcome(Outcome::InFlight {
                    retry_after: std::time::Duration::from_millis(retry_after_ms),
                });
            }
            Ok(Decision::Conflict) => return Ran::outcome(Outcome::Conflict),
            Err(GuardError::InvalidInput(why)) => {
                return Ran::from(Err(RunError::InvalidInput(why)));
            }
            Err(e) => return Ran::outcome(Outcome::Unavailable(e.to_string())),
        };
        let resumed = claim.checkpoint.clone();
        handler.effect.fetch_add(1, Ordering::SeqCst);
        let mut answer = Ok(handler.response);
        for checkpoint in handler.checkpoints {
            match self.save_checkpoint(claim.clone(), checkpoint).await {
                Ok(next) => claim = next,
                Err(e) => {
                    answer = Err(e.to_string());
                    break;
                }
            }
        }
        if handler.fails && answer.is_ok() {
            answer = Err("handler failed".to_owned());
        }
        let result = match answer {
            Ok(response) => match self.complete(claim, response.clone()).await {
                Ok(()) => Ok(Outcome::Executed(response)),
                Err(error) => Err(RunError::NotRecorded { response, error }),
            },
            Err(why) => {
                let _ = self.release(claim).await;
                Err(RunError::Handler(why))
            }
        };
        Ran {
            result,
            resumed: Some(resumed),
        }
    }
}

/// What a `run` step's handler does: adds one to `effect`, saves each of
/// `checkpoints` in order, then fails (`fails`) or answers `response`.
pub(crate) struct Handler {
    effect: Arc<AtomicU64>,
    checkpoints: Vec<Checkpoint>,
    response: Response,
    fails: bool,
}

/// What `run` did, and the checkpoint its handler was handed (`None`: the
/// handler never ran).
pub(crate) struct Ran {
    result: Result<Outcome, RunError<String>>,
    resumed: Option<Option<Checkpoint>>,
}

impl Ran {
    fn outcome(outcome: Outcome) -> Ran {
        Ran::from(Ok(outcome))
    }
}

impl From<Result<Outcome, RunError<String>>> for Ran {
    fn from(result: Result<Outcome, RunError<String>>) -> Ran {
        Ran {
            result,
            resumed: None,
        }
    }
}

/// The scenario's policy.
pub(crate) fn policy(scenario: &Value) -> Result<Policy, String> {
    let policy = &scenario["policy"];
    Ok(Policy {
        lease_ms: policy["lease_ms"].as_u64().ok_or("policy needs lease_ms")?,
        retention_ms: policy["retention_ms"]
            .as_u64()
            .ok_or("policy needs retention_ms")?,
        max_response_bytes: policy["max_response_bytes"]
            .as_u64()
            .ok_or("policy needs max_response_bytes")? as u32,
    })
}

/// The scenario's clock, at its `clock_ms`.
pub(crate) fn clock(scenario: &Value) -> Result<ManualClock, String> {
    Ok(ManualClock::new(
        scenario["clock_ms"]
            .as_u64()
            .ok_or("scenario needs clock_ms")?,
    ))
}

/// `idem::Guard` over a `Faulty` store.
struct RustHost {
    guard: Guard,
    faults: FaultHandle,
    clock: ManualClock,
}

impl RustHost {
    fn new(scenario: &Value, store: Arc<dyn Store>) -> Result<RustHost, String> {
        let policy = policy(scenario)?;
        let clock = clock(scenario)?;
        let (store, faults) = Faulty::new(store);
        let guard = Guard::builder(store)
            .clock(clock.clone())
            .lease(std::time::Duration::from_millis(policy.lease_ms))
            .retention(std::time::Duration::from_millis(policy.retention_ms))
            .max_response_bytes(policy.max_response_bytes)
            .build()
            .map_err(|e| format!("policy: {e}"))?;
        Ok(RustHost {
            guard,
            faults,
            clock,
        })
    }
}

impl GuardHost for RustHost {
    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    async fn begin(&mut self, key: &str, fingerprint: &str) -> Result<Decision, GuardError> {
        self.guard.begin(key, fingerprint).await
    }

    async fn complete(&mut self, claim: Claim, response: Response) -> Result<(), GuardError> {
        self.guard
            .complete(claim, response)
            .await
            .1
            .map(|_expires_at_ms| ())
    }

    async fn release(&mut self, claim: Claim) -> Result<(), GuardError> {
        self.guard.release(claim).await
    }

    async fn renew(&mut self, claim: Claim) -> Result<Claim, GuardError> {
        self.guard.renew(claim).await
    }

    async fn save_checkpoint(
        &mut self,
        claim: Claim,
        checkpoint: Checkpoint,
    ) -> Result<Claim, GuardError> {
        self.guard.save_checkpoint(claim, checkpoint).await
    }

    async fn fingerprint(&mut self, parts: &RequestParts) -> Result<String, GuardError> {
        self.guard.fingerprint(parts).await
    }

    fn set_fault(&mut self, op: Op, rule: FaultRule) -> Result<(), String> {
        self.faults.set(op, rule).map_err(|e| e.to_string())
    }

    fn clear_faults(&mut self) {
        self.faults.clear_all();
    }

    async fn peek(&mut self, key: &str) -> Result<Option<Entry>, String> {
        self.guard
            .store()
            .get(key, self.clock.now_ms())
            .await
            .map_err(|e| e.to_string())
    }

    /// `Guard::run_resumable` with the handler.
    async fn run(&mut self, key: &str, fingerprint: &str, handler: Handler) -> Ran {
        let resumed = Arc::new(std::sync::Mutex::new(None));
        let handed = resumed.clone();
        let Handler {
            effect,
            checkpoints,
            response,
            fails,
        } = handler;
        let handler = move |progress: idem::Progress| async move {
            *handed.lock().unwrap() = Some(progress.resumed().cloned());
            effect.fetch_add(1, Ordering::SeqCst);
            for Checkpoint { phase, data } in checkpoints {
                progress
                    .checkpoint(phase, data)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if fails {
                Err("handler failed".to_owned())
            } else {
                Ok(response)
            }
        };
        let result = self.guard.run_resumable(key, fingerprint, handler).await;
        let resumed = resumed.lock().unwrap().clone();
        Ran { result, resumed }
    }
}

/// Runs one scenario on `store` through `idem::Guard`; returns how many
/// steps were checked, or the first disagreement as `step N (op): ...`.
async fn run_scenario(scenario: &Value, store: Arc<dyn Store>) -> Result<usize, String> {
    play(scenario, &mut RustHost::new(scenario, store)?).await
}

/// Runs one scenario on `host` (fresh: an empty store, no faults, its clock
/// at the scenario's `clock_ms`, the scenario's policy); returns how many
/// steps were checked, or the first disagreement as `step N (op): ...`.
pub(crate) async fn play<H: GuardHost>(scenario: &Value, host: &mut H) -> Result<usize, String> {
    let mut runner = Runner {
        host,
        claims: BTreeMap::new(),
        effects: BTreeMap::new(),
    };
    let steps = scenario["steps"].as_array().ok_or("scenario needs steps")?;
    let mut checked = 0;
    for (i, step) in steps.iter().enumerate() {
        let op = step["op"].as_str().unwrap_or("?");
        let times = step.get("times").and_then(Value::as_u64).unwrap_or(1);
        for _ in 0..times {
            let actual = runner
                .step(step)
                .await
                .map_err(|e| format!("step {i} ({op}): {e}"))?;
            if let Some(actual) = actual {
                let expect = step
                    .get("expect")
                    .ok_or_else(|| format!("step {i} ({op}): no expect"))?;
                matches(expect, &actual, &runner.claims)
                    .map_err(|e| format!("step {i} ({op}): {e}; got {actual}"))?;
                checked += 1;
            }
        }
    }
    Ok(checked)
}

/// One scenario's run: its host, and the claims and side-effect counts its
/// steps name.
struct Runner<'h, H> {
    host: &'h mut H,
    claims: BTreeMap<String, Claim>,
    effects: BTreeMap<String, Arc<AtomicU64>>,
}

impl<H: GuardHost> Runner<'_, H> {
    /// Performs one step; returns the normalized result to check, if the op has one.
    #[allow(clippy::too_many_lines)] // one arm per op, as in conformance/README.md
    async fn step(&mut self, step: &Value) -> Result<Option<Value>, String> {
        let op = step["op"].as_str().ok_or("step needs op")?;
        match op {
            "clock" => {
                let clock = self.host.clock();
                if let Some(ms) = step.get("set_ms").and_then(Value::as_u64) {
                    clock.set(ms);
                } else if let Some(ms) = step.get("advance_ms").and_then(Value::as_u64) {
                    clock.advance(std::time::Duration::from_millis(ms));
                } else {
                    return Err("clock needs set_ms or advance_ms".into());
                }
                Ok(None)
            }
            "fault" => {
                let op: Op = step["primitive"]
                    .as_str()
                    .ok_or("fault needs primitive")?
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                let mut rule = match step["kind"].as_str() {
                    Some("error") => {
                        FaultRule::error(step["message"].as_str().unwrap_or("injected fault"))
                    }
                    Some("lost") => FaultRule::lost(),
                    other => return Err(format!("unknown fault kind {other:?}")),
                };
                if let Some(n) = step.get("count").and_then(Value::as_u64) {
                    rule = rule.times(n);
                }
                self.host.set_fault(op, rule)?;
                Ok(None)
            }
            "clear_faults" => {
                self.host.clear_faults();
                Ok(None)
            }
            "begin" => {
                let result = self
                    .host
                    .begin(&text(&step["key"])?, &text(&step["fingerprint"])?)
                    .await;
                if let (Ok(Decision::Proceed(claim)), Some(name)) = (&result, step["as"].as_str()) {
                    self.claims.insert(name.to_owned(), claim.clone());
                }
                Ok(Some(match result {
                    Ok(decision) => decision_json(&decision),
                    Err(e) => error_json(&e),
                }))
            }
            "complete" => {
                let claim = self.claim(step)?;
                let result = self
                    .host
                    .complete(claim, response(&step["response"])?)
                    .await;
                Ok(Some(unit_json(&result)))
            }
            "release" => {
                let claim = self.claim(step)?;
                Ok(Some(unit_json(&self.host.release(claim).await)))
            }
            "renew" => {
                let claim = self.claim(step)?;
                let renewed = self.host.renew(claim).await;
                Ok(Some(self.keep_claim(step, renewed)))
            }
            "checkpoint" => {
                let claim = self.claim(step)?;
                let checkpoint = Checkpoint {
                    phase: text(&step["phase"])?,
                    data: bytes(&step["data"])?,
                };
                let next = self.host.save_checkpoint(claim, checkpoint).await;
                Ok(Some(self.keep_claim(step, next)))
            }
            "run" => self.run(step).await.map(Some),
            "effects" => {
                let expect = step["expect"].as_object().ok_or("effects needs expect")?;
                let counts: Map<String, Value> = expect
                    .keys()
                    .map(|name| {
                        (
                            name.clone(),
                            json!(
                                self.effects
                                    .get(name)
                                    .map_or(0, |n| n.load(Ordering::SeqCst))
                            ),
                        )
                    })
                    .collect();
                Ok(Some(Value::Object(counts)))
            }
            "peek" => {
                let key = text(&step["key"])?;
                let entry = self.host.peek(&key).await?;
                Ok(Some(match entry {
                    None => json!({"absent": true}),
                    Some(entry) => {
                        let r = &entry.record;
                        let mut v = json!({
                            "absent": false,
                            "state": match r.state { State::Processing => "processing", State::Done => "done" },
                            "version": entry.version,
                            "fingerprint": r.fingerprint,
                            "holder": r.holder,
                            "lease_until_ms": r.lease_until_ms,
                            "expires_at_ms": r.expires_at_ms,
                            "checkpoint": checkpoint_json(r.checkpoint.as_ref()),
                        });
                        if let Some(resp) = &r.response {
                            merge(&mut v, response_json(resp));
                        }
                        v
                    }
                }))
            }
            "fingerprint" => {
                let req = &step["request"];
                let parts = RequestParts {
                    method: text(&req["method"])?,
                    path: text(&req["path"])?,
                    headers: headers(&req["headers"])?,
                    body: bytes(&req["body"])?,
                };
                Ok(Some(match self.host.fingerprint(&parts).await {
                    // The host's native fingerprint (the gateway's) must agree.
                    Ok(fp) if fp != parts.fingerprint() => {
                        return Err(format!(
                            "the component says {fp}, the native code {}",
                            parts.fingerprint()
                        ));
                    }
                    Ok(fp) => json!({"fingerprint": fp}),
                    Err(e) => error_json(&e),
                }))
            }
            other => Err(format!("unknown op {other:?}")),
        }
    }

    /// The step's named claim, with the fields its `with` replaces (a
    /// claim as a careless or hostile caller passes it back).
    fn claim(&self, step: &Value) -> Result<Claim, String> {
        let name = step["claim"].as_str().ok_or("needs claim")?;
        let mut claim = self
            .claims
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no claim named {name:?}"))?;
        if let Some(with) = step["with"].as_object() {
            for (field, value) in with {
                let number = || {
                    value
                        .as_str()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| format!("with.{field}: a u64 as a decimal string"))
                };
                match field.as_str() {
                    "holder" => claim.holder = number()?,
                    "fence" => claim.fence = number()?,
                    other => return Err(format!("with.{other}: not a field a step replaces")),
                }
            }
        }
        Ok(claim)
    }

    /// What a renewal or a checkpoint returned; a new claim is kept under
    /// the step's `as` name.
    fn keep_claim(&mut self, step: &Value, result: Result<Claim, GuardError>) -> Value {
        match result {
            Ok(next) => {
                let actual = claim_json(&next, json!({"ok": true}));
                if let Some(name) = step["as"].as_str() {
                    self.claims.insert(name.to_owned(), next);
                }
                actual
            }
            Err(e) => error_json(&e),
        }
    }

    /// The host's `run` with a handler that counts its side effect and
    /// saves the step's `checkpoints`.
    async fn run(&mut self, step: &Value) -> Result<Value, String> {
        let name = step["effect"].as_str().unwrap_or("effect").to_owned();
        let handler = Handler {
            effect: self.effects.entry(name).or_default().clone(),
            response: response(&step["response"])?,
            fails: step["fails"].as_bool().unwrap_or(false),
            checkpoints: match step.get("checkpoints") {
                None => Vec::new(),
                Some(list) => list
                    .as_array()
                    .ok_or("checkpoints takes a list")?
                    .iter()
                    .map(|c| {
                        Ok(Checkpoint {
                            phase: text(&c["phase"])?,
                            data: bytes(&c["data"])?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?,
            },
        };
        let Ran { result, resumed } = self
            .host
            .run(&text(&step["key"])?, &text(&step["fingerprint"])?, handler)
            .await;
        let resumed = resumed.flatten();
        Ok(match result {
            Ok(Outcome::Executed(r)) => with(
                json!({"outcome": "executed", "resumed": checkpoint_json(resumed.as_ref())}),
                response_json(&r),
            ),
            Ok(Outcome::Replayed(r)) => with(json!({"outcome": "replayed"}), response_json(&r)),
            Ok(Outcome::InFlight { retry_after }) => {
                json!({"outcome": "in-flight", "retry_after_ms": retry_after.as_millis() as u64})
            }
            Ok(Outcome::Conflict) => json!({"outcome": "conflict"}),
            Ok(Outcome::Unavailable(message)) => {
                json!({"outcome": "unavailable", "message": message})
            }
            Err(RunError::InvalidInput(message)) => {
                json!({"error": "invalid-input", "message": message})
            }
            Err(RunError::NotRecorded { error, .. }) => {
                with(json!({"outcome": "not-recorded"}), error_json(&error))
            }
            Err(RunError::Handler(_)) => json!({"outcome": "handler-failed"}),
        })
    }
}

fn decision_json(decision: &Decision) -> Value {
    match decision {
        Decision::Proceed(claim) => claim_json(claim, json!({"decision": "proceed"})),
        Decision::Replay(r) => with(json!({"decision": "replay"}), response_json(r)),
        Decision::InFlight { retry_after_ms } => {
            json!({"decision": "in-flight", "retry_after_ms": retry_after_ms})
        }
        Decision::Conflict => json!({"decision": "conflict"}),
    }
}

fn claim_json(claim: &Claim, base: Value) -> Value {
    with(
        base,
        json!({
            "fence": claim.fence,
            "holder": claim.holder,
            "lease_until_ms": claim.lease_until_ms,
            "expires_at_ms": claim.expires_at_ms,
            "checkpoint": checkpoint_json(claim.checkpoint.as_ref()),
        }),
    )
}

/// `null`, or `{"phase", "data_hex"}` (matched against `{"phase", "data"}`).
fn checkpoint_json(checkpoint: Option<&Checkpoint>) -> Value {
    checkpoint.map_or(
        Value::Null,
        |c| json!({"phase": c.phase, "data_hex": hex(&c.data)}),
    )
}

fn response_json(r: &Response) -> Value {
    json!({
        "status": r.status,
        "headers": r.headers.iter().map(|(n, v)| json!([n, String::from_utf8_lossy(v)])).collect::<Vec<_>>(),
        "body_hex": hex(&r.body),
    })
}

fn error_json(e: &GuardError) -> Value {
    let (kind, message) = match e {
        GuardError::Unavailable(m) => ("unavailable", m),
        GuardError::InvalidInput(m) => ("invalid-input", m),
        GuardError::StaleClaim(m) => ("stale-claim", m),
    };
    json!({"error": kind, "message": message})
}

fn unit_json(result: &Result<(), GuardError>) -> Value {
    match result {
        Ok(()) => json!({"ok": true}),
        Err(e) => error_json(e),
    }
}

fn with(mut a: Value, b: Value) -> Value {
    merge(&mut a, b);
    a
}

fn merge(a: &mut Value, b: Value) {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
}

/// Checks every field of `expect` against `actual`, as `conformance/README.md`
/// says; `claims` are the scenario's kept claims (for `holder_of`).
fn matches(expect: &Value, actual: &Value, claims: &BTreeMap<String, Claim>) -> Result<(), String> {
    let expect = expect.as_object().ok_or("expect must be an object")?;
    for (name, want) in expect {
        match name.as_str() {
            "contains" => {
                let message = actual["message"].as_str().ok_or("no message to search")?;
                let wants: Vec<&Value> = match want {
                    Value::Array(items) => items.iter().collect(),
                    one => vec![one],
                };
                for w in wants {
                    let w = w.as_str().ok_or("contains takes strings")?;
                    if !message.contains(w) {
                        return Err(format!("message does not contain {w:?}"));
                    }
                }
            }
            "fence_above" => {
                let fence = actual["fence"].as_u64().ok_or("no fence")?;
                if fence <= want.as_u64().ok_or("fence_above takes a number")? {
                    return Err(format!("fence {fence} is not above {want}"));
                }
            }
            "body" => {
                let want = hex(&bytes(want)?);
                if actual["body_hex"] != json!(want) {
                    return Err(format!("body is {}, expected {want}", actual["body_hex"]));
                }
            }
            "checkpoint" | "resumed" => {
                let want = match want {
                    Value::Null => Value::Null,
                    w => json!({"phase": text(&w["phase"])?, "data_hex": hex(&bytes(&w["data"])?)}),
                };
                if actual.get(name) != Some(&want) {
                    return Err(format!(
                        "{name} is {}, expected {want}",
                        actual.get(name).unwrap_or(&Value::Null)
                    ));
                }
            }
            "holder_of" | "holder_not_of" => {
                let of = want.as_str().ok_or("holder_of takes a claim's name")?;
                let theirs = claims
                    .get(of)
                    .ok_or_else(|| format!("no claim named {of:?}"))?
                    .holder;
                let holder = actual["holder"].as_u64().ok_or("no holder")?;
                if (holder == theirs) != (name == "holder_of") {
                    return Err(format!(
                        "holder {holder} vs {of:?}'s {theirs}: {name} fails"
                    ));
                }
            }
            _ => {
                if actual.get(name) != Some(want) {
                    return Err(format!(
                        "{name} is {}, expected {want}",
                        actual.get(name).unwrap_or(&Value::Null)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A string field: a JSON string, or `{"repeat": S, "times": N}`.
fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Object(o) if o.contains_key("repeat") => {
            let s = o["repeat"].as_str().ok_or("repeat takes a string")?;
            Ok(s.repeat(o["times"].as_u64().ok_or("repeat needs times")? as usize))
        }
        other => Err(format!("expected a string, got {other}")),
    }
}

/// A bytes field: a UTF-8 string, `{"hex": H}`, or `{"repeat": S, "times": N}`.
fn bytes(v: &Value) -> Result<Vec<u8>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Object(o) if o.contains_key("hex") => {
            let h = o["hex"].as_str().ok_or("hex takes a string")?;
            (0..h.len())
                .step_by(2)
                .map(|i| {
                    u8::from_str_radix(h.get(i..i + 2).ok_or("odd hex")?, 16)
                        .map_err(|e| e.to_string())
                })
                .collect()
        }
        other => text(other).map(String::into_bytes),
    }
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut out, x| {
            let _ = write!(out, "{x:02x}");
            out
        })
}

fn headers(v: &Value) -> Result<Vec<(String, Vec<u8>)>, String> {
    let Some(items) = v.as_array() else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .map(|pair| Ok((text(&pair[0])?, bytes(&pair[1])?)))
        .collect()
}

fn response(v: &Value) -> Result<Response, String> {
    Ok(Response {
        status: v["status"].as_u64().ok_or("response needs status")? as u16,
        headers: headers(&v["headers"])?,
        body: bytes(&v["body"])?,
    })
}
