//! The sandbox fails closed: a trapping, runaway or memory-hungry guest
//! answers unavailable, its instance is replaced, and the next call works —
//! in both of the host's flavours: sync (a store that never waits on I/O,
//! the memory store) and async (every other store; here the memory store
//! behind `AsyncOnly`, which hides its sync side).

use crate::conformance::{BASE_MS, counting};
use idem::store::AsyncOnly;
use idem::{Guard, Limits, ManualClock, MemoryStore, Outcome, Response, Runtime, Store};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The memory store as the sync flavour sees it, and as the async one does.
fn both_flavours() -> [std::sync::Arc<dyn Store>; 2] {
    let async_only = AsyncOnly::new(MemoryStore::new());
    assert!(async_only.as_sync().is_none());
    assert!(MemoryStore::new().as_sync().is_some());
    [
        std::sync::Arc::new(MemoryStore::new()),
        std::sync::Arc::new(async_only),
    ]
}

fn misbehaving(limits: Limits, store: std::sync::Arc<dyn Store>) -> Guard {
    let runtime = Runtime::from_component(idem::testing::MISBEHAVING_COMPONENT, limits).unwrap();
    idem::GuardBuilder::from_arc(store)
        .clock(ManualClock::new(BASE_MS))
        .runtime(runtime)
        .build()
        .unwrap()
}

/// In both flavours, under `limits`: the guest misbehaving on `bad_key`
/// answers unavailable, saying `needle`, and nothing runs; the instance is
/// replaced and the next call runs.
async fn fails_closed_then_recovers(limits: Limits, bad_key: &str, needle: &str) {
    for store in both_flavours() {
        let guard = misbehaving(limits, store);
        let calls = AtomicUsize::new(0);
        match guard.run(bad_key, "fp", counting(&calls)).await.unwrap() {
            Outcome::Unavailable(why) => assert!(why.contains(needle), "{why}"),
            other => panic!("{bad_key}: {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(guard.pool_stats().failed >= 1);
        assert!(matches!(
            guard.run("fine", "fp", counting(&calls)).await.unwrap(),
            Outcome::Executed(_)
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn trapping_guest_answers_unavailable_and_is_replaced() {
    fails_closed_then_recovers(Limits::default(), "!trap", "instance replaced").await;
}

#[tokio::test]
async fn runaway_guest_is_stopped_by_the_epoch_deadline() {
    let limits = Limits {
        call_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    fails_closed_then_recovers(limits, "!spin", "interrupt").await;
}

#[tokio::test]
async fn memory_hungry_guest_is_stopped_by_the_memory_limit() {
    let limits = Limits {
        memory_bytes: 8 << 20,
        ..Limits::default()
    };
    fails_closed_then_recovers(limits, "!grow", "instance replaced").await;
}

#[tokio::test]
async fn instances_are_reused_not_created_per_call() {
    for store in both_flavours() {
        let guard = idem::GuardBuilder::from_arc(store).build().unwrap();
        sequential_calls_share_one_instance(&guard).await;
    }
}

async fn sequential_calls_share_one_instance(guard: &Guard) {
    for i in 0..50 {
        let _ = guard
            .run(&format!("k{i}"), "fp", |_| async {
                Ok::<_, &str>(Response {
                    status: 200,
                    ..Response::default()
                })
            })
            .await;
    }
    assert_eq!(
        guard.pool_stats().instantiated,
        1,
        "sequential calls share one instance"
    );
}

/// The benchmark's boundary rows rely on the test build answering at once on
/// two reserved keys, without the store: if either wrote a record, the
/// floor it reports would include a store call.
#[tokio::test]
async fn the_test_builds_boundary_keys_answer_without_the_store() {
    for store in both_flavours() {
        let guard = misbehaving(Limits::default(), store.clone());
        for key in ["!noop", "!clock"] {
            assert!(matches!(
                guard.begin(key, "fp").await,
                Ok(idem::Decision::Conflict)
            ));
            assert_eq!(store.get(key, BASE_MS).await.unwrap(), None, "{key}");
        }
    }
}
