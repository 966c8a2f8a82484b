//! A store is a component: the guard composed with the reference store
//! component (`examples/store-component`, composed by
//! `scripts/compose-store.sh` with `wac`), hosted with wasmtime as a third
//! party would host it. The host gives it only `clock`, `random` and the
//! `response` resource (world `idem:guard/idem-with-store`); the records and
//! response bytes live in the instance's memory, so each scenario gets one
//! instance of its own (no pool: a second instance would be another store).
//!
//! Every conformance scenario runs on the tests' composition
//! (`guard-with-memory-store.wasm`, which also exports the store's `testing`
//! hooks for `fault` and `peek` steps), through the same runner as the Rust
//! host (`scenarios::play`); those without such steps also run on the
//! product composition itself (`idem-with-memory-store.wasm`, the output
//! of `wac plug`).

use crate::scenarios::{self, GuardHost};
use idem::{
    Checkpoint, Claim, Clock, Decision, Entry, FaultKind, FaultRule, GuardError, ManualClock, Op,
    RequestParts, Response,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use wasmtime::component::{Component, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store};

#[allow(clippy::pedantic)] // generated
mod bindings {
    wasmtime::component::bindgen!({
        path: ["../wit", "../examples/store-component/wit"],
        world: "idem:store-example/guard-with-memory-store",
        with: { "idem:guard/types.response": super::Held },
        imports: { "idem:guard/types": trappable },
    });
}

use bindings::exports::idem::guard::guard as wit;
use bindings::exports::idem::guard::store as wit_store;
use bindings::exports::idem::store_example::testing;
use bindings::idem::guard::types as wit_types;

idem_guest::wit_conversions!(
    types: wit_types,
    store: wit_store,
    guard: wit,
    response: Resource<Held>,
);

/// The host side of `idem:guard/types`' `response`: the response itself.
pub struct Held(Response);

/// What the composed component's imports reach.
struct State {
    table: ResourceTable,
    clock: ManualClock,
}

impl State {
    fn response(&self, handle: &Resource<Held>) -> wasmtime::Result<&Response> {
        Ok(&self.table.get(handle)?.0)
    }
}

impl wit_types::Host for State {}

impl wit_types::HostResponse for State {
    fn new(
        &mut self,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    ) -> wasmtime::Result<Resource<Held>> {
        let response = Response {
            status,
            headers,
            body,
        };
        Ok(self.table.push(Held(response))?)
    }

    fn status(&mut self, response: Resource<Held>) -> wasmtime::Result<u16> {
        Ok(self.response(&response)?.status)
    }

    fn size(&mut self, response: Resource<Held>) -> wasmtime::Result<u64> {
        Ok(self.response(&response)?.size_bytes() as u64)
    }

    fn same_as(
        &mut self,
        response: Resource<Held>,
        other: Resource<Held>,
    ) -> wasmtime::Result<bool> {
        Ok(self.response(&response)? == self.response(&other)?)
    }

    fn headers(&mut self, response: Resource<Held>) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        Ok(self.response(&response)?.headers.clone())
    }

    fn body(&mut self, response: Resource<Held>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.response(&response)?.body.clone())
    }

    fn drop(&mut self, response: Resource<Held>) -> wasmtime::Result<()> {
        self.table.delete(response)?;
        Ok(())
    }
}

impl bindings::idem::guard::clock::Host for State {
    fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}

impl bindings::idem::guard::random::Host for State {
    fn random_u64(&mut self) -> u64 {
        fastrand::u64(..)
    }
}

/// The two compositions, built once per test process: the tests' (with the
/// store's exports) and `wac plug`'s (the guard alone).
struct Compositions {
    engine: Engine,
    linker: Linker<State>,
    testing: Component,
    plugged: Component,
}

fn compositions() -> &'static Compositions {
    static BUILT: OnceLock<Compositions> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = compose();
        let engine = Engine::default();
        let mut linker = Linker::new(&engine);
        bindings::GuardWithMemoryStore::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |state| state,
        )
        .unwrap();
        let load = |name: &str| {
            Component::from_file(&engine, dir.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e:?}"))
        };
        Compositions {
            testing: load("guard-with-memory-store.wasm"),
            plugged: load("idem-with-memory-store.wasm"),
            engine,
            linker,
        }
    })
}

/// Runs `scripts/compose-store.sh` (a rebuild of what changed; wac is
/// installed once per machine) and returns its output directory.
fn compose() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/store-component");
    let status = std::process::Command::new("bash")
        .arg(root.join("scripts/compose-store.sh"))
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run scripts/compose-store.sh");
    assert!(
        status.success(),
        "scripts/compose-store.sh failed: {status}"
    );
    out
}

/// One instance of a composition: the guard with its store inside.
struct ComposedHost {
    store: Store<State>,
    guard: wit::Guest,
    /// The store's own exports (`None` in `wac plug`'s composition).
    exports: Option<(wit_store::Guest, testing::Guest)>,
    policy: wit::Policy,
}

impl ComposedHost {
    fn new(component: &Component, scenario: &Value) -> Result<ComposedHost, String> {
        let built = compositions();
        let clock = scenarios::clock(scenario)?;
        let policy = scenarios::policy(scenario)?.into();
        let mut store = Store::new(
            &built.engine,
            State {
                table: ResourceTable::new(),
                clock,
            },
        );
        let pre = built
            .linker
            .instantiate_pre(component)
            .map_err(|e| format!("link: {e:?}"))?;
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| format!("instantiate: {e:?}"))?;
        let guard = wit::GuestIndices::new(&pre)
            .and_then(|indices| indices.load(&mut store, &instance))
            .map_err(|e| format!("the guard's exports: {e:?}"))?;
        let exports = match (
            wit_store::GuestIndices::new(&pre),
            testing::GuestIndices::new(&pre),
        ) {
            (Ok(s), Ok(t)) => Some((
                s.load(&mut store, &instance).map_err(|e| e.to_string())?,
                t.load(&mut store, &instance).map_err(|e| e.to_string())?,
            )),
            _ => None,
        };
        Ok(ComposedHost {
            store,
            guard,
            exports,
            policy,
        })
    }

    fn exports(&self) -> Result<&(wit_store::Guest, testing::Guest), String> {
        self.exports
            .as_ref()
            .ok_or_else(|| "this composition does not export the store".to_owned())
    }

    /// A response the guest is handed (own).
    fn lend(&mut self, response: Response) -> Resource<Held> {
        self.store.data_mut().table.push(Held(response)).unwrap()
    }

    /// A response the guest handed back (own), out of the table.
    fn take(&mut self, handle: Resource<Held>) -> Result<Response, String> {
        let held = self.store.data_mut().table.delete(handle);
        held.map(|held| held.0)
            .map_err(|e| format!("a handle the host does not hold: {e}"))
    }
}

/// A trap is a bug in the composition: the step fails with it.
fn trapped(e: &wasmtime::Error) -> GuardError {
    GuardError::Unavailable(format!("the composed component trapped: {e:?}"))
}

impl GuardHost for ComposedHost {
    fn clock(&self) -> &ManualClock {
        &self.store.data().clock
    }

    async fn begin(&mut self, key: &str, fingerprint: &str) -> Result<Decision, GuardError> {
        let decision = self
            .guard
            .call_begin(&mut self.store, key, fingerprint, self.policy)
            .map_err(|e| trapped(&e))?
            .map_err(GuardError::from)?;
        model_decision(decision)
            .try_map_response(|handle| self.take(handle))
            .map_err(GuardError::Unavailable)
    }

    async fn complete(&mut self, claim: Claim, response: Response) -> Result<(), GuardError> {
        let response = self.lend(response);
        self.guard
            .call_complete(&mut self.store, &claim.into(), response, self.policy)
            .map_err(|e| trapped(&e))?
            .map_err(Into::into)
    }

    async fn release(&mut self, claim: Claim) -> Result<(), GuardError> {
        self.guard
            .call_release(&mut self.store, &claim.into())
            .map_err(|e| trapped(&e))?
            .map_err(Into::into)
    }

    async fn renew(&mut self, claim: Claim) -> Result<Claim, GuardError> {
        self.guard
            .call_renew(&mut self.store, &claim.into(), self.policy)
            .map_err(|e| trapped(&e))?
            .map(Into::into)
            .map_err(Into::into)
    }

    async fn save_checkpoint(
        &mut self,
        claim: Claim,
        checkpoint: Checkpoint,
    ) -> Result<Claim, GuardError> {
        self.guard
            .call_save_checkpoint(
                &mut self.store,
                &claim.into(),
                &checkpoint.into(),
                self.policy,
            )
            .map_err(|e| trapped(&e))?
            .map(Into::into)
            .map_err(Into::into)
    }

    async fn fingerprint(&mut self, parts: &RequestParts) -> Result<String, GuardError> {
        let parts = wit::RequestParts {
            method: parts.method.clone(),
            path: parts.path.clone(),
            headers: parts.headers.clone(),
            body: parts.body.clone(),
        };
        self.guard
            .call_fingerprint(&mut self.store, &parts)
            .map_err(|e| trapped(&e))
    }

    fn set_fault(&mut self, op: Op, rule: FaultRule) -> Result<(), String> {
        let primitive = match op {
            Op::Get => testing::Primitive::Get,
            Op::Insert => testing::Primitive::Insert,
            Op::Replace => testing::Primitive::Replace,
            Op::Delete => testing::Primitive::Delete,
        };
        let kind = match rule.kind {
            FaultKind::Error => testing::FaultKind::Error,
            FaultKind::Lost => testing::FaultKind::Lost,
            other => return Err(format!("the store component has no {other:?} fault")),
        };
        let count = rule
            .count
            .map(|n| u32::try_from(n).map_err(|_| format!("count {n} is over a u32")))
            .transpose()?;
        let testing = self.exports()?.1.clone();
        testing
            .call_set_fault(&mut self.store, primitive, kind, &rule.message, count)
            .map_err(|e| format!("{e:?}"))
    }

    fn clear_faults(&mut self) {
        let testing = self.exports().expect("clear_faults").1.clone();
        testing.call_clear_faults(&mut self.store).unwrap();
    }

    async fn peek(&mut self, key: &str) -> Result<Option<Entry>, String> {
        let testing = self.exports()?.1.clone();
        let now = self.store.data().clock.now_ms();
        let entry = testing
            .call_peek(&mut self.store, key, now)
            .map_err(|e| format!("{e:?}"))?;
        entry
            .map(|entry| {
                idem_guest::model::Entry::<Resource<Held>>::from(entry)
                    .try_map_response(|handle| self.take(handle))
            })
            .transpose()
    }
}

fn model_decision(decision: wit::Decision) -> idem_guest::model::Decision<Resource<Held>> {
    decision.into()
}

/// A scenario as the product composition can take it, if it can: one with
/// no `fault` or `clear_faults` step (those need the store's hooks), with
/// its `peek` steps left out (they only read the store; every guard call
/// stays).
fn without_hooks(scenario: &Value) -> Option<Value> {
    let steps = scenario["steps"].as_array()?;
    let op = |step: &Value| step["op"].as_str().unwrap_or("").to_owned();
    if steps
        .iter()
        .any(|step| matches!(op(step).as_str(), "fault" | "clear_faults"))
    {
        return None;
    }
    let mut taken = scenario.clone();
    taken["steps"] = steps
        .iter()
        .filter(|step| op(step) != "peek")
        .cloned()
        .collect();
    Some(taken)
}

/// Runs `scenarios` on a fresh instance of `component` each; panics naming
/// every one that failed. Returns the steps checked.
async fn every_scenario_passes(component: &Component, scenarios: &[(PathBuf, Value)]) -> usize {
    let mut failures = Vec::new();
    let mut steps = 0;
    for (path, scenario) in scenarios {
        let name = path.file_name().unwrap().to_string_lossy();
        let played = match ComposedHost::new(component, scenario) {
            Ok(mut host) => scenarios::play(scenario, &mut host).await,
            Err(why) => Err(why),
        };
        match played {
            Ok(n) => steps += n,
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed on the composed component:\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n")
    );
    steps
}

fn every_scenario() -> Vec<(PathBuf, Value)> {
    scenarios::scenario_files()
        .into_iter()
        .map(|path| {
            let scenario = scenarios::load(&path);
            (path, scenario)
        })
        .collect()
}

#[tokio::test]
async fn every_conformance_scenario_passes_on_the_guard_composed_with_a_store_component() {
    let all = every_scenario();
    assert!(all.len() >= 20, "found only {} scenario files", all.len());
    let steps = every_scenario_passes(&compositions().testing, &all).await;
    assert!(steps > 100, "only {steps} checked steps");
}

/// `wac plug`'s output is what a host loads: it links with nothing but
/// `clock`, `random` and `types`, and passes every scenario it can run
/// without the store's hooks.
#[tokio::test]
async fn the_plugged_composition_alone_passes_every_scenario_without_faults() {
    let runnable: Vec<_> = every_scenario()
        .into_iter()
        .filter_map(|(path, scenario)| Some((path, without_hooks(&scenario)?)))
        .collect();
    assert!(runnable.len() >= 15, "only {} scenarios", runnable.len());
    let plugged = &compositions().plugged;
    let host = ComposedHost::new(plugged, &runnable[0].1).unwrap();
    assert!(host.exports.is_none(), "wac plug exports the guard alone");
    let steps = every_scenario_passes(plugged, &runnable).await;
    assert!(steps > 50, "only {steps} checked steps");
}

/// The guard never calls `delete` (hosts use it for operators), so the
/// scenarios do not reach it: here it is through the composition's store
/// export, with 0.3's `now-ms`. A failing step names what it expected.
#[tokio::test]
async fn the_store_components_delete_follows_the_contract() {
    let scenario = serde_json::json!({
        "policy": {"lease_ms": 1000, "retention_ms": 10000, "max_response_bytes": 1024},
        "clock_ms": 1_000_000,
        "steps": [],
    });
    let mut host = ComposedHost::new(&compositions().testing, &scenario).unwrap();
    let (store, _) = host.exports.clone().unwrap();
    let now = || 1_000_000;
    let delete = |host: &mut ComposedHost, key: &str, version: Option<u64>, now_ms: u64| {
        store
            .call_delete(&mut host.store, key, version, now_ms)
            .unwrap()
    };
    let Ok(Decision::Proceed(claim)) = host.begin("k", "fp").await else {
        panic!("a first begin claims the key");
    };
    assert_eq!(claim.fence, 1);
    assert!(
        matches!(delete(&mut host, "k", Some(2), now()), Ok(false)),
        "another version: not removed"
    );
    assert!(host.peek("k").await.unwrap().is_some());
    assert!(matches!(delete(&mut host, "k", Some(1), now()), Ok(true)));
    assert!(host.peek("k").await.unwrap().is_none(), "removed");
    assert!(
        matches!(delete(&mut host, "k", None, now()), Ok(false)),
        "absent"
    );
    assert!(
        matches!(host.begin("k", "fp").await, Ok(Decision::Proceed(c)) if c.fence == 1),
        "the key is new again"
    );
    // At its expiry instant the record is absent to delete too.
    let expires = 1_000_000 + 10_000;
    assert!(matches!(delete(&mut host, "k", None, expires), Ok(false)));
    assert!(
        matches!(delete(&mut host, "k", None, expires - 1), Ok(false)),
        "freed"
    );

    // Its faults: an error applies nothing, a lost reply applies.
    host.begin("f", "fp").await.unwrap();
    let fail_once = |kind, message: &str| FaultRule {
        kind,
        message: message.into(),
        count: Some(1),
        ..FaultRule::default()
    };
    host.set_fault(Op::Delete, fail_once(FaultKind::Error, "disk on fire"))
        .unwrap();
    let failed = delete(&mut host, "f", None, now());
    assert!(
        matches!(&failed, Err(wit_store::StoreError::Unavailable(why)) if why.contains("disk on fire") && why.contains("delete")),
        "{failed:?}"
    );
    assert!(host.peek("f").await.unwrap().is_some(), "not applied");
    host.set_fault(Op::Delete, fail_once(FaultKind::Lost, ""))
        .unwrap();
    assert!(matches!(
        delete(&mut host, "f", None, now()),
        Err(wit_store::StoreError::Unavailable(_))
    ));
    assert!(host.peek("f").await.unwrap().is_none(), "applied");
}
