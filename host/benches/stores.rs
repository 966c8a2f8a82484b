//! Stores under the guard, beside each store's raw baseline, in one run:
//!
//! - `guarded`: `begin` on a new key + `complete` with a 256-byte response,
//!   through the component (one insert and one replace in the store);
//! - `replay`: `begin` on a completed key, which returns the stored response;
//! - `raw`: the same minimal work done directly through the same driver: one
//!   bare INSERT and one UPDATE of a row of the same shape, with the same
//!   durability setting and the same thread model. It is what the store
//!   would cost with no guard, no component and no record encoding.
//!
//! Criterion times one caller. Throughput and tail latency at 32 concurrent
//! callers are measured here too (criterion cannot), and printed as a table:
//!
//! ```text
//! cargo bench -p idem --bench stores            # everything
//! cargo bench -p idem --bench stores -- sqlite  # one store
//! ```
//!
//! A store joins with one `bench_store` call in `main`, given a way to open it
//! and its raw baseline.

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

use async_trait::async_trait;
use criterion::Criterion;
use idem::store::{SqliteOptions, SqliteStore, Store, Synchronous};
use idem::{Decision, Guard, Response};
use rusqlite::{Connection, params};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// The concurrency levels of the table.
const CALLERS: [usize; 2] = [1, 32];

fn response() -> Response {
    Response {
        status: 200,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: vec![b'x'; 256],
    }
}

/// The minimal store work of one guarded op, done directly.
#[async_trait]
pub trait RawBaseline: Send + Sync + 'static {
    async fn op(&self, key: &str);
}

/// One row of the printed table.
struct Row {
    store: String,
    work: &'static str,
    callers: usize,
    ops_per_s: f64,
    p50: Duration,
    p99: Duration,
    baseline: bool,
}

fn next_key(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
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

/// Runs `op` from `callers` tasks for `time`; ops/s and latency percentiles.
async fn measure<F, Fut>(callers: usize, time: Duration, op: F) -> (f64, Duration, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + time;
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let op = op.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut i = caller;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(i).await;
                latencies.push(t.elapsed());
                i += callers;
            }
            latencies
        });
    }
    let mut all: Vec<Duration> = Vec::new();
    while let Some(l) = tasks.join_next().await {
        all.extend(l.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    let pct = |p: usize| {
        all.get((all.len() * p / 100).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let ops = u32::try_from(all.len()).expect("fewer than 4 billion ops");
    (f64::from(ops) / elapsed.as_secs_f64(), pct(50), pct(99))
}

/// Benches one store: criterion for one caller, and the table's rows for
/// every level of `CALLERS`, with each raw baseline measured the same way.
/// The first baseline is the one "vs raw" compares with.
fn bench_store(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn Store>,
    raws: &[(&'static str, Arc<dyn RawBaseline>)],
    table_time: Duration,
    table: &mut Vec<Row>,
) {
    let guard = rt.block_on(async { Guard::builder(store).build().unwrap() });
    // Completed keys to replay.
    let replay_keys: Arc<Vec<String>> = Arc::new(rt.block_on(async {
        let mut keys = Vec::new();
        for _ in 0..1_000 {
            let key = next_key(&format!("{name}-replay"));
            guarded(&guard, &key).await;
            keys.push(key);
        }
        keys
    }));

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
        group.bench_function(*work, |b| {
            b.to_async(rt)
                .iter(|| async { raw.op(&next_key("r")).await });
        });
    }
    group.finish();

    if !selected(name) {
        return;
    }
    for callers in CALLERS {
        let g = guard.clone();
        let (ops_per_s, p50, p99) = rt.block_on(measure(callers, table_time, move |_| {
            let g = g.clone();
            async move { guarded(&g, &next_key("tg")).await }
        }));
        table.push(Row {
            store: name.into(),
            work: "guarded",
            callers,
            ops_per_s,
            p50,
            p99,
            baseline: false,
        });

        let (g, keys) = (guard.clone(), replay_keys.clone());
        let (ops_per_s, p50, p99) = rt.block_on(measure(callers, table_time, move |i| {
            let (g, keys) = (g.clone(), keys.clone());
            async move { replay(&g, &keys[i % keys.len()]).await }
        }));
        table.push(Row {
            store: name.into(),
            work: "replay",
            callers,
            ops_per_s,
            p50,
            p99,
            baseline: false,
        });

        for (work, raw) in raws {
            let r = raw.clone();
            let (ops_per_s, p50, p99) = rt.block_on(measure(callers, table_time, move |_| {
                let r = r.clone();
                async move { r.op(&next_key("tr")).await }
            }));
            table.push(Row {
                store: name.into(),
                work,
                callers,
                ops_per_s,
                p50,
                p99,
                baseline: true,
            });
        }
    }
}

/// The first free argument, as criterion takes it: a substring of the names to run.
fn filter() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

fn selected(name: &str) -> bool {
    filter().is_none_or(|f| name.contains(&f) || f.contains(name))
}

/// SQLite's raw baseline: a connection on its own thread, like the store's
/// writer; each op is a bare INSERT of a new row and an UPDATE of it. With
/// `group_commit`, what is queued is drained into one transaction, like the
/// store does; without, each statement commits on its own.
struct SqliteRaw {
    queue: mpsc::Sender<(String, oneshot::Sender<()>)>,
    _dir: tempfile::TempDir,
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
        let (queue, mut rx) = mpsc::channel::<(String, oneshot::Sender<()>)>(4096);
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
                    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                }
                for (key, _) in &batch {
                    conn.prepare_cached(
                        "INSERT INTO records (key, version, fingerprint, state, lease_until_ms, expires_at_ms)
                         VALUES (?1, 1, 'fp', 'processing', 1, 2)",
                    )
                    .unwrap()
                    .execute(params![key])
                    .unwrap();
                    conn.prepare_cached(
                        "UPDATE records SET version = 2, state = 'done', status = 200, headers = ?2, body = ?3 WHERE key = ?1",
                    )
                    .unwrap()
                    .execute(params![key, headers, body])
                    .unwrap();
                }
                if group_commit {
                    conn.execute_batch("COMMIT").unwrap();
                }
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(());
                }
            }
        });
        SqliteRaw { queue, _dir: dir }
    }
}

#[async_trait]
impl RawBaseline for SqliteRaw {
    async fn op(&self, key: &str) {
        let (reply, done) = oneshot::channel();
        self.queue.send((key.to_owned(), reply)).await.unwrap();
        done.await.unwrap();
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
        Duration::from_secs(3)
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
        let raws: [(&'static str, Arc<dyn RawBaseline>); 2] = [
            ("raw", Arc::new(SqliteRaw::open(sync, true))),
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
        let raw = table
            .iter()
            .find(|r| r.store == row.store && r.callers == row.callers && r.baseline);
        let ratio = match (row.baseline, raw) {
            (true, _) | (_, None) => String::new(),
            (_, Some(raw)) => format!("{:.0}%", 100.0 * row.ops_per_s / raw.ops_per_s),
        };
        println!(
            "{:<14} {:<8} {:>7} {:>12.0} {:>10.1?} {:>10.1?} {:>8}",
            row.store, row.work, row.callers, row.ops_per_s, row.p50, row.p99, ratio
        );
    }
}
