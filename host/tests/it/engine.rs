//! The sandbox fails closed: a trapping, runaway or memory-hungry guest
//! answers unavailable, its instance is replaced, and the next call works.

use crate::conformance::BASE_MS;
use idem::{Guard, Limits, ManualClock, MemoryStore, Outcome, Response, Runtime};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

fn misbehaving(limits: Limits) -> Guard {
    let runtime = Runtime::from_component(idem::component::MISBEHAVING_COMPONENT, limits).unwrap();
    Guard::builder(MemoryStore::new())
        .clock(ManualClock::new(BASE_MS))
        .runtime(runtime)
        .build()
        .unwrap()
}

async fn check_fails_closed_then_recovers(guard: &Guard, bad_key: &str, needle: &str) {
    let calls = AtomicU32::new(0);
    let handler = |_| async {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, &str>(Response {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        })
    };
    match guard.run(bad_key, "fp", handler).await.unwrap() {
        Outcome::Unavailable(why) => assert!(why.contains(needle), "{why}"),
        other => panic!("{bad_key}: {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let failed = guard.pool_stats().failed;
    assert!(failed >= 1);
    assert!(matches!(
        guard.run("fine", "fp", handler).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn trapping_guest_answers_unavailable_and_is_replaced() {
    let guard = misbehaving(Limits::default());
    check_fails_closed_then_recovers(&guard, "!trap", "instance replaced").await;
}

#[tokio::test]
async fn runaway_guest_is_stopped_by_the_epoch_deadline() {
    let guard = misbehaving(Limits {
        call_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    check_fails_closed_then_recovers(&guard, "!spin", "interrupt").await;
}

#[tokio::test]
async fn memory_hungry_guest_is_stopped_by_the_memory_limit() {
    let guard = misbehaving(Limits {
        memory_bytes: 8 << 20,
        ..Limits::default()
    });
    check_fails_closed_then_recovers(&guard, "!grow", "instance replaced").await;
}

#[tokio::test]
async fn instances_are_reused_not_created_per_call() {
    let guard = Guard::builder(MemoryStore::new()).build().unwrap();
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
