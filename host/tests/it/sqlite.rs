//! What the SQLite store adds to the conformance suite: rows that do not decode, schema versions, bad paths, purging,
//! and two stores (as two processes would) sharing one file.

use crate::conformance::{BASE_MS, claimed, counting, done, guard_at_base, put, under};
use idem::store::{OpenError, SqliteOptions, SqliteStore, Store, StoreError, Synchronous};
use idem::{ManualClock, Outcome};
use idem_harness::unique;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A database file of its own, in a directory removed when the guard returned
/// beside it drops.
fn db_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    (dir, db)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SqliteOptions::default()).expect("open the sqlite store")
}

/// A raw connection to the same file, to do what no store method would.
fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

fn rows(path: &Path) -> i64 {
    raw(path)
        .query_row("SELECT count(*) FROM records", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_do_not_decode_are_corrupt_naming_the_key() {
    let (_dir, db) = db_file();
    let store = open(&db);
    let now = BASE_MS;
    let corruptions = [
        (
            "bad-state",
            "UPDATE records SET state = 'finished' WHERE key = ?1",
            "unknown state \"finished\"",
        ),
        (
            "short-headers",
            "UPDATE records SET headers = x'0000000100000001610000000562' WHERE key = ?1",
            "headers blob ends inside a header value",
        ),
        (
            "trailing-headers",
            "UPDATE records SET headers = x'0000000000' WHERE key = ?1",
            "1 bytes after its 0 headers",
        ),
        (
            "partial-response",
            "UPDATE records SET body = NULL WHERE key = ?1",
            "only partly present",
        ),
        (
            "bad-status",
            "UPDATE records SET status = 70000 WHERE key = ?1",
            "status 70000",
        ),
        (
            "negative-version",
            "UPDATE records SET version = -3 WHERE key = ?1",
            "version -3 is negative",
        ),
    ];
    let prefix = unique("corrupt");
    for (name, sql, _) in corruptions {
        let key = format!("{prefix}/{name}");
        store.insert(&key, done(now + 10_000), now).await.unwrap();
        assert_eq!(raw(&db).execute(sql, [&key]).unwrap(), 1, "{name}");
    }
    for (name, _, reason) in corruptions {
        let key = format!("{prefix}/{name}");
        let is_this_key = |e: StoreError| match e {
            StoreError::Corrupt {
                store: "sqlite",
                key: k,
                reason: r,
            } => {
                assert_eq!(k, key);
                assert!(r.contains(reason), "{name}: {r}");
            }
            other => panic!("{name}: expected corrupt, got {other:?}"),
        };
        is_this_key(store.get(&key, now).await.unwrap_err());
        // The claim's read of the live record fails too, rather than seeing it absent and writing over it.
        is_this_key(
            store
                .insert(&key, claimed(now + 1, now + 10_000), now)
                .await
                .unwrap_err(),
        );
        let listed = store.list(&under(&key, 10), now).await;
        is_this_key(listed.unwrap_err());
    }

    // Through the guard: fail closed, the handler never runs, the row is untouched.
    let guard = guard_at_base(store.clone());
    let calls = AtomicUsize::new(0);
    let key = format!("{prefix}/bad-state");
    let outcome = guard.run(&key, "fp", counting(&calls)).await.unwrap();
    assert!(
        matches!(&outcome, Outcome::Unavailable(why) if why.contains(&key)),
        "{outcome:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let state: String = raw(&db)
        .query_row("SELECT state FROM records WHERE key = ?1", [&key], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        state, "finished",
        "a corrupt row is reported, never overwritten"
    );
}

#[tokio::test]
async fn opening_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let message =
        |r: Result<Arc<dyn Store>, OpenError>| r.err().expect("open must fail").to_string();

    let missing = dir.path().join("no-such-dir").join("idem.db");
    let m = message(idem::store::open(&format!("sqlite:{}", missing.display())).await);
    assert!(
        m.contains("sqlite")
            && m.contains(&missing.display().to_string())
            && m.contains("does not exist"),
        "{m}"
    );

    let m = message(idem::store::open(&format!("sqlite:{}", dir.path().display())).await);
    assert!(m.contains("is a directory"), "{m}");

    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "these are not the pages of a database, just some words long enough to have a header",
    )
    .unwrap();
    let m = message(idem::store::open(&format!("sqlite:{}", text.display())).await);
    assert!(m.contains("not a database"), "{m}");

    let foreign = dir.path().join("foreign.db");
    raw(&foreign)
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
        .unwrap();
    let m = message(idem::store::open(&format!("sqlite:{}", foreign.display())).await);
    assert!(m.contains("not an idem database"), "{m}");
    let tables: i64 = raw(&foreign)
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 1, "a foreign file is left as it was");

    // A newer schema is refused, not read by guesswork.
    let db = dir.path().join("idem.db");
    drop(open(&db));
    assert_eq!(
        raw(&db)
            .query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
            .unwrap(),
        3
    );
    raw(&db).execute_batch("PRAGMA user_version = 99").unwrap();
    let m = message(idem::store::open(&format!("sqlite:{}", db.display())).await);
    assert!(
        m.contains("schema version is 99, newer than this idem understands (3)"),
        "{m}"
    );

    for (url, expected) in [
        ("sqlite:", "needs a file path"),
        (
            "sqlite:x.db?synchronous=off",
            "synchronous=\"off\" is not one of normal, full",
        ),
        (
            "sqlite:x.db?cache=shared",
            "unknown sqlite option \"cache=shared\"",
        ),
    ] {
        let m = message(idem::store::open(url).await);
        assert!(m.contains(expected), "{url}: {m}");
    }
}

#[tokio::test]
async fn urls_choose_the_file_and_durability() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("full.db");
    let store = idem::store::open(&format!("sqlite://{}?synchronous=FULL", db.display()))
        .await
        .unwrap();
    assert_eq!(store.name(), "sqlite");
    let key = unique("url");
    put(&store, &key, done(BASE_MS + 10_000), BASE_MS).await;
    drop(store);
    let reopened = SqliteStore::open(
        &db,
        SqliteOptions {
            synchronous: Synchronous::Full,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    assert_eq!(reopened.options().synchronous, Synchronous::Full);
    assert!(
        reopened.get(&key, BASE_MS).await.unwrap().is_some(),
        "the record is in the file the URL named"
    );
    let mode: String = raw(&db)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_bounded_and_frees_only_expired_records() {
    let (_dir, db) = db_file();
    let store = open(&db);
    let now = BASE_MS;
    for i in 0..10 {
        put(&store, &format!("old/{i}"), done(now + 100), now).await;
    }
    for i in 0..2 {
        put(&store, &format!("live/{i}"), done(now + 10_000), now).await;
    }
    assert_eq!(
        store.purge_expired(now + 99, 100).await.unwrap(),
        0,
        "nothing has expired yet"
    );
    assert_eq!(
        store.purge_expired(now + 100, 4).await.unwrap(),
        4,
        "at most the limit"
    );
    assert_eq!(rows(&db), 8);
    assert_eq!(store.purge_expired(now + 100, 100).await.unwrap(), 6);
    assert_eq!(rows(&db), 2, "live records stay");
    let plan: String = raw(&db)
        .query_row(
            "EXPLAIN QUERY PLAN SELECT rowid FROM records WHERE expires_at_ms <= 1 LIMIT 5",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(
        plan.contains("records_expires_at"),
        "the purge finds expired rows by index: {plan}"
    );
}

// Real time: the writer thread answers in real time, and paused time would
// race the purge's own batch timeout past it.
#[tokio::test]
async fn the_purger_frees_every_expired_row_each_period_in_batches() {
    let (_dir, db) = db_file();
    let store = open(&db);
    let clock = ManualClock::new(BASE_MS);
    for i in 0..7 {
        put(&store, &format!("old/{i}"), done(BASE_MS + 100), BASE_MS).await;
    }
    put(&store, "live", done(BASE_MS + 10_000), BASE_MS).await;
    clock.advance(Duration::from_millis(100));
    let shared: Arc<dyn idem::Store> = Arc::new(store.clone());
    let purger = idem::store::Purger::spawn(shared, Arc::new(clock), Duration::from_millis(200), 3);
    assert_eq!(rows(&db), 8);
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while purger.stats().runs == 0 && std::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = purger.stats();
    assert_eq!(
        rows(&db),
        1,
        "one period frees every expired row (in batches of 3), the live one kept: {stats:?}"
    );
    assert_eq!((stats.purged, stats.last_purged, stats.errors), (7, 7, 0));
    drop(purger);
    drop(store);
}

/// Two stores on one file stand for two processes: SQLite's write lock keeps
/// every claim atomic across them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_let_one_claimer_proceed() {
    let (_dir, db) = db_file();
    let guards = [open(&db), open(&db)].map(guard_at_base);
    for round in 0..5 {
        let key = unique(&format!("shared-{round}"));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..32 {
            let (guard, key) = (guards[i % 2].clone(), key.clone());
            tasks.spawn(async move { guard.begin(&key, "fp").await });
        }
        assert_eq!(
            crate::conformance::proceeded(tasks).await,
            1,
            "round {round}: exactly one claimer proceeds"
        );
    }
}

/// Gateways started together on one new file (as `idem serve` processes in a
/// fleet, or in the crash tests, are): every one opens it, none fails with
/// "database is locked" while another switches the file to WAL or writes
/// its schema.
#[test]
fn stores_opening_one_new_file_at_once_all_open() {
    for round in 0..20 {
        let (_dir, db) = db_file();
        let start = Arc::new(std::sync::Barrier::new(8));
        let openers: Vec<_> = (0..8)
            .map(|_| {
                let (db, start) = (db.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(&db, SqliteOptions::default()).map(drop)
                })
            })
            .collect();
        for opener in openers {
            if let Err(e) = opener.join().unwrap() {
                panic!("round {round}: {e}");
            }
        }
    }
}

/// Another process holding the write lock past the busy timeout: the guard
/// fails closed (the handler never runs), and works again once it lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_locked_by_another_process_fails_closed_then_recovers() {
    let (_dir, db) = db_file();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(50),
        ..SqliteOptions::default()
    };
    let guard = guard_at_base(SqliteStore::open(&db, options).unwrap());
    let calls = AtomicUsize::new(0);
    let handler = counting(&calls);
    let other_process = raw(&db);
    other_process.execute_batch("BEGIN IMMEDIATE").unwrap();
    let key = unique("locked");
    let outcome = guard.run(&key, "fp", handler).await.unwrap();
    assert!(
        matches!(&outcome, Outcome::Unavailable(why) if why.contains("locked")),
        "{outcome:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "fail closed");
    other_process.execute_batch("COMMIT").unwrap();
    assert!(matches!(
        guard.run(&key, "fp", handler).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A lone write commits in place, with no trip to the writer thread and
/// back; a crowd of concurrent writes still shares the writer thread's
/// commits (group commit). Each commit's thread and size are seen through
/// the store's before-commit hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_commits_in_place_and_a_crowd_shares_the_writer_threads_commits() {
    let live = || claimed(BASE_MS + 30_000, BASE_MS + 60_000);
    let (_dir, db) = db_file();
    let store = open(&db);
    let commits: Arc<std::sync::Mutex<Vec<(bool, usize)>>> = Arc::default();
    let seen = commits.clone();
    assert!(store.set_before_commit(move |primitives| {
        let on_writer = std::thread::current().name() == Some("idem-sqlite-writer");
        seen.lock().unwrap().push((on_writer, primitives));
    }));

    for i in 0..20 {
        let key = format!("lone-{i}");
        store.insert(&key, live(), BASE_MS).await.unwrap();
    }
    let lone = std::mem::take(&mut *commits.lock().unwrap());
    assert_eq!(lone.len(), 20, "one commit per lone write: {lone:?}");
    assert!(
        lone.iter().all(|&(on_writer, n)| !on_writer && n == 1),
        "every lone write committed in place, alone: {lone:?}"
    );

    let store = Arc::new(store);
    let mut crowd = tokio::task::JoinSet::new();
    for i in 0..256 {
        let store = store.clone();
        crowd.spawn(async move {
            store
                .insert(&format!("crowd-{i}"), live(), BASE_MS)
                .await
                .unwrap()
        });
    }
    while let Some(inserted) = crowd.join_next().await {
        assert!(matches!(
            inserted.unwrap(),
            idem::store::InsertOutcome::Inserted(1)
        ));
    }
    let crowd = std::mem::take(&mut *commits.lock().unwrap());
    assert_eq!(
        crowd.iter().map(|&(_, n)| n).sum::<usize>(),
        256,
        "every write committed once: {crowd:?}"
    );
    assert!(
        crowd.iter().any(|&(on_writer, n)| on_writer && n > 1),
        "concurrent writes shared a commit on the writer thread: {crowd:?}"
    );

    // Once the crowd has gone (and stayed gone a moment), a lone write
    // commits in place again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.insert("after", live(), BASE_MS).await.unwrap();
    let after = std::mem::take(&mut *commits.lock().unwrap());
    assert_eq!(after, vec![(false, 1)], "back in place after the crowd");
    assert_eq!(rows(&db), 277);
}

/// A file written by a 0.1 host (schema version 1: no holder, no
/// checkpoint) is migrated when opened, and its records keep working: a
/// completed one replays its bytes, a claim whose holder crashed is taken
/// over after its lease and completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_schema_version_1_is_migrated_and_its_records_keep_working() {
    let (_dir, db) = db_file();
    raw(&db)
        .execute_batch(&format!(
            "CREATE TABLE records (
                key TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL,
                fingerprint TEXT NOT NULL, state TEXT NOT NULL,
                lease_until_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
                status INTEGER, headers BLOB, body BLOB
            ) STRICT;
            CREATE INDEX records_expires_at ON records (expires_at_ms);
            INSERT INTO records VALUES ('paid', 2, 'fp', 'done', 0, {exp}, 201,
                x'00000001000000017800000001ff', x'7061696421');
            INSERT INTO records VALUES ('crashed', 1, 'fp', 'processing', {lease}, {exp},
                NULL, NULL, NULL);
            PRAGMA user_version = 1; PRAGMA application_id = 1768187245;",
            exp = BASE_MS + 60_000,
            lease = BASE_MS - 1,
        ))
        .unwrap();
    let store = open(&db);
    let version: i64 = raw(&db)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3, "migrated to the current schema");
    crate::conformance::records_of_0_1_hosts_keep_working(store).await;
}
