//! Cost at size: each store at 1k, 100k and 1M live keys — bytes per key, a
//! claim's and a replay's p50/p99 — then 1M expired keys purged while
//! claims go on: how long the purge takes and the claims' p99 meanwhile,
//! beside their p99 just before it. Printed as one table.
//!
//! ```text
//! cargo bench -p idem --bench size
//! IDEM_BENCH_SIZES=1000,100000 IDEM_BENCH_STORES=sqlite,redis cargo bench -p idem --bench size
//! ```
//!
//! Bytes per key: the process's resident memory (memory store), the
//! database and WAL files (SQLite), the server's `used_memory` (Redis: the
//! shared server, so other clients' keys move it too) and the table with its
//! indexes (PostgreSQL), each as the growth since the store was empty divided
//! by the keys added. Every record is a completed one with a 32-byte
//! response body and one header, as a replay would return.
//!
//! `IDEM_BENCH_REDIS_URL` / `IDEM_BENCH_POSTGRES_URL` (falling back to the
//! `IDEM_TEST_*` variables) name the servers; a store without one is skipped.

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

mod support;

use deadpool_postgres::tokio_postgres::{self, NoTls};
use idem::store::{InsertOutcome, MemoryStore, PostgresStore, RedisStore, SqliteStore, Store};
use idem::{Record, Response, State};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::url;

const NOW: u64 = 1_792_382_400_000;
/// Records freed per `purge_expired` call: the `Purger`'s own batch.
const PURGE_BATCH: usize = 1_000;
/// Concurrent writers filling a store.
const FILLERS: usize = 64;

fn record(expires_at_ms: u64) -> Record {
    Record {
        fingerprint: "sha256:0123456789abcdef0123456789abcdef".into(),
        state: State::Done,
        holder: 1,
        lease_until_ms: 0,
        expires_at_ms,
        response: Some(Response {
            status: 200,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: br#"{"id":"ord_123","status":"paid"}"#.to_vec(),
        }),
        checkpoint: None,
    }
}

/// What a store occupies now, in bytes.
enum Footprint {
    Rss,
    Files(std::path::PathBuf),
    RedisMemory(redis::aio::MultiplexedConnection),
    PostgresTable(tokio_postgres::Client, String),
}

impl Footprint {
    async fn bytes(&mut self) -> u64 {
        match self {
            Footprint::Rss => {
                let status = std::fs::read_to_string("/proc/self/status").unwrap();
                let kb: u64 = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                    .unwrap();
                kb * 1024
            }
            Footprint::Files(dir) => std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum(),
            Footprint::RedisMemory(conn) => {
                let info: String = redis::cmd("INFO")
                    .arg("memory")
                    .query_async(conn)
                    .await
                    .unwrap();
                info.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap()
            }
            Footprint::PostgresTable(client, table) => {
                let row = client
                    .query_one(
                        "SELECT pg_total_relation_size($1::text::regclass)",
                        &[table],
                    )
                    .await
                    .unwrap();
                row.get::<_, i64>(0) as u64
            }
        }
    }
}

/// Writes keys `from..to` named `{tag}{i}`, `FILLERS` at a time.
async fn fill(store: &Arc<dyn Store>, tag: &str, from: u64, to: u64, expires_at_ms: u64) {
    let next = Arc::new(AtomicU64::new(from));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..FILLERS {
        let (store, next, tag) = (store.clone(), next.clone(), tag.to_owned());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    return;
                }
                let key = format!("{tag}{i}");
                let outcome = store.insert(&key, record(expires_at_ms), NOW).await;
                assert!(
                    matches!(outcome, Ok(InsertOutcome::Inserted(_))),
                    "{key}: {outcome:?}"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// One caller's latencies (µs) of `op(i)` over `secs`, sorted.
async fn latencies<F, Fut>(secs: f64, mut op: F) -> Vec<u64>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut out = Vec::new();
    let mut i = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        op(i).await;
        out.push(t.elapsed().as_micros() as u64);
        i += 1;
    }
    out.sort_unstable();
    out
}

/// A claim of a new key (named from a counter no other call uses).
async fn claim(store: &Arc<dyn Store>, next: &AtomicU64) {
    let key = format!("c{}", next.fetch_add(1, Ordering::Relaxed));
    let outcome = store.insert(&key, record(NOW + 3_600_000), NOW).await;
    assert!(matches!(outcome, Ok(InsertOutcome::Inserted(_))));
}

struct SizeRow {
    store: &'static str,
    keys: u64,
    bytes_per_key: f64,
    claim: (u64, u64),
    replay: (u64, u64),
}

struct PurgeRow {
    store: &'static str,
    expired: u64,
    live: u64,
    purge_secs: f64,
    purged: usize,
    before_p99: u64,
    during_p50: u64,
    during_p99: u64,
    during_claims: usize,
}

async fn bench_store(
    name: &'static str,
    store: Arc<dyn Store>,
    mut footprint: Footprint,
    sizes: &[u64],
    secs: f64,
) -> (Vec<SizeRow>, Option<PurgeRow>) {
    let empty = footprint.bytes().await;
    let claims = AtomicU64::new(0);
    let mut rows = Vec::new();
    let mut have = 0;
    for &size in sizes {
        let t = Instant::now();
        fill(&store, "live", have, size, NOW + 86_400_000).await;
        eprintln!(
            "{name}: {size} live keys ({:.1} s to add {})",
            t.elapsed().as_secs_f64(),
            size - have
        );
        have = size;
        let bytes = footprint.bytes().await;
        // Claims add keys too: measured after the footprint.
        let claim_lat = latencies(secs, |_| claim(&store, &claims)).await;
        let replay_lat = latencies(secs, |i| {
            let store = store.clone();
            async move {
                // Spread over the whole keyspace, not one hot key.
                let key = format!("live{}", i.wrapping_mul(2_654_435_761) % size);
                let outcome = store.insert(&key, record(NOW + 3_600_000), NOW).await;
                assert!(matches!(outcome, Ok(InsertOutcome::Existing(_))));
            }
        })
        .await;
        rows.push(SizeRow {
            store: name,
            keys: size,
            bytes_per_key: bytes.saturating_sub(empty) as f64 / size as f64,
            claim: (percentile(&claim_lat, 0.5), percentile(&claim_lat, 0.99)),
            replay: (percentile(&replay_lat, 0.5), percentile(&replay_lat, 0.99)),
        });
    }
    let expired = *sizes.last().unwrap();
    // Expired by the guard's clock one second after `NOW`.
    fill(&store, "gone", 0, expired, NOW + 1_000).await;
    let before = latencies(secs, |_| claim(&store, &claims)).await;
    let purging = Arc::new(AtomicBool::new(true));
    let purge = async {
        let t = Instant::now();
        let mut purged = 0;
        // In batches, as the `Purger` does: each one bounded, and the
        // runtime given back between them.
        loop {
            let n = store.purge_expired(NOW + 2_000, PURGE_BATCH).await.unwrap();
            purged += n;
            if n == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        purging.store(false, Ordering::Relaxed);
        (t.elapsed().as_secs_f64(), purged)
    };
    // The traffic on a task of its own, as a request is beside the purger's.
    let counter = Arc::new(AtomicU64::new(claims.load(Ordering::Relaxed)));
    let traffic = tokio::spawn({
        let (store, purging, counter) = (store.clone(), purging.clone(), counter.clone());
        async move {
            let mut lat = Vec::new();
            while purging.load(Ordering::Relaxed) {
                let t = Instant::now();
                claim(&store, &counter).await;
                lat.push(t.elapsed().as_micros() as u64);
            }
            lat.sort_unstable();
            lat
        }
    });
    let (purge_secs, purged) = purge.await;
    let during = traffic.await.unwrap();
    claims.store(counter.load(Ordering::Relaxed), Ordering::Relaxed);
    let during = if during.is_empty() { vec![0] } else { during };
    let row = PurgeRow {
        store: name,
        expired,
        live: have + claims.load(Ordering::Relaxed),
        purge_secs,
        purged,
        before_p99: percentile(&before, 0.99),
        during_p50: percentile(&during, 0.5),
        during_p99: percentile(&during, 0.99),
        during_claims: during.len(),
    };
    (rows, Some(row))
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sizes: Vec<u64> = std::env::var("IDEM_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().parse().unwrap()).collect())
        .unwrap_or_else(|| vec![1_000, 100_000, 1_000_000]);
    let secs = support::secs(2.0);
    let wanted = |name: &str| {
        std::env::var("IDEM_BENCH_STORES").map_or(true, |only| only.split(',').any(|s| s == name))
    };
    let run = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let mut size_rows = Vec::new();
    let mut purge_rows = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let mut stores: Vec<(&'static str, Arc<dyn Store>, Footprint)> = Vec::new();
        if wanted("memory") {
            stores.push(("memory", Arc::new(MemoryStore::new()), Footprint::Rss));
        }
        if wanted("sqlite") {
            let path = dir.path().join("idem.db");
            let store = SqliteStore::open(&path, Default::default()).unwrap();
            stores.push((
                "sqlite",
                Arc::new(store),
                Footprint::Files(dir.path().to_owned()),
            ));
        }
        match url("REDIS") {
            Some(url) if wanted("redis") => {
                // A grace of an hour: the expired keys stay for the purge.
                let store =
                    RedisStore::open(&format!("{url}?prefix=idem-size:{run}:&grace_ms=3600000"))
                        .await
                        .unwrap();
                let conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                stores.push(("redis", Arc::new(store), Footprint::RedisMemory(conn)));
            }
            Some(_) => {}
            None => eprintln!("redis: skipped, IDEM_BENCH_REDIS_URL is not set"),
        }
        match url("POSTGRES") {
            Some(url) if wanted("postgres") => {
                let table = "idem_size".to_owned();
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP TABLE IF EXISTS {table} CASCADE"))
                    .await
                    .unwrap();
                let store = PostgresStore::open(&format!("{url}?table={table}&pool=32"))
                    .await
                    .unwrap();
                stores.push((
                    "postgres",
                    Arc::new(store),
                    Footprint::PostgresTable(client, table),
                ));
            }
            Some(_) => {}
            None => eprintln!("postgres: skipped, IDEM_BENCH_POSTGRES_URL is not set"),
        }
        for (name, store, footprint) in stores {
            let (rows, purge) = bench_store(name, store, footprint, &sizes, secs).await;
            size_rows.extend(rows);
            purge_rows.extend(purge);
        }
        if let Some(url) = url("REDIS").filter(|_| wanted("redis")) {
            support::unlink_matching(&url, &format!("idem-size:{run}:*")).await;
        }
    });
    println!(
        "\n| store | live keys | bytes/key | claim p50 µs | claim p99 µs | replay p50 µs | replay p99 µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &size_rows {
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} |",
            r.store, r.keys, r.bytes_per_key, r.claim.0, r.claim.1, r.replay.0, r.replay.1
        );
    }
    println!(
        "\n| store | expired keys | live keys | purge s | purged | claim p99 µs before | claim p50 µs during | claim p99 µs during | claims during |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &purge_rows {
        println!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
            r.store,
            r.expired,
            r.live,
            r.purge_secs,
            r.purged,
            r.before_p99,
            r.during_p50,
            r.during_p99,
            r.during_claims
        );
    }
}
