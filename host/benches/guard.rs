//! The guard's cost: through the WebAssembly component versus a native build
//! of the very same pure guest modules, on the same memory store, side by side.
//!
//! `cargo bench -p idem --bench guard`

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use idem::store::MemoryStore;
use idem::{Clock, Decision, Guard, Policy, Record, Response, SystemClock};
use idem_guest::guard::{self as native, Primitives};
use idem_guest::model::{InsertOutcome, StoreFailure};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The memory store, called synchronously, as the native guard's primitives.
struct Native<'a> {
    store: &'a MemoryStore,
}

impl Primitives for Native<'_> {
    fn now_ms(&mut self) -> u64 {
        SystemClock.now_ms()
    }
    fn insert(
        &mut self,
        key: &str,
        record: &Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreFailure> {
        Ok(self.store.insert_now(key, record.clone(), now_ms))
    }
    fn replace(
        &mut self,
        key: &str,
        expected_version: u64,
        record: &Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreFailure> {
        Ok(self
            .store
            .replace_now(key, expected_version, record.clone(), now_ms))
    }
}

fn paid() -> Response {
    Response {
        status: 200,
        headers: vec![],
        body: b"paid".to_vec(),
    }
}

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
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("new_key", "native"), |b| {
            b.iter(|| {
                n += 1;
                let key = format!("native-{n}");
                let mut p = Native { store: &store };
                let Ok(Decision::Proceed(claim)) = native::begin(&mut p, &key, "fp", &policy)
                else {
                    panic!()
                };
                native::complete(&mut p, &claim, paid(), &policy).unwrap();
            });
        });
    }
    {
        let guard = Guard::builder(MemoryStore::new()).build().unwrap();
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("new_key", "component"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        n += 1;
                        let key = format!("wasm-{n}");
                        let Ok(Decision::Proceed(claim)) = guard.begin(&key, "fp").await else {
                            panic!()
                        };
                        guard.complete(claim, paid()).await.1.unwrap();
                    }
                    start.elapsed()
                })
            });
        });
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
    {
        let guard = Guard::builder(MemoryStore::new()).build().unwrap();
        rt.block_on(async {
            let Ok(Decision::Proceed(claim)) = guard.begin("done", "fp").await else {
                panic!()
            };
            guard.complete(claim, paid()).await.1.unwrap();
        });
        group.bench_function(BenchmarkId::new("replay", "component"), |b| {
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
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
