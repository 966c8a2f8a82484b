//! The guard's cost: through the WebAssembly component versus a native build
//! of the very same pure guest modules, on the same memory store, side by side.
//!
//! `cargo bench -p idem --bench guard`

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use idem::store::{AsyncOnly, MemoryStore, SyncStore};
use idem::testing::{MISBEHAVING_COMPONENT, large, paid};
use idem::{Clock, Decision, Entry, Guard, Limits, LocalClock, Policy, Record, Response, Runtime};
use idem_guest::guard::{self as native, Primitives};
use idem_guest::model::{InsertOutcome, StoreFailure};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The memory store, called synchronously, as the native guard's primitives.
struct Native<'a> {
    store: &'a MemoryStore,
}

impl Primitives for Native<'_> {
    type Response = idem::Response;

    fn now_ms(&mut self) -> u64 {
        LocalClock.now_ms()
    }
    fn random_u64(&mut self) -> u64 {
        fastrand::u64(..)
    }
    fn get(&mut self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreFailure> {
        Ok(self.store.get_now(key, now_ms).unwrap())
    }
    fn insert(
        &mut self,
        key: &str,
        record: &Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreFailure> {
        Ok(self.store.insert_now(key, record.clone(), now_ms).unwrap())
    }
    fn replace(
        &mut self,
        key: &str,
        expected_version: u64,
        record: &Record,
        now_ms: u64,
    ) -> Result<bool, StoreFailure> {
        Ok(self
            .store
            .replace_now(key, expected_version, record.clone(), now_ms)
            .unwrap())
    }
}

/// The component rows run with both responses: the 4-byte one, and a
/// 64 KiB one (`_64k`), which shows what a response's size costs a call.
const SIZES: [(&str, MakeResponse); 2] = [("", paid), ("_64k", large)];

type MakeResponse = fn() -> Response;

/// New keys are claimed in chunks; between chunks, untimed, the chunk's keys
/// are deleted again. Every variant thus claims into a store of the same
/// small size, instead of one that grows by millions of keys over a run
/// (which would measure hash-map growth, not the guard).
const CHUNK: u64 = 1_000;

fn new_keys(iters: u64, store: &MemoryStore, mut run_chunk: impl FnMut(&[String])) -> Duration {
    let keys: Vec<String> = (0..CHUNK).map(|i| format!("order-{i}")).collect();
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let chunk = &keys[..CHUNK.min(iters - done) as usize];
        let start = Instant::now();
        run_chunk(chunk);
        total += start.elapsed();
        for key in chunk {
            store.delete_now(key, None, LocalClock.now_ms()).unwrap();
        }
        done += chunk.len() as u64;
    }
    total
}

/// A guard over `store` through the component: the sync flavour (the memory
/// store answers without I/O), or, wrapped in `AsyncOnly`, the async
/// flavour that network and disk stores use.
fn component_guard(store: &MemoryStore, flavour: &str) -> Guard {
    match flavour {
        "component" => Guard::builder(store.clone()).build().unwrap(),
        "component-async" => Guard::builder(AsyncOnly::new(store.clone()))
            .build()
            .unwrap(),
        _ => unreachable!(),
    }
}

const FLAVOURS: [&str; 2] = ["component", "component-async"];

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policy = Policy::default();
    let mut group = c.benchmark_group("guard");
    group
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));

    // A guarded op on a new key: begin (claim) + complete.
    {
        let store = MemoryStore::new();
        group.bench_function(BenchmarkId::new("new_key", "native"), |b| {
            b.iter_custom(|iters| {
                new_keys(iters, &store, |keys| {
                    for key in keys {
                        let mut p = Native { store: &store };
                        let Ok(Decision::Proceed(claim)) =
                            native::begin(&mut p, key, "fp", &policy)
                        else {
                            panic!()
                        };
                        native::complete(&mut p, &claim, paid(), &policy).unwrap();
                    }
                })
            });
        });
    }
    for (row, response) in SIZES {
        for flavour in FLAVOURS {
            let store = MemoryStore::new();
            let guard = component_guard(&store, flavour);
            group.bench_function(BenchmarkId::new(format!("new_key{row}"), flavour), |b| {
                b.iter_custom(|iters| {
                    new_keys(iters, &store, |keys| {
                        rt.block_on(async {
                            for key in keys {
                                let Ok(Decision::Proceed(claim)) = guard.begin(key, "fp").await
                                else {
                                    panic!()
                                };
                                guard.complete(claim, response()).await.1.unwrap();
                            }
                        });
                    })
                });
            });
        }
    }

    // A replay: begin on a completed key.
    {
        let store = MemoryStore::new();
        let mut p = Native { store: &store };
        let Ok(Decision::Proceed(claim)) = native::begin(&mut p, "done", "fp", &policy) else {
            panic!()
        };
        native::complete(&mut p, &claim, paid(), &policy).unwrap();
        group.bench_function(BenchmarkId::new("replay", "native"), |b| {
            b.iter(|| {
                let mut p = Native { store: &store };
                let Ok(Decision::Replay(r)) = native::begin(&mut p, "done", "fp", &policy) else {
                    panic!()
                };
                black_box(r);
            });
        });
    }
    for (row, response) in SIZES {
        for flavour in FLAVOURS {
            let guard = component_guard(&MemoryStore::new(), flavour);
            rt.block_on(async {
                let Ok(Decision::Proceed(claim)) = guard.begin("done", "fp").await else {
                    panic!()
                };
                guard.complete(claim, response()).await.1.unwrap();
            });
            group.bench_function(BenchmarkId::new(format!("replay{row}"), flavour), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let Ok(Decision::Replay(r)) = guard.begin("done", "fp").await else {
                                panic!()
                            };
                            black_box(r);
                        }
                        start.elapsed()
                    })
                });
            });
        }
    }
    // The floor under any guard call, in both flavours: `begin` through the
    // test build of the component doing no work (`!noop` answers at once),
    // with the one import every real call makes first (`!clock`: `now-ms`),
    // and with what a replay must cross and no decision (`!replay`: the
    // clock, one `insert` handing back the stored record, its response
    // returned as is). Key and fingerprint cross as in a real call.
    let runtime = Runtime::from_component(MISBEHAVING_COMPONENT, Limits::default()).unwrap();
    let floors = [
        ("!noop", "begin-no-import"),
        ("!clock", "begin-one-import"),
        ("!replay", "replay-crossings"),
    ];
    for flavour in FLAVOURS {
        for (key, name) in floors {
            let store = MemoryStore::new();
            let done = Record {
                fingerprint: "fp".into(),
                state: idem::State::Done,
                holder: 1,
                lease_until_ms: 0,
                expires_at_ms: u64::MAX,
                response: Some(paid()),
                checkpoint: None,
            };
            store.insert_now("!replay", done, 0).unwrap();
            let builder = match flavour {
                "component" => Guard::builder(store),
                _ => Guard::builder(AsyncOnly::new(store)),
            };
            let guard = builder.runtime(runtime.clone()).build().unwrap();
            let row = if flavour == "component" {
                name.to_owned()
            } else {
                format!("{name}-async")
            };
            group.bench_function(BenchmarkId::new("boundary", row), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            match guard.begin(key, "fp").await {
                                Ok(Decision::Replay(r)) if key == "!replay" => {
                                    black_box(r);
                                }
                                Ok(Decision::Conflict) if key != "!replay" => {}
                                other => panic!("{key}: {other:?}"),
                            }
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
