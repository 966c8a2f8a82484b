//! The guard's behaviour beyond the seed, through the component.

use crate::conformance::{BASE_MS, counting, paid};
use idem::store::{Hook, Hooked};
use idem::{
    Claim, Clock, Decision, FaultRule, Faulty, Guard, GuardBuilder, GuardError, ManualClock,
    MemoryStore, OnHandlerError, Op, Outcome, Response, RunError, Store, StoreError,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A guard over `store` on `clock` whose claims hold a one-second lease.
fn one_second_lease(store: impl Store, clock: impl Clock) -> GuardBuilder {
    Guard::builder(store)
        .clock(clock)
        .lease(Duration::from_secs(1))
}

/// [`one_second_lease`] over a fresh memory store, and its clock, at [`BASE_MS`].
fn memory_guard_with_one_second_lease() -> (ManualClock, Guard) {
    let clock = ManualClock::new(BASE_MS);
    let guard = one_second_lease(MemoryStore::new(), clock.clone());
    (clock, guard.build().unwrap())
}

/// The claim of a new `key`.
async fn proceed(guard: &Guard, key: &str) -> Claim {
    match guard.begin(key, "fp").await.unwrap() {
        Decision::Proceed(claim) => claim,
        other => panic!("{key} is new, yet {other:?}"),
    }
}

#[tokio::test]
async fn released_claim_lets_the_retry_execute_at_once() {
    let clock = ManualClock::new(BASE_MS);
    let guard = Guard::builder(MemoryStore::new())
        .clock(clock)
        .build()
        .unwrap();
    let calls = AtomicUsize::new(0);
    let failing = |_| async {
        calls.fetch_add(1, Ordering::SeqCst);
        Err::<Response, _>("upstream 503")
    };
    assert!(matches!(
        guard.run("k", "fp", failing).await,
        Err(RunError::Handler("upstream 503"))
    ));
    // No time passes: the retry runs because the claim was released.
    let ok = counting(&calls);
    assert_eq!(
        guard.run("k", "fp", ok).await.unwrap(),
        Outcome::Executed(paid())
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn held_claim_makes_the_retry_wait_for_the_lease() {
    let clock = ManualClock::new(BASE_MS);
    let guard = Guard::builder(MemoryStore::new())
        .clock(clock.clone())
        .lease(Duration::from_secs(5))
        .on_handler_error(OnHandlerError::Hold)
        .build()
        .unwrap();
    let _ = guard
        .run("k", "fp", |_| async { Err::<Response, _>("boom") })
        .await;
    let retry = guard
        .run("k", "fp", |_| async { Ok::<_, &str>(paid()) })
        .await
        .unwrap();
    assert_eq!(
        retry,
        Outcome::InFlight {
            retry_after: Duration::from_secs(5)
        }
    );
    clock.advance(Duration::from_secs(5));
    assert!(matches!(
        guard
            .run("k", "fp", |_| async { Ok::<_, &str>(paid()) })
            .await
            .unwrap(),
        Outcome::Executed(_)
    ));
}

#[tokio::test]
async fn insert_applied_but_reply_lost_never_executes_twice() {
    let clock = ManualClock::new(BASE_MS);
    let (store, faults) = Faulty::new(MemoryStore::new());
    let guard = one_second_lease(store, clock.clone()).build().unwrap();
    let calls = AtomicUsize::new(0);
    let handler = counting(&calls);
    faults.set(Op::Insert, FaultRule::lost().times(1)).unwrap();
    // The claim landed but its reply was lost: fail closed, nothing runs.
    assert!(matches!(
        guard.run("k", "fp", handler).await.unwrap(),
        Outcome::Unavailable(_)
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The retry sees the orphaned claim as in flight, then takes it over once.
    assert!(matches!(
        guard.run("k", "fp", handler).await.unwrap(),
        Outcome::InFlight { .. }
    ));
    clock.advance(Duration::from_secs(1));
    assert!(matches!(
        guard.run("k", "fp", handler).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert!(matches!(
        guard.run("k", "fp", handler).await.unwrap(),
        Outcome::Replayed(_)
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A `Faulty` memory store keeps the sync flavour (no fiber) while no rule
/// makes calls wait; a `delay` or `timeout` rule sends calls to the async
/// flavour, which waits it out, and clearing it brings the sync one back.
#[tokio::test(start_paused = true)]
async fn delay_and_timeout_faults_are_waited_out_over_the_sync_store() {
    let (store, faults) = Faulty::new(MemoryStore::new());
    let sync = store
        .as_sync()
        .expect("a faulty memory store has a sync form");
    let guard = Guard::builder(store)
        .clock(ManualClock::new(BASE_MS))
        .build()
        .unwrap();
    assert!(!sync.would_wait());
    faults.set(Op::Get, FaultRule::error("down")).unwrap();
    assert!(!sync.would_wait(), "an error rule answers at once");

    faults
        .set(Op::Insert, FaultRule::delay(Duration::from_millis(700)))
        .unwrap();
    assert!(sync.would_wait());
    let started = tokio::time::Instant::now();
    let outcome = guard.run("slow", "fp", |_| async { Ok::<_, &str>(paid()) });
    assert!(matches!(outcome.await.unwrap(), Outcome::Executed(_)));
    assert!(started.elapsed() >= Duration::from_millis(700));

    faults
        .set(Op::Insert, FaultRule::timeout(Duration::from_millis(300)))
        .unwrap();
    let started = tokio::time::Instant::now();
    let calls = AtomicUsize::new(0);
    let outcome = guard.run("late", "fp", counting(&calls));
    match outcome.await.unwrap() {
        Outcome::Unavailable(why) => assert!(why.contains("timed out after 300 ms"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    faults.clear(Op::Insert);
    assert!(!sync.would_wait());
    let started = tokio::time::Instant::now();
    let outcome = guard.run("fast", "fp", |_| async { Ok::<_, &str>(paid()) });
    assert!(matches!(outcome.await.unwrap(), Outcome::Executed(_)));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// The completion was stored and its reply lost: read back, the record is
/// the one meant, so the run reports executed (0.1 reported not-recorded),
/// and a repeat replays those bytes without running.
#[tokio::test]
async fn a_lost_completion_reply_is_read_back_and_the_run_is_executed() {
    let (store, faults) = Faulty::new(MemoryStore::new());
    let guard = Guard::builder(store)
        .clock(ManualClock::new(BASE_MS))
        .build()
        .unwrap();
    faults.set(Op::Replace, FaultRule::lost().times(1)).unwrap();
    assert_eq!(
        guard
            .run("k", "fp", |_| async { Ok::<_, &str>(paid()) })
            .await
            .unwrap(),
        Outcome::Executed(paid())
    );
    assert_eq!(faults.injected(), 1, "the completion's reply was lost");
    assert_eq!(
        guard
            .run("k", "fp", |_| async { Ok::<_, &str>(Response::default()) })
            .await
            .unwrap(),
        Outcome::Replayed(paid())
    );
}

/// A renewal keeps the key past the first lease. The claim as it was
/// before the renewal is the same holder's: it may still complete (the
/// guard writes at the record's version); once done, another response
/// from any copy of the claim is refused.
#[tokio::test]
async fn renewed_lease_keeps_the_key_for_its_holder() {
    let (clock, guard) = memory_guard_with_one_second_lease();
    let claim = proceed(&guard, "k").await;
    clock.advance(Duration::from_millis(900));
    let renewed = guard.renew(claim.clone()).await.unwrap();
    assert!(renewed.fence > claim.fence);
    clock.advance(Duration::from_millis(500));
    assert!(
        matches!(
            guard.begin("k", "fp").await.unwrap(),
            Decision::InFlight { .. }
        ),
        "renewed lease still holds"
    );
    assert_eq!(renewed.holder, claim.holder);
    assert!(guard.complete(claim, paid()).await.1.is_ok());
    assert!(matches!(
        guard.complete(renewed, Response { status: 500, ..paid() }).await.1,
        Err(GuardError::StaleClaim(why)) if why.contains("already completed")
    ));
    assert_eq!(
        guard.begin("k", "fp").await.unwrap(),
        Decision::Replay(paid())
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_the_limit_and_nothing_runs_or_is_stored() {
    let store = MemoryStore::new();
    let guard = Guard::builder(store.clone())
        .clock(ManualClock::new(BASE_MS))
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let calls = AtomicUsize::new(0);
    let handler = counting(&calls);
    let long_key = "k".repeat(256);
    for (key, fingerprint, needle) in [
        ("", "fp", "empty"),
        (long_key.as_str(), "fp", "255"),
        ("k\u{7}", "fp", "control"),
        ("k", "", "empty"),
        ("k", "not a fingerprint", "visible ASCII"),
    ] {
        match guard.run(key, fingerprint, handler).await {
            Err(RunError::InvalidInput(why)) => {
                assert!(why.contains(needle), "{why:?} should name {needle:?}");
            }
            other => panic!("{key:?}/{fingerprint:?}: {other:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(store.is_empty(), "nothing stored");

    let big = |_| async {
        Ok::<_, &str>(Response {
            status: 200,
            headers: vec![],
            body: vec![b'x'; 1025],
        })
    };
    match guard.run("big", "fp", big).await {
        Err(RunError::NotRecorded {
            error: GuardError::InvalidInput(why),
            ..
        }) => {
            assert!(why.contains("1025 bytes") && why.contains("1024"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let Some(entry) = idem::Store::get(&store, "big", BASE_MS).await.unwrap() else {
        panic!("claim stays")
    };
    assert!(
        entry.record.response.is_none(),
        "the oversized response was not stored"
    );
}

#[tokio::test]
async fn bad_policy_is_refused_at_build() {
    let err = Guard::builder(MemoryStore::new())
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(5))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("shorter than retention"), "{err}");
}

#[tokio::test]
async fn fingerprints_are_canonical_through_the_component() {
    let guard = Guard::builder(MemoryStore::new()).build().unwrap();
    let parts = |headers: Vec<(&str, &str)>| idem::RequestParts {
        method: "post".into(),
        path: "/orders".into(),
        headers: headers
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v.as_bytes().to_vec()))
            .collect(),
        body: br#"{"sku":"A"}"#.to_vec(),
    };
    let a = guard
        .fingerprint(&parts(vec![("X-A", "1"), ("x-b", "2")]))
        .await
        .unwrap();
    let b = guard
        .fingerprint(&parts(vec![("x-b", "2"), ("x-a", "1")]))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a,
        idem_guest::fingerprint::fingerprint(
            "POST",
            "/orders",
            &parts(vec![("x-a", "1"), ("x-b", "2")]).headers,
            br#"{"sku":"A"}"#
        )
    );
    assert!(a.starts_with("sha256:") && a.len() == 71);
}

/// The guard's clock following tokio's (paused) time, so that leases run out
/// as the runtime's timers fire.
#[derive(Clone)]
struct RuntimeClock(tokio::time::Instant);

impl idem::Clock for RuntimeClock {
    fn now_ms(&self) -> u64 {
        BASE_MS + self.0.elapsed().as_millis() as u64
    }

    fn authority(&self) -> String {
        "tokio's clock".into()
    }
}

/// Runs `key` with a handler that takes 3.5 leases, and a repeat 2.5 leases
/// in: what the repeat got, and how many times the handler ran in all.
async fn repeat_during_a_long_handler(guard: &Guard, key: &'static str) -> LongRun {
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let slow = {
        let calls = calls.clone();
        move |_| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(3500)).await;
            Ok::<_, &str>(paid())
        }
    };
    let first = tokio::spawn({
        let guard = guard.clone();
        async move { guard.run(key, "fp", slow).await }
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let repeat = guard.run(key, "fp", counting(&calls)).await.unwrap();
    let first = first.await.unwrap();
    (first, repeat, calls.load(Ordering::SeqCst))
}

type LongRun = (Result<Outcome, RunError<&'static str>>, Outcome, usize);

/// The holder kept its key: the repeat was told it is in flight, the
/// handler ran once and its response was recorded.
fn assert_kept((first, repeat, calls): &LongRun) {
    assert!(matches!(repeat, Outcome::InFlight { .. }), "{repeat:?}");
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    assert_eq!(*calls, 1);
}

/// The key was taken over: the repeat ran the handler a second time and
/// the first holder's completion was refused as stale.
fn assert_taken_over((first, repeat, calls): &LongRun) {
    assert!(matches!(repeat, Outcome::Executed(_)), "{repeat:?}");
    assert!(
        matches!(
            first,
            Err(RunError::NotRecorded {
                error: GuardError::StaleClaim(_),
                ..
            })
        ),
        "{first:?}"
    );
    assert_eq!(*calls, 2);
}

/// A renewing guard with a one-second lease over a memory store whose
/// replaces (renewals among them) meet `rule` once.
fn renewing_over_one_fault(rule: FaultRule) -> (Guard, idem::store::FaultHandle) {
    let (store, faults) = Faulty::new(MemoryStore::new());
    let clock = RuntimeClock(tokio::time::Instant::now());
    let guard = one_second_lease(store, clock).build().unwrap();
    faults.set(Op::Replace, rule.times(1)).unwrap();
    (guard, faults)
}

/// A handler still running when its lease would run out keeps its key:
/// `run` renews the lease, so a repeat is told the request is in flight and
/// the handler runs once. Without renewal the same repeat takes the key over
/// and runs it a second time, and the first holder's completion is refused.
#[tokio::test(start_paused = true)]
async fn a_handler_that_outlives_its_lease_keeps_its_key() {
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(MemoryStore::new());
    let clock = RuntimeClock(tokio::time::Instant::now());
    let builder = || one_second_lease(store.clone(), clock.clone());

    let renewing = builder().build().unwrap();
    assert_kept(&repeat_during_a_long_handler(&renewing, "renewed").await);
    let again = renewing.run("renewed", "fp", |_| async { Err("must not run") });
    assert_eq!(again.await.unwrap(), Outcome::Replayed(paid()));

    let lapsing = builder().renew_lease(false).build().unwrap();
    assert_taken_over(&repeat_during_a_long_handler(&lapsing, "lapsed").await);
}

/// A renewal the store cannot answer is tried again at the next tick: one
/// failed renewal does not cost the holder its key.
#[tokio::test(start_paused = true)]
async fn a_failed_renewal_is_retried_before_the_lease_runs_out() {
    let (guard, faults) = renewing_over_one_fault(FaultRule::error("store down"));
    let run = repeat_during_a_long_handler(&guard, "flaky").await;
    assert_eq!(faults.injected(), 1, "the first renewal met the fault");
    assert_kept(&run);
}

/// A renewal whose reply is lost has still raised the fence; the guard
/// reads the record back, finds its own holder (contract 0.2) and carries
/// on: the key is kept, the handler runs once and its response is
/// recorded. (Under 0.1 the renewing stopped and the key was taken over.)
#[tokio::test(start_paused = true)]
async fn a_renewal_whose_reply_is_lost_keeps_the_key() {
    let (guard, faults) = renewing_over_one_fault(FaultRule::lost());
    let run = repeat_during_a_long_handler(&guard, "lost-renewal").await;
    assert_eq!(faults.injected(), 1, "the first renewal's reply was lost");
    assert_kept(&run);
}

/// Inserts that take `slow_ms` of the guard's clock: a claim's round trip
/// that eats most of its lease.
#[derive(Clone)]
struct SlowInserts {
    clock: ManualClock,
    slow_ms: u64,
}

impl Hook for SlowInserts {
    fn after(
        &self,
        op: Op,
        _key: &str,
        _took: Option<Duration>,
        _outcome: Result<(), &StoreError>,
    ) {
        if op == Op::Insert {
            self.clock.advance(Duration::from_millis(self.slow_ms));
        }
    }
}

/// A claim whose insert took 900 ms of a 1 s lease is renewed before its
/// handler starts (the handler may take 500 ms), so a repeat 200 ms into the
/// handler — past the lease the insert stamped — is told the key is in
/// flight instead of taking it over and running it a second time.
#[tokio::test]
async fn a_claim_slower_than_its_lease_allows_is_renewed_before_it_runs() {
    let clock = ManualClock::new(BASE_MS);
    let slow = SlowInserts {
        clock: clock.clone(),
        slow_ms: 900,
    };
    let guard = one_second_lease(Hooked::wrap(MemoryStore::new(), slow), clock.clone())
        .renew_lease(false)
        .build()
        .unwrap();
    let calls = AtomicUsize::new(0);
    let claim = proceed(&guard, "k").await;
    assert!(
        claim.lease_until_ms <= idem::Clock::now_ms(&clock) + 100,
        "the insert ate the lease"
    );
    let settled = guard
        .execute(claim, Duration::from_millis(500), |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            clock.advance(Duration::from_millis(200));
            // Past the lease the slow insert stamped: a repeat must not take over.
            let repeat = guard.run("k", "fp", counting(&calls)).await.unwrap();
            assert!(matches!(repeat, Outcome::InFlight { .. }), "{repeat:?}");
            idem::Settle::<&str>::Complete(paid())
        })
        .await;
    assert!(
        matches!(settled, idem::Settled::Completed { .. }),
        "{settled:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// When the lease cannot be secured — the key was taken over while the
/// claim's round trip dragged on — the handler never runs.
#[tokio::test]
async fn a_claim_taken_over_before_it_could_be_secured_never_runs() {
    let (clock, guard) = memory_guard_with_one_second_lease();
    let stale = proceed(&guard, "k").await;
    clock.advance(Duration::from_millis(1_000));
    let taker = proceed(&guard, "k").await;
    assert!(taker.fence > stale.fence);
    let settled = guard
        .execute(stale, Duration::from_millis(100), |_| async {
            panic!("a claim that could not be secured must not run")
        })
        .await;
    assert!(
        matches!(
            settled,
            idem::Settled::<&str>::NotStarted(GuardError::StaleClaim(_))
        ),
        "{settled:?}"
    );
}

/// A handler bound by a budget that its lease already covers, with the
/// completion's store call, is not renewed: a 1.2 s handler under a 3 s
/// lease with a 1 s budget completes under its first fence (the record's
/// version is the claim's + 1). Without a budget the same handler is
/// renewed every second, so its completion presents a later fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_handler_inside_its_lease_is_not_renewed() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let guard = Guard::builder(store.clone())
        .lease(Duration::from_secs(3))
        .store_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    for (key, budget, renewed) in [
        ("bounded", Duration::from_secs(1), false),
        ("unbounded", Duration::ZERO, true),
    ] {
        let claim = proceed(&guard, key).await;
        let fence = claim.fence;
        let settled = guard
            .execute(claim, budget, |_| async {
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                idem::Settle::<()>::Complete(paid())
            })
            .await;
        assert!(matches!(settled, idem::Settled::Completed { .. }), "{key}");
        let now = store.clock().now_ms();
        let version = store.get(key, now).await.unwrap().unwrap().version;
        assert_eq!(
            version > fence + 1,
            renewed,
            "{key}: version {version} after fence {fence}"
        );
    }
}

/// The expiry a completion and a replay report is the stored record's
/// `expires-at-ms`, on the store's clock: what a client is told is what the
/// store will do. A retried completion whose reply was lost reports it too,
/// and only a replay has one.
#[tokio::test]
async fn a_completion_and_its_replays_report_the_stored_records_expiry() {
    let clock = ManualClock::new(BASE_MS);
    let store = MemoryStore::new();
    let (faulty, faults) = Faulty::new(store.clone());
    let guard = Guard::builder(faulty)
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .build()
        .unwrap();
    let claim = proceed(&guard, "k").await;
    clock.advance(Duration::from_millis(250));
    let (_, completed) = guard.complete(claim, paid()).await;
    let stored = store.get("k", clock.now_ms()).await.unwrap().unwrap();
    assert_eq!(completed, Ok(stored.record.expires_at_ms));
    assert_eq!(stored.record.expires_at_ms, BASE_MS + 250 + 3_600_000);

    clock.advance(Duration::from_secs(60));
    let (decision, expires) = guard.begin_expiring("k", "fp").await.unwrap();
    assert_eq!(decision, Decision::Replay(paid()));
    assert_eq!(
        expires,
        Some(stored.record.expires_at_ms),
        "a replay a minute later: the same expiry"
    );
    let (decision, expires) = guard.begin_expiring("new", "fp").await.unwrap();
    assert!(matches!(decision, Decision::Proceed(_)) && expires.is_none());
    let (decision, expires) = guard.begin_expiring("new", "fp").await.unwrap();
    assert!(matches!(decision, Decision::InFlight { .. }) && expires.is_none());

    // The completion's reply is lost: the read-back finds it stored.
    let claim = proceed(&guard, "lost").await;
    faults.set(Op::Replace, FaultRule::lost().times(1)).unwrap();
    let (_, completed) = guard.complete(claim, paid()).await;
    let stored = store.get("lost", clock.now_ms()).await.unwrap().unwrap();
    assert_eq!(faults.injected(), 1);
    assert_eq!(completed, Ok(stored.record.expires_at_ms));
}
