//! The guard bench's component rows (`host/benches/guard.rs`), a fixed
//! number of calls each, for callgrind: instructions per call, which do not
//! move with the machine's load the way the bench's times do. Each row's
//! loop is one call of `measure`, so callgrind, told to count inside it only
//! and to write a profile each time it is entered, writes one profile per
//! row: profile `k + 1` holds row `k` (in the order this prints them on
//! stderr), the final profile the last row.
//!
//! ```sh
//! cargo build --release -p idem --example guard_instructions
//! valgrind --tool=callgrind --toggle-collect='guard_instructions::measure' \
//!   --dump-before='guard_instructions::measure' --callgrind-out-file=cg.out \
//!   target/release/examples/guard_instructions 2000
//! grep -m1 '^summary:' cg.out.2     # row 1's instructions; ÷ 2000 per call
//! ```
//!
//! Two builds compared this way: BENCHMARKS.md, "The guard".

use idem::store::{AsyncOnly, MemoryStore, SyncStore};
use idem::testing::{MISBEHAVING_COMPONENT, large, paid};
use idem::{Decision, Guard, Limits, Record, Response, Runtime, State};
use std::hint::black_box;

/// One row: `keys.len()` calls. `"new"`: `begin` + `complete` on each key;
/// otherwise `begin` on the key `what` (a completed key, or one of the test
/// component's floor keys `!noop`, `!clock`, `!replay`).
#[inline(never)]
fn measure(
    rt: &tokio::runtime::Runtime,
    guard: &Guard,
    what: &str,
    keys: &[String],
    response: fn() -> Response,
) {
    rt.block_on(async {
        if what == "new" {
            for key in keys {
                let Ok(Decision::Proceed(claim)) = guard.begin(key, "fp").await else {
                    panic!("{key}: not claimed")
                };
                guard.complete(claim, response()).await.1.expect("stored");
            }
            return;
        }
        for _ in keys {
            match guard.begin(what, "fp").await {
                Ok(Decision::Replay(r)) if what == "done" || what == "!replay" => {
                    black_box(r);
                }
                Ok(Decision::Conflict) if what == "!noop" || what == "!clock" => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    });
}

fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .map_or(2_000, |n| n.parse().expect("CALLS is a number"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let keys: Vec<String> = (0..calls).map(|i| format!("order-{i}")).collect();
    let test_component =
        Runtime::from_component(MISBEHAVING_COMPONENT, Limits::default()).expect("component");
    for flavour in ["component", "component-async"] {
        let guard_over = |store: &MemoryStore, runtime: Option<Runtime>| {
            let builder = if flavour == "component" {
                Guard::builder(store.clone())
            } else {
                Guard::builder(AsyncOnly::new(store.clone()))
            };
            match runtime {
                Some(runtime) => builder.runtime(runtime),
                None => builder,
            }
            .build()
            .expect("guard")
        };
        for (size, response) in [("", paid as fn() -> Response), ("_64k", large)] {
            let guard = guard_over(&MemoryStore::new(), None);
            eprintln!("row new_key{size}/{flavour}");
            measure(&rt, &guard, "new", &keys, response);

            let guard = guard_over(&MemoryStore::new(), None);
            rt.block_on(async {
                let Ok(Decision::Proceed(claim)) = guard.begin("done", "fp").await else {
                    panic!("done: not claimed")
                };
                guard.complete(claim, response()).await.1.expect("stored");
            });
            eprintln!("row replay{size}/{flavour}");
            measure(&rt, &guard, "done", &keys, response);
        }
        for key in ["!noop", "!clock", "!replay"] {
            let store = MemoryStore::new();
            let done = Record {
                fingerprint: "fp".into(),
                state: State::Done,
                holder: 1,
                lease_until_ms: 0,
                expires_at_ms: u64::MAX,
                response: Some(paid()),
                checkpoint: None,
            };
            store.insert_now("!replay", done, 0).expect("inserted");
            let guard = guard_over(&store, Some(test_component.clone()));
            eprintln!("row boundary/{key}/{flavour}");
            measure(&rt, &guard, key, &keys, paid);
        }
    }
}
