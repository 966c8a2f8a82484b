//! Stores under the guard, beside each store's raw baseline, in one run:
//!
//! - `guarded`: `begin` on a new key + `complete` with a 256-byte response,
//!   through the component (one insert and one replace in the store);
//! - `replay`: `begin` on a completed key, which returns the stored response;
//! - `store`: a guarded op's store work (insert, then replace) straight on
//!   the store, without the guard or the component;
//! - `raw`: the same minimal work done directly through the same driver, with
//!   the same durability setting and the same thread model: a bare INSERT of
//!   the new row committed before the caller goes on (as a claim must be),
//!   then an UPDATE storing the response and the new expiry, on a table of
//!   the same shape. What the store would cost with no guard, no component,
//!   no record encoding and no version checks. `guarded` and `store` are
//!   compared with it;
//! - `raw-read`: a bare SELECT of a completed row by key on a pooled read
//!   connection off the runtime. `replay` is compared with it;
//! - `raw-auto`: `raw` with each statement its own autocommit transaction (no
//!   group commit), for scale.
//!
//! Criterion times one caller. Throughput and tail latency at 32 concurrent
//! callers are measured here too (criterion cannot), and printed as a table.
//! All the works of a store take turns (6 slices each per concurrency level),
//! so a change in the machine's load weighs on all of them alike.
//!
//! ```text
//! cargo bench -p idem --bench stores              # everything
//! cargo bench -p idem --bench stores -- sqlite/   # the default durability only
//! cargo bench -p idem --bench stores -- sqlite/x  # its table only (no criterion)
//! IDEM_BENCH_SECS=6 IDEM_BENCH_CALLERS=1,8,32 IDEM_BENCH_WORKS=guarded,raw \
//!     cargo bench -p idem --bench stores -- sqlite/x
//! ```
//!
//! A store joins with one `bench_store` call in `main`, given a way to open it
//! and its raw baselines.

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

mod support;

use async_trait::async_trait;
use criterion::Criterion;
use idem::store::{InsertOutcome, SqliteOptions, SqliteStore, Store, Synchronous};
use idem::{Decision, Guard, Record, Response, State};
use rusqlite::{Connection, params};
use std::sync::Arc;
use std::time::Duration;
use support::{Figures, Op, fresh, op};
use tokio::sync::{mpsc, oneshot};

/// The concurrency levels of the table: 1 and 32, or `IDEM_BENCH_CALLERS=1,8,…`.
fn callers() -> Vec<usize> {
    std::env::var("IDEM_BENCH_CALLERS").map_or(vec![1, 32], |list| {
        list.split(',')
            .map(|n| n.trim().parse().expect("IDEM_BENCH_CALLERS: numbers"))
            .collect()
    })
}

fn response() -> Response {
    Response {
        status: 200,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: vec![b'x'; 256],
    }
}

/// The minimal store work of one op, done directly through the driver.
#[async_trait]
pub trait RawBaseline: Send + Sync + 'static {
    /// Rows it needs before the run.
    async fn prepare(&self) {}
    /// One op; `i` is unique to the call.
    async fn op(&self, i: u64);
}

/// One row of the printed table.
struct Row {
    store: String,
    work: &'static str,
    callers: usize,
    figures: Figures,
    baseline: bool,
}

/// Milliseconds since the epoch, as the guard's clock gives them.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn next_key(prefix: &str) -> String {
    format!("{prefix}-{}", fresh())
}

async fn guarded(guard: &Guard, key: &str) {
    let Decision::Proceed(claim) = guard.begin(key, "fp").await.unwrap() else {
        panic!("{key} is new")
    };
    guard.complete(claim, response()).await.1.unwrap();
}

async fn replay(guard: &Guard, key: &str) {
    let d = guard.begin(key, "fp").await.unwrap();
    assert!(matches!(d, Decision::Replay(_)), "{d:?}");
}

/// Slices per work and concurrency level: the works take turns, so that a
/// change in the machine's load during the run weighs on all of them alike.
const TURNS: usize = 6;

/// Benches one store: criterion for one caller, and the table's rows for
/// every level of `callers()`. Each work is given the number of its call.
/// `raws` are baselines: the first is what "vs raw" compares `guarded` and
/// `store` with; one named `raw-read` is what `replay` compares with.
fn bench_store(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn Store>,
    raws: &[(&'static str, Arc<dyn RawBaseline>)],
    table_time: Duration,
    table: &mut Vec<Row>,
) {
    let guard = rt.block_on(async { Guard::builder(store.clone()).build().unwrap() });
    // Completed keys to replay.
    let replay_keys: Arc<Vec<String>> = Arc::new(rt.block_on(async {
        let mut keys = Vec::new();
        for i in 0..REPLAY_KEYS {
            let key = replay_key(name, i as u64);
            guarded(&guard, &key).await;
            keys.push(key);
        }
        keys
    }));
    for (_, raw) in raws {
        rt.block_on(raw.prepare());
    }

    let mut group = c.benchmark_group(name);
    group.bench_function("guarded", |b| {
        b.to_async(rt)
            .iter(|| async { guarded(&guard, &next_key("g")).await });
    });
    let mut n = 0usize;
    group.bench_function("replay", |b| {
        b.to_async(rt).iter(|| {
            n += 1;
            let key = &replay_keys[n % replay_keys.len()];
            async { replay(&guard, key).await }
        });
    });
    for (work, raw) in raws {
        group.bench_function(*work, |b| b.to_async(rt).iter(|| raw.op(fresh())));
    }
    group.finish();

    if !selected(name) {
        return;
    }
    let g = guard.clone();
    let guarded_op = op(move |i| {
        let g = g.clone();
        async move { guarded(&g, &format!("tg-{i}")).await }
    });
    let (g, keys) = (guard.clone(), replay_keys.clone());
    let replay_op = op(move |i| {
        let (g, keys) = (g.clone(), keys.clone());
        async move { replay(&g, &keys[i as usize % keys.len()]).await }
    });
    let s = store.clone();
    let store_op = op(move |i| {
        let s = s.clone();
        async move { claim_complete(&*s, &format!("ts-{i}")).await }
    });
    let mut works: Vec<(&'static str, Op, bool)> = vec![
        ("guarded", guarded_op, false),
        ("replay", replay_op, false),
        ("store", store_op, false),
    ];
    for (work, raw) in raws {
        let r = raw.clone();
        works.push((
            work,
            op(move |i| {
                let r = r.clone();
                async move { r.op(i).await }
            }),
            true,
        ));
    }
    // IDEM_BENCH_WORKS=guarded,raw keeps only those (for profiling one of them).
    if let Ok(only) = std::env::var("IDEM_BENCH_WORKS") {
        works.retain(|(work, _, _)| only.split(',').any(|w| w == *work));
    }
    for callers in callers() {
        let ops: Vec<&Op> = works.iter().map(|(_, op, _)| op).collect();
        let results = rt.block_on(support::measure(callers, table_time, TURNS, &ops));
        for ((work, _, baseline), figures) in works.iter().zip(results) {
            table.push(Row {
                store: name.into(),
                work,
                callers,
                figures,
                baseline: *baseline,
            });
        }
    }
}

/// How many completed keys the replays cycle through.
const REPLAY_KEYS: usize = 1_000;

fn replay_key(store: &str, i: u64) -> String {
    format!("{store}-replay-{}", i % REPLAY_KEYS as u64)
}

/// A guarded op's store work straight on the store, without the guard or
/// the component: insert a claim, replace it with the response. Timed by the
/// wall clock, as the guard's records are: the guard's `Purger` shares this
/// store and purges by the wall clock, so a record stamped with a fixed past
/// instant could be freed between its insert and its replace.
async fn claim_complete(store: &dyn Store, key: &str) {
    let now = now_ms() as u64;
    let claim = Record {
        fingerprint: "fp".into(),
        state: State::Processing,
        holder: 1,
        lease_until_ms: now + 30_000,
        expires_at_ms: now + 86_400_000,
        response: None,
        checkpoint: None,
    };
    let InsertOutcome::Inserted(version) = store.insert(key, claim, now).await.unwrap() else {
        panic!("{key} is new")
    };
    let done = Record {
        fingerprint: "fp".into(),
        state: State::Done,
        holder: 1,
        lease_until_ms: 0,
        expires_at_ms: now + 86_400_000,
        response: Some(response()),
        checkpoint: None,
    };
    let replaced = store.replace(key, version, done, now).await;
    assert!(replaced.unwrap(), "{key} is at version {version}");
}

/// The first free argument, as criterion takes it: a substring of the names to run.
fn filter() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

fn selected(name: &str) -> bool {
    filter().is_none_or(|f| name.contains(&f) || f.contains(name))
}

/// SQLite's raw baseline: a connection on its own thread, like the store's
/// writer, and the same two round trips to it as a guarded op: a bare INSERT
/// of the new row, committed before the caller goes on (the claim must be
/// durable before the handler runs), then an UPDATE that stores the response.
/// With `group_commit`, what is queued is drained into one transaction, like
/// the store does; without, each statement commits on its own.
struct SqliteRaw {
    queue: mpsc::Sender<(Step, String, oneshot::Sender<()>)>,
    _dir: tempfile::TempDir,
}

#[derive(Clone, Copy)]
enum Step {
    Insert,
    Update,
}

impl SqliteRaw {
    fn open(synchronous: Synchronous, group_commit: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("raw.db")).unwrap();
        let sync = if synchronous == Synchronous::Full {
            "FULL"
        } else {
            "NORMAL"
        };
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync};
             CREATE TABLE records (
                 key TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL, fingerprint TEXT NOT NULL,
                 state TEXT NOT NULL, lease_until_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
                 status INTEGER, headers BLOB, body BLOB) STRICT;
             CREATE INDEX records_expires_at ON records (expires_at_ms);"
        ))
        .unwrap();
        let (queue, mut rx) = mpsc::channel::<(Step, String, oneshot::Sender<()>)>(4096);
        std::thread::spawn(move || {
            let headers = vec![0u8; 40];
            let body = vec![b'x'; 256];
            let mut batch = Vec::new();
            while let Some(first) = rx.blocking_recv() {
                batch.push(first);
                while group_commit && batch.len() < 256 {
                    match rx.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                if group_commit {
                    conn.prepare_cached("BEGIN IMMEDIATE")
                        .unwrap()
                        .execute([])
                        .unwrap();
                }
                for (step, key, _) in &batch {
                    // The columns a guarded op writes: the claim's, then the
                    // response and a new expiry (the index on it changes too).
                    let now = now_ms();
                    match step {
                        Step::Insert => conn.prepare_cached(
                            "INSERT INTO records (key, version, fingerprint, state, lease_until_ms, expires_at_ms)
                             VALUES (?1, 1, ?2, 'processing', ?3, ?4)",
                        )
                        .unwrap()
                        .execute(params![key, "fp", now + 30_000, now + 86_400_000])
                        .unwrap(),
                        Step::Update => conn.prepare_cached(
                            "UPDATE records SET version = 2, state = 'done', lease_until_ms = 0, expires_at_ms = ?2,
                             status = 200, headers = ?3, body = ?4 WHERE key = ?1",
                        )
                        .unwrap()
                        .execute(params![key, now + 86_400_001, headers, body])
                        .unwrap(),
                    };
                }
                if group_commit {
                    conn.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
                }
                for (_, _, reply) in batch.drain(..) {
                    let _ = reply.send(());
                }
            }
        });
        SqliteRaw { queue, _dir: dir }
    }

    async fn step(&self, step: Step, key: &str) {
        let (reply, done) = oneshot::channel();
        self.queue
            .send((step, key.to_owned(), reply))
            .await
            .unwrap();
        done.await.unwrap();
    }
}

#[async_trait]
impl RawBaseline for SqliteRaw {
    async fn op(&self, i: u64) {
        let key = format!("r-{i}");
        self.step(Step::Insert, &key).await;
        self.step(Step::Update, &key).await;
    }
}

/// SQLite's raw read: a SELECT of a completed row by key on a pooled read
/// connection, off the runtime (`spawn_blocking`), as `SqliteStore::get`
/// reads. What a replay would cost if it were only a read.
struct SqliteRead {
    name: &'static str,
    path: std::path::PathBuf,
    readers: Arc<std::sync::Mutex<Vec<Connection>>>,
}

impl SqliteRead {
    /// Reads `raw`'s file, for the bench `name`.
    fn new(name: &'static str, raw: &SqliteRaw) -> Self {
        SqliteRead {
            name,
            path: raw._dir.path().join("raw.db"),
            readers: Arc::default(),
        }
    }
}

#[async_trait]
impl RawBaseline for SqliteRead {
    async fn prepare(&self) {
        let conn = Connection::open(&self.path).unwrap();
        conn.execute_batch("BEGIN").unwrap();
        for i in 0..REPLAY_KEYS as u64 {
            conn.execute(
                "INSERT INTO records VALUES (?1, 2, 'fp', 'done', 0, 9223372036854775807, 200, ?2, ?3)",
                params![replay_key(self.name, i), vec![0u8; 40], vec![b'x'; 256]],
            )
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
    }

    async fn op(&self, i: u64) {
        let (path, readers) = (self.path.clone(), self.readers.clone());
        let key = replay_key(self.name, i);
        tokio::task::spawn_blocking(move || {
            let pooled = readers.lock().unwrap().pop();
            let conn = pooled.unwrap_or_else(|| {
                let conn = Connection::open(&path).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                conn
            });
            let row: (i64, String, String, i64, i64, Option<i64>, Option<Vec<u8>>, Option<Vec<u8>>) = conn
                .prepare_cached(
                    "SELECT version, fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body
                     FROM records WHERE key = ?1 AND expires_at_ms > ?2",
                )
                .unwrap()
                .query_row(params![key, 1_792_382_400_000i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
                })
                .unwrap();
            assert_eq!(row.0, 2);
            readers.lock().unwrap().push(conn);
        })
        .await
        .unwrap();
    }
}

fn open_sqlite(synchronous: Synchronous) -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        dir.path().join("idem.db"),
        SqliteOptions {
            synchronous,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    (Arc::new(store), dir)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: run each part briefly then.
    let benching = std::env::args().any(|a| a == "--bench");
    let table_time = if benching {
        Duration::from_secs_f64(support::secs(3.0))
    } else {
        Duration::from_millis(100)
    };
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut table = Vec::new();

    for (name, sync) in [
        ("sqlite", Synchronous::Normal),
        ("sqlite-full", Synchronous::Full),
    ] {
        let (store, _dir) = open_sqlite(sync);
        let raw = SqliteRaw::open(sync, true);
        let read = SqliteRead::new(name, &raw);
        let raws: [(&'static str, Arc<dyn RawBaseline>); 3] = [
            ("raw", Arc::new(raw)),
            ("raw-read", Arc::new(read)),
            ("raw-auto", Arc::new(SqliteRaw::open(sync, false))),
        ];
        bench_store(&mut c, &rt, name, store, &raws, table_time, &mut table);
    }

    c.final_summary();
    print_table(&table);
}

fn print_table(table: &[Row]) {
    println!(
        "\n{:<14} {:<8} {:>7} {:>12} {:>10} {:>10} {:>8}",
        "store", "work", "callers", "ops/s", "p50", "p99", "vs raw"
    );
    for row in table {
        // A replay is compared with a bare read; the rest with the first baseline.
        let raw = table.iter().find(|r| {
            r.store == row.store
                && r.callers == row.callers
                && r.baseline
                && (row.work != "replay" || r.work == "raw-read")
        });
        let ratio = match (row.baseline, raw) {
            (true, _) | (_, None) => String::new(),
            (_, Some(raw)) => format!(
                "{:.0}%",
                100.0 * row.figures.ops_per_s / raw.figures.ops_per_s
            ),
        };
        println!(
            "{:<14} {:<8} {:>7} {:>12.0} {:>10.1?} {:>10.1?} {:>8}",
            row.store,
            row.work,
            row.callers,
            row.figures.ops_per_s,
            row.figures.p50,
            row.figures.p99,
            ratio
        );
    }
}
