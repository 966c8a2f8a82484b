//! One suite, every store: the atomic primitives' contracts and the guard's
//! guarantees, run by `store_conformance!` against each store.
//!
//! A store joins by adding one line at the bottom:
//! `store_conformance!(name, async { /* -> Option<Arc<dyn Store>> */ });`
//! returning `None` (after printing why) only when the store's server is not
//! configured; CI configures every one.

use idem::store::{InsertOutcome, ListQuery, Store};
use idem::{Checkpoint, Decision, Guard, ManualClock, Outcome, Record, Response, State};
pub use idem_harness::dynamodb_test_url;
use idem_harness::{server_url, unique};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// 2026-10-19 04:00 UTC, the seed's base time.
pub const BASE_MS: u64 = 1_792_382_400_000;

/// What the tests' handlers answer, and completed records hold.
pub fn paid() -> Response {
    Response {
        status: 200,
        headers: vec![],
        body: b"paid".to_vec(),
    }
}

pub fn record(fingerprint: &str, state: State, lease_until_ms: u64, expires_at_ms: u64) -> Record {
    let response = (state == State::Done).then(paid);
    Record {
        fingerprint: fingerprint.into(),
        state,
        holder: 7,
        lease_until_ms,
        expires_at_ms,
        response,
        checkpoint: None,
    }
}

/// A guard over `store` whose clock stands at [`BASE_MS`].
pub fn guard_at_base(store: impl Store) -> Guard {
    Guard::builder(store)
        .clock(ManualClock::new(BASE_MS))
        .build()
        .unwrap()
}

/// A handler that counts its runs in `calls` and answers [`paid`].
pub fn counting(
    calls: &AtomicUsize,
) -> impl FnOnce(idem::Fence) -> std::future::Ready<Result<Response, Infallible>> + Copy + '_ {
    move |_| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(paid()))
    }
}

/// A claim of the fingerprint `fp`, its lease held until `lease_until_ms`.
pub fn claimed(lease_until_ms: u64, expires_at_ms: u64) -> Record {
    record("fp", State::Processing, lease_until_ms, expires_at_ms)
}

/// A completed record of the fingerprint `fp`, holding [`paid`].
pub fn done(expires_at_ms: u64) -> Record {
    record("fp", State::Done, 0, expires_at_ms)
}

/// The first `limit` keys starting with `prefix`, in any state.
pub fn under(prefix: &str, limit: usize) -> ListQuery {
    ListQuery {
        prefix: prefix.to_owned(),
        limit,
        ..ListQuery::default()
    }
}

/// Inserts `record` at `key`, which must be absent or expired.
pub async fn put<S: Store + ?Sized>(store: &S, key: &str, record: Record, now_ms: u64) {
    match store.insert(key, record, now_ms).await.unwrap() {
        idem::store::InsertOutcome::Inserted(_) => {}
        existing => panic!("{key} was live: {existing:?}"),
    }
}

/// Five records expired at `BASE_MS + 10` and one live: `purge_expired`
/// frees at most its limit per call, only expired records, and then no
/// more. For a store of its own (a fresh file, prefix or table).
pub async fn purge_is_bounded_and_spares_live_records<S: Store + ?Sized>(store: &S) {
    for i in 0..5 {
        put(store, &format!("old{i}"), done(BASE_MS + 10), BASE_MS).await;
    }
    put(store, "live", done(BASE_MS + 10_000), BASE_MS).await;
    assert_eq!(store.purge_expired(BASE_MS + 10, 3).await.unwrap(), 3);
    assert_eq!(store.purge_expired(BASE_MS + 10, 100).await.unwrap(), 2);
    assert_eq!(store.purge_expired(BASE_MS + 10, 100).await.unwrap(), 0);
    assert!(store.get("live", BASE_MS + 10).await.unwrap().is_some());
}

/// 1,100 expired records among 100 live ones, purged in batches of 100:
/// every batch is full until the last, which comes back short; together
/// they free each expired record once and no live one. A store that
/// lost its place between calls would come back short early, or scan from
/// the start each time (the size bench shows the cost). For a store of its
/// own.
pub async fn purge_in_batches_frees_every_expired_record<S: Store + ?Sized>(store: &S) {
    for i in 0..1_200 {
        let expires_at_ms = if i % 12 == 0 {
            BASE_MS + 60_000
        } else {
            BASE_MS + 10
        };
        let key = format!("k{i}");
        put(store, &key, done(expires_at_ms), BASE_MS).await;
    }
    let mut batches = Vec::new();
    loop {
        let n = store.purge_expired(BASE_MS + 10, 100).await.unwrap();
        batches.push(n);
        if n < 100 {
            break;
        }
    }
    assert_eq!(batches.iter().sum::<usize>(), 1_100, "batches {batches:?}");
    assert!(
        batches[..batches.len() - 1].iter().all(|&n| n == 100),
        "{batches:?}"
    );
    for i in (0..1_200).step_by(12) {
        let key = format!("k{i}");
        assert!(
            store.get(&key, BASE_MS + 10).await.unwrap().is_some(),
            "{key} was purged"
        );
    }
    assert_eq!(store.purge_expired(BASE_MS + 10, 100).await.unwrap(), 0);
}

#[tokio::test]
async fn memory_purges_in_batches() {
    purge_in_batches_frees_every_expired_record(&idem::MemoryStore::new()).await;
}

#[tokio::test]
async fn sqlite_purges_in_batches() {
    let store = open_sqlite().await.unwrap();
    purge_in_batches_frees_every_expired_record(&*store).await;
}

/// Waits for concurrent `begin`s of one key: how many proceeded. Every
/// other one must have been told the key is in flight.
pub async fn proceeded<E: std::fmt::Debug + 'static>(
    mut tasks: tokio::task::JoinSet<Result<Decision, E>>,
) -> usize {
    let mut proceeded = 0;
    while let Some(d) = tasks.join_next().await {
        match d.unwrap().unwrap() {
            Decision::Proceed(_) => proceeded += 1,
            Decision::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    proceeded
}

pub async fn insert_if_absent_or_expired(store: Arc<dyn Store>) {
    let key = unique("insert");
    let now = BASE_MS;
    let r = claimed(now + 1_000, now + 10_000);
    assert_eq!(
        store.insert(&key, r.clone(), now).await.unwrap(),
        InsertOutcome::Inserted(1)
    );
    // Live: nothing written, the live record returned.
    let other = record("other", State::Processing, now + 5_000, now + 20_000);
    match store.insert(&key, other.clone(), now + 1).await.unwrap() {
        InsertOutcome::Existing(e) => {
            assert_eq!(e.record, r);
            assert_eq!(e.version, 1);
        }
        o => panic!("expected existing, got {o:?}"),
    }
    // Expired (at exactly expires_at): overwritten with a higher version.
    match store
        .insert(&key, other.clone(), now + 10_000)
        .await
        .unwrap()
    {
        InsertOutcome::Inserted(v) => {
            assert!(v > 1, "version {v} must exceed the expired record's");
        }
        o => panic!("expected inserted, got {o:?}"),
    }
    assert_eq!(
        store.get(&key, now + 10_000).await.unwrap().unwrap().record,
        other
    );
}

pub async fn replace_only_at_version(store: Arc<dyn Store>) {
    let key = unique("replace");
    let now = BASE_MS;
    let r = claimed(now + 1_000, now + 10_000);
    store.insert(&key, r, now).await.unwrap();
    let completed = done(now + 10_000);
    for (version, replaced, why) in [
        (2, false, "a wrong version"),
        (1, true, "the claim's version"),
        (1, false, "a stale version"),
    ] {
        let got = store.replace(&key, version, completed.clone(), now).await;
        assert_eq!(got.unwrap(), replaced, "{why}");
    }
    let got = store.get(&key, now).await.unwrap().unwrap();
    assert_eq!((got.record, got.version), (completed.clone(), 2));
    // Absent and expired keys are never replaced.
    let absent = unique("absent");
    let replaced = store.replace(&absent, 1, completed.clone(), now);
    assert!(!replaced.await.unwrap());
    let expired = store.replace(&key, 2, completed, now + 10_000);
    assert!(!expired.await.unwrap());
}

pub async fn delete_at_version(store: Arc<dyn Store>) {
    let key = unique("delete");
    let now = BASE_MS;
    put(&store, &key, claimed(now + 1, now + 10_000), now).await;
    assert!(!store.delete(&key, Some(7), now).await.unwrap());
    assert!(store.get(&key, now).await.unwrap().is_some());
    assert!(store.delete(&key, Some(1), now).await.unwrap());
    assert!(store.get(&key, now).await.unwrap().is_none());
    assert!(!store.delete(&key, None, now).await.unwrap());
    put(&store, &key, claimed(now + 1, now + 10_000), now).await;
    assert!(store.delete(&key, None, now).await.unwrap());
    assert!(store.get(&key, now).await.unwrap().is_none());
    // An expired record is absent: no delete answers that it removed one
    // (a store may free its space meanwhile).
    put(&store, &key, claimed(now + 1, now + 10_000), now).await;
    assert!(!store.delete(&key, Some(1), now + 10_000).await.unwrap());
    assert!(!store.delete(&key, None, now + 10_000).await.unwrap());
    assert!(store.get(&key, now + 10_000).await.unwrap().is_none());
}

pub async fn reads_never_return_expired(store: Arc<dyn Store>) {
    let key = unique("expiry");
    let now = BASE_MS;
    store.insert(&key, done(now + 100), now).await.unwrap();
    assert!(store.get(&key, now + 99).await.unwrap().is_some());
    assert!(
        store.get(&key, now + 100).await.unwrap().is_none(),
        "expired at expires_at, purged or not"
    );
    let listed = store.list(&under(&key, 10), now + 100).await.unwrap();
    assert!(listed.is_empty(), "list must hide expired records too");
}

pub async fn keys_round_trip_any_allowed_bytes(store: Arc<dyn Store>) {
    let now = BASE_MS;
    for name in [
        "with space",
        "with \"quotes\" and 'single'",
        "colon:separated:key",
        "ünïcödé ✓",
        "semi;colon%25\\back",
    ] {
        let key = format!("{}/{name}", unique("bytes"));
        let r = done(now + 10_000);
        assert_eq!(
            store.insert(&key, r.clone(), now).await.unwrap(),
            InsertOutcome::Inserted(1),
            "{key}"
        );
        assert_eq!(
            store.get(&key, now).await.unwrap().unwrap().record,
            r,
            "{key}"
        );
    }
}

pub async fn list_filters_and_pages(store: Arc<dyn Store>) {
    let now = BASE_MS;
    let prefix = unique("list");
    for i in 0..5 {
        let state = if i % 2 == 0 {
            State::Done
        } else {
            State::Processing
        };
        put(
            &store,
            &format!("{prefix}/{i}"),
            record("fp", state, now + 1_000, now + 10_000),
            now,
        )
        .await;
    }
    let q = under(&prefix, 2);
    let page1 = store.list(&q, now).await.unwrap();
    assert_eq!(
        page1.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        [format!("{prefix}/0"), format!("{prefix}/1")]
    );
    let q2 = ListQuery {
        after: Some(page1[1].0.clone()),
        ..q.clone()
    };
    let page2 = store.list(&q2, now).await.unwrap();
    assert_eq!(page2[0].0, format!("{prefix}/2"));
    let done = store
        .list(
            &ListQuery {
                state: Some(State::Done),
                limit: 10,
                ..q
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(done.len(), 3);
}

pub async fn one_of_64_concurrent_claimers_proceeds(store: Arc<dyn Store>) {
    let clock = ManualClock::new(BASE_MS);
    let guard = Guard::builder(store).clock(clock).build().unwrap();
    let key = unique("claim64");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (guard, key) = (guard.clone(), key.clone());
        tasks.spawn(async move { guard.begin(&key, "fp").await });
    }
    assert_eq!(proceeded(tasks).await, 1, "exactly one claimer proceeds");
}

/// 64 concurrent claims of a key whose record has expired (still held by the
/// store): exactly one overwrites it, at its version + 1, and every other
/// claimer is shown the winner's record.
pub async fn one_of_64_concurrent_claims_of_an_expired_record_wins(store: Arc<dyn Store>) {
    let key = unique("expired64");
    let old = record("old", State::Done, BASE_MS + 1, BASE_MS + 10);
    assert_eq!(
        store.insert(&key, old, BASE_MS).await.unwrap(),
        InsertOutcome::Inserted(1)
    );
    let now = BASE_MS + 10;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (store, key) = (store.clone(), key.clone());
        let claim = record(
            &format!("fp{i}"),
            State::Processing,
            now + 1_000,
            now + 10_000,
        );
        tasks.spawn(async move { (i, store.insert(&key, claim, now).await.unwrap()) });
    }
    let (mut winners, mut seen) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (i, InsertOutcome::Inserted(version)) => winners.push((i, version)),
            (_, InsertOutcome::Existing(entry)) => seen.push(entry),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins: {winners:?}");
    let (winner, version) = winners[0];
    assert_eq!(version, 2, "the expired record's version + 1");
    for entry in seen {
        assert_eq!(entry.version, 2);
        assert_eq!(entry.record.fingerprint, format!("fp{winner}"));
    }
}

pub async fn takeover_fencing_and_retention(store: Arc<dyn Store>) {
    let clock = ManualClock::new(BASE_MS);
    let guard = Guard::builder(store)
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_hours(1))
        .build()
        .unwrap();
    let key = unique("fence");
    let Decision::Proceed(zombie) = guard.begin(&key, "fp").await.unwrap() else {
        panic!()
    };
    assert!(matches!(
        guard.begin(&key, "fp").await.unwrap(),
        Decision::InFlight { .. }
    ));
    clock.advance(Duration::from_secs(1));
    let Decision::Proceed(taker) = guard.begin(&key, "fp").await.unwrap() else {
        panic!("takeover after the lease")
    };
    assert!(taker.fence > zombie.fence);
    let taker_response = Response {
        status: 201,
        headers: vec![("x".into(), b"taker".to_vec())],
        body: b"taker".to_vec(),
    };
    assert!(
        guard
            .complete(taker, taker_response.clone())
            .await
            .1
            .is_ok()
    );
    let zombie_response = Response {
        status: 200,
        headers: vec![],
        body: b"zombie".to_vec(),
    };
    let (_, refused) = guard.complete(zombie, zombie_response).await;
    assert!(
        matches!(refused, Err(idem::GuardError::StaleClaim(_))),
        "{refused:?}"
    );
    assert_eq!(
        guard.begin(&key, "fp").await.unwrap(),
        Decision::Replay(taker_response)
    );
    clock.advance(Duration::from_hours(1));
    assert!(
        matches!(guard.begin(&key, "fp").await.unwrap(), Decision::Proceed(_)),
        "new after retention"
    );
}

pub async fn replays_the_stored_bytes(store: Arc<dyn Store>) {
    let guard = guard_at_base(store);
    let key = unique("bytes");
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let response = Response {
        status: 201,
        headers: vec![
            ("content-type".into(), b"application/octet-stream".to_vec()),
            ("x-raw".into(), vec![0, 159, 255]),
        ],
        body,
    };
    let calls = AtomicUsize::new(0);
    let first = guard
        .run(&key, "fp", |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(response.clone())
        })
        .await
        .unwrap();
    assert_eq!(first, Outcome::Executed(response.clone()));
    let again = guard
        .run(&key, "fp", |_| async {
            Ok::<_, std::convert::Infallible>(Response::default())
        })
        .await
        .unwrap();
    assert_eq!(
        again,
        Outcome::Replayed(response),
        "the bytes replayed are the bytes stored"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Contract 0.2's fields — the holder id (all 64 bits) and the checkpoint
/// (any bytes, empty too) — come back from every primitive as written.
pub async fn holder_and_checkpoint_round_trip(store: Arc<dyn Store>) {
    let key = unique("holder");
    let mut record = claimed(BASE_MS + 1_000, BASE_MS + 60_000);
    record.holder = u64::MAX - 2;
    record.checkpoint = Some(Checkpoint {
        phase: "reserved ü".into(),
        data: vec![],
    });
    put(&*store, &key, record.clone(), BASE_MS).await;
    let read = store.get(&key, BASE_MS).await.unwrap().expect("live");
    assert_eq!(read.record, record);
    match store
        .insert(&key, claimed(BASE_MS, BASE_MS + 1), BASE_MS)
        .await
        .unwrap()
    {
        InsertOutcome::Existing(e) => assert_eq!(e.record, record),
        other => panic!("{other:?}"),
    }
    let mut next = record.clone();
    next.holder = 1 << 63;
    next.checkpoint = Some(Checkpoint {
        phase: "charged".into(),
        data: (0..=255u8).collect(),
    });
    let replaced = store.replace(&key, read.version, next.clone(), BASE_MS);
    assert!(replaced.await.unwrap(), "at its version");
    let version = read.version + 1;
    let read = store.get(&key, BASE_MS).await.unwrap().expect("live");
    assert_eq!((read.record, read.version), (next.clone(), version));
    let mut listed = store.list(&under(&key, 10), BASE_MS).await.unwrap();
    assert_eq!(listed.pop().map(|(_, e)| e.record), Some(next.clone()));
    let mut finished = done(BASE_MS + 60_000);
    finished.holder = next.holder;
    let replaced = store.replace(&key, version, finished.clone(), BASE_MS);
    assert!(replaced.await.unwrap(), "at its version");
    let read = store.get(&key, BASE_MS).await.unwrap().expect("live");
    assert_eq!(read.record, finished, "a completion drops the checkpoint");
}

/// A store just migrated from contract 0.1 holds, as a 0.1 host wrote them,
/// `paid` (done at version 2: status 201, header `x: ff`, body `paid!`) and
/// `crashed` (a claim at version 1 whose lease ran out at `BASE_MS - 1`):
/// both read as holder 0 with no checkpoint, `paid` replays those bytes,
/// and `crashed` is taken over and completed by a 0.2 holder.
pub async fn records_of_0_1_hosts_keep_working(store: impl Store) {
    let entry = store.get("paid", BASE_MS).await.unwrap().expect("kept");
    assert_eq!((entry.record.holder, entry.record.checkpoint), (0, None));
    let guard = guard_at_base(store);
    let calls = AtomicUsize::new(0);
    let replayed = guard.run("paid", "fp", counting(&calls)).await.unwrap();
    let Outcome::Replayed(response) = replayed else {
        panic!("{replayed:?}")
    };
    assert_eq!(
        (response.status, response.headers, response.body),
        (201, vec![("x".to_owned(), vec![0xff])], b"paid!".to_vec()),
        "the bytes a 0.1 host stored replay"
    );
    let taken = guard.run("crashed", "fp", counting(&calls)).await.unwrap();
    assert!(matches!(taken, Outcome::Executed(_)), "{taken:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let entry = guard
        .store()
        .get("crashed", BASE_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.version, 3, "taken over at 2, completed at 3");
    assert_ne!(entry.record.holder, 0, "written by a 0.2 holder");
}

/// Runs the whole suite against the store `$open` yields, on a
/// multi-thread runtime unless a flavor is given (`current_thread`).
#[macro_export]
macro_rules! store_conformance {
    ($name:ident, $open:expr) => {
        $crate::store_conformance!($name, $open, flavor = "multi_thread", worker_threads = 4);
    };
    ($name:ident, $open:expr, current_thread) => {
        $crate::store_conformance!($name, $open, flavor = "current_thread");
    };
    ($name:ident, $open:expr, $($runtime:tt)+) => {
        mod $name {
            use super::*;

            async fn open() -> Option<Arc<dyn Store>> {
                $open.await
            }

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test($($runtime)+)]
                    async fn $case() {
                        if let Some(store) = open().await {
                            super::$case(store).await;
                        }
                    }
                };
            }

            case!(insert_if_absent_or_expired);
            case!(replace_only_at_version);
            case!(delete_at_version);
            case!(reads_never_return_expired);
            case!(keys_round_trip_any_allowed_bytes);
            case!(list_filters_and_pages);
            case!(one_of_64_concurrent_claimers_proceeds);
            case!(one_of_64_concurrent_claims_of_an_expired_record_wins);
            case!(takeover_fencing_and_retention);
            case!(replays_the_stored_bytes);
            case!(holder_and_checkpoint_round_trip);
            case!(seed_concurrent_same_key);
            case!(seed_lease_takeover_faults_and_window);
            case!(fails_closed_when_down_and_recovers);
            case!(model_based_sequences);
        }
    };
}

pub use crate::model::model_based_sequences;
pub use crate::seed::{seed_concurrent_same_key, seed_lease_takeover_faults_and_window};

/// The store is wrapped in `Faulty` and made to fail every operation; the
/// handler never runs; then the faults clear and the same guard works.
pub async fn fails_closed_when_down_and_recovers(store: Arc<dyn Store>) {
    let (faulty, faults) = idem::Faulty::new(store);
    let guard = guard_at_base(faulty);
    faults
        .set_all(&idem::FaultRule::error("connection refused"))
        .unwrap();
    let calls = AtomicUsize::new(0);
    let handler = counting(&calls);
    let key = unique("down");
    assert!(matches!(
        guard.run(&key, "fp", handler).await.unwrap(),
        Outcome::Unavailable(_)
    ));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "fail closed: the handler never runs"
    );
    faults.clear_all();
    assert!(matches!(
        guard.run(&key, "fp", handler).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

store_conformance!(memory, async {
    Some(Arc::new(idem::MemoryStore::new()) as Arc<dyn Store>)
});

async fn open_sqlite() -> Option<Arc<dyn Store>> {
    // Kept after the test (under target/tmp, which `cargo clean` empties): the
    // file must outlive every handle the suite's tasks may still hold.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
        .keep();
    let store =
        idem::store::SqliteStore::open(dir.join("idem.db"), idem::store::SqliteOptions::default())
            .expect("open the sqlite store");
    Some(Arc::new(store) as Arc<dyn Store>)
}

// On a multi-thread runtime a lone write runs in place and concurrent ones
// queue for the writer thread; on a current-thread runtime every write
// queues and reads go through the blocking pool. Both ways pass the suite.
store_conformance!(sqlite, open_sqlite());
store_conformance!(sqlite_current_thread, open_sqlite(), current_thread);

/// The Redis store on the server `var` names; `None` when it is not set.
async fn open_redis(var: &str) -> Option<Arc<dyn Store>> {
    let url = server_url(var)?;
    let store = idem::store::RedisStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("{var} is set but the server cannot be opened: {e}"));
    Some(Arc::new(store) as Arc<dyn Store>)
}

store_conformance!(redis, open_redis("IDEM_TEST_REDIS_URL"));
// Every primitive is one key, so one command on the node of its slot.
store_conformance!(redis_cluster, open_redis("IDEM_TEST_REDIS_CLUSTER_URL"));
// Valkey 8.1: completions and renewals by `SET … IFEQ`.
store_conformance!(valkey, open_redis("IDEM_TEST_VALKEY_URL"));

store_conformance!(postgres, async {
    let url = server_url("IDEM_TEST_POSTGRES_URL")?;
    Some(Arc::new(
        idem::store::PostgresStore::open(&url)
            .await
            .expect("IDEM_TEST_POSTGRES_URL is set but the server cannot be opened"),
    ) as Arc<dyn Store>)
});

// DynamoDB (tests: moto's server, scripts/services.sh): every primitive one
// conditional request; the claim answers the live item on a failed condition.
store_conformance!(dynamodb, async {
    let url = dynamodb_test_url()?;
    Some(Arc::new(
        idem::store::DynamoDbStore::open(&url)
            .await
            .expect("IDEM_TEST_DYNAMODB_URL is set but the server cannot be opened"),
    ) as Arc<dyn Store>)
});
