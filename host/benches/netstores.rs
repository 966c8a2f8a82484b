//! Redis and PostgreSQL stores against their raw servers, in one run, through
//! the same driver.
//!
//! Per store: a guarded operation's store work (claim = `insert` of a new
//! key, then complete = `replace`) and a replay (`insert` finding the live
//! record), each beside the raw server doing the same minimal work:
//! Redis `SET NX` + `SET` and `GET`; PostgreSQL `INSERT` + `UPDATE` and
//! `SELECT` on a plain table of the same columns. Also `Guard::run` (through
//! the component) for scale. 1 caller and 32 concurrent callers: ops/s,
//! p50, p99, printed as a table; criterion measures the single-caller figures.
//!
//! The Redis rows run on a lone Redis, on Valkey 8.1 with its native
//! compare-and-set and without (`cas=script`), and on a Redis Cluster with
//! and without `wait=1` (the raw side there goes through the same cluster
//! client).
//!
//! `IDEM_BENCH_REDIS_URL`, `IDEM_BENCH_VALKEY_URL`,
//! `IDEM_BENCH_REDIS_CLUSTER_URL` and `IDEM_BENCH_POSTGRES_URL` (falling back
//! to the `IDEM_TEST_*` variables) name the servers; a store without one is
//! skipped.
//! `IDEM_BENCH_SECS` sets the seconds per table row (default 3);
//! `IDEM_BENCH_ROWS=TEXT` runs only the rows whose label contains TEXT;
//! `IDEM_BENCH_STORES=TEXT` only the stores whose name contains it.

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic, clippy::type_complexity)]

mod support;

use criterion::Criterion;
use deadpool_postgres::tokio_postgres::{self, NoTls};
use idem::store::{InsertOutcome, PostgresStore, RedisStore, Store};
use idem::{Guard, Record, Response, State};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::{Figures, Op, fresh, measure, op, url};

const NOW: u64 = 1_792_382_400_000;

fn record(state: State) -> Record {
    let response = (state == State::Done).then(|| Response {
        status: 200,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: br#"{"id":"ord_123","status":"paid"}"#.to_vec(),
    });
    Record {
        fingerprint: "sha256:0123456789abcdef".into(),
        state,
        holder: 1,
        lease_until_ms: NOW + 30_000,
        expires_at_ms: NOW + 600_000,
        response,
        checkpoint: None,
    }
}

/// Slices per table row: idem and raw take turns, so that a change in the
/// machine's load during the row weighs on both sides alike. Short slices
/// matter at 32 callers, where a server's throughput drifts by ±15 % over a
/// few seconds (a growing Redis keyspace, expiry, the other core's load):
/// with 6 slices a side, Redis claim+complete read 52–81 % of raw in six
/// runs; with 30, 71–75 %.
const TURNS: usize = 30;

struct Pair {
    label: &'static str,
    store: Op,
    raw: Op,
}

/// The store side of the pairs: a claim of a new key (named `{prefix}{i}`)
/// and its completion, `insert` then `replace`; and a replay, an `insert`
/// finding the live record of the key `replayed`, written here.
async fn store_ops(store: &Arc<dyn Store>, prefix: &str) -> (Op, Op) {
    store
        .insert("replayed", record(State::Done), NOW)
        .await
        .unwrap();
    let (s, prefix) = (store.clone(), prefix.to_owned());
    let claim_complete = op(move |i| {
        let (s, key) = (s.clone(), format!("{prefix}{i}"));
        async move {
            let InsertOutcome::Inserted(v) = s
                .insert(&key, record(State::Processing), NOW)
                .await
                .unwrap()
            else {
                panic!("{key} is new")
            };
            let replaced = s.replace(&key, v, record(State::Done), NOW).await;
            assert!(replaced.unwrap(), "{key} is at version {v}");
        }
    });
    let s = store.clone();
    let replay = op(move |_| {
        let s = s.clone();
        async move {
            let outcome = s
                .insert("replayed", record(State::Processing), NOW)
                .await
                .unwrap();
            assert!(matches!(outcome, InsertOutcome::Existing(_)));
        }
    });
    (claim_complete, replay)
}

/// The store's default (`connections=4`).
const REDIS_CONNECTIONS: usize = 4;

/// The raw side's connection: to the lone server, or through the cluster
/// client the store uses.
#[derive(Clone)]
enum RawConn {
    Server(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for RawConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RawConn::Server(c) => c.req_packed_command(cmd),
            RawConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RawConn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            RawConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        0
    }
}

/// `options` are added to the store's URL (`&wait=1`, `&cas=script`).
async fn redis_pairs(url: &str, options: &str, run: &str) -> (Vec<Pair>, Arc<dyn Store>) {
    // The raw side gets as many multiplexed connections as the store, used in turn the same way.
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::open(&format!(
            "{url}?prefix=idem-bench:{run}:&connections={REDIS_CONNECTIONS}{options}"
        ))
        .await
        .unwrap(),
    );
    let mut conns = Vec::new();
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
        let client = redis::cluster::ClusterClient::new(nodes).unwrap();
        for _ in 0..REDIS_CONNECTIONS {
            conns.push(RawConn::Cluster(
                client.get_async_connection().await.unwrap(),
            ));
        }
    } else {
        let client = redis::Client::open(url).unwrap();
        for _ in 0..REDIS_CONNECTIONS {
            conns.push(RawConn::Server(
                client.get_connection_manager().await.unwrap(),
            ));
        }
    }
    let conn = conns[0].clone();
    let conns = Arc::new(conns);
    let pick = {
        let conns = conns.clone();
        let next = Arc::new(AtomicU64::new(0));
        move || conns[(next.fetch_add(1, Ordering::Relaxed) as usize) % conns.len()].clone()
    };
    // The store prefixes the run.
    let (guarded, replay) = store_ops(&store, "g").await;
    // About the size of idem's encoded records (53 bytes claimed, 131 done).
    let raw_value = vec![b'x'; 120];
    let mut setup = conn.clone();
    let _: () = redis::cmd("SET")
        .arg(format!("idem-bench-raw:{run}:replayed"))
        .arg(&raw_value)
        .query_async(&mut setup)
        .await
        .unwrap();
    let (c, run_id, value) = (pick.clone(), run.to_owned(), raw_value.clone());
    let raw_guarded = op(move |i| {
        let (mut c, key, value) = (c(), format!("idem-bench-raw:{run_id}:g{i}"), value.clone());
        async move {
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(600_000)
                .query_async(&mut c)
                .await
                .unwrap();
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("PX")
                .arg(600_000)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    });
    let (c, key) = (pick.clone(), format!("idem-bench-raw:{run}:replayed"));
    let raw_replay = op(move |_| {
        let (mut c, key) = (c(), key.clone());
        async move {
            let _: Vec<u8> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    });
    // The floor of a replay: the one command idem's replay is — a claim
    // that finds the key held and gets its value back — sent raw, with a
    // value of the claimed record's size.
    let (c, key, value) = (
        pick.clone(),
        format!("idem-bench-raw:{run}:replayed"),
        vec![b'x'; 53],
    );
    let raw_claim_read = op(move |_| {
        let (mut c, key, value) = (c(), key.clone(), value.clone());
        async move {
            let held: Option<Vec<u8>> = redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(600_000)
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(held.is_some());
        }
    });
    let pairs = vec![
        Pair {
            label: "claim+complete vs SET NX + SET",
            store: guarded,
            raw: raw_guarded,
        },
        Pair {
            label: "replay vs GET",
            store: replay.clone(),
            raw: raw_replay,
        },
        Pair {
            label: "replay vs SET NX GET",
            store: replay,
            raw: raw_claim_read,
        },
    ];
    (pairs, store)
}

async fn postgres_pairs(url: &str, run: &str) -> (Vec<Pair>, Arc<dyn Store>) {
    let table = "idem_bench";
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::open(&format!("{url}?table={table}&pool=32"))
            .await
            .unwrap(),
    );
    // The raw side: the same columns, plain statements, the same driver and pool settings.
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS idem_bench_raw (key TEXT COLLATE \"C\" PRIMARY KEY, version BIGINT NOT NULL, \
             fingerprint TEXT NOT NULL, state TEXT NOT NULL, lease_until_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, \
             status INTEGER, header_names TEXT[], header_values BYTEA[], body BYTEA); \
             CREATE INDEX IF NOT EXISTS idem_bench_raw_expires ON idem_bench_raw (expires_at_ms); \
             TRUNCATE idem_bench_raw; TRUNCATE idem_bench;",
        )
        .await
        .unwrap();
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.application_name("idem-bench-raw");
    let manager = deadpool_postgres::Manager::from_config(
        config,
        NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(32)
        .queue_mode(deadpool_postgres::QueueMode::Lifo)
        .build()
        .unwrap();
    const INSERT: &str = "INSERT INTO idem_bench_raw (key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body) VALUES ($1, 1, $2, $3, $4, $5, $6, $7, $8, $9)";
    const UPDATE: &str = "UPDATE idem_bench_raw SET version = version + 1, fingerprint = $2, state = $3, lease_until_ms = $4, expires_at_ms = $5, status = $6, header_names = $7, header_values = $8, body = $9 WHERE key = $1";
    const SELECT: &str = "SELECT version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body FROM idem_bench_raw WHERE key = $1";
    let (guarded, replay) = store_ops(&store, &format!("{run}:g")).await;
    let done = record(State::Done);
    let r = done.response.clone().unwrap();
    let names: Vec<String> = r.headers.iter().map(|(n, _)| n.clone()).collect();
    let values: Vec<Vec<u8>> = r.headers.iter().map(|(_, v)| v.clone()).collect();
    {
        let c = pool.get().await.unwrap();
        let st = c.prepare_cached(INSERT).await.unwrap();
        c.execute(
            &st,
            &[
                &"replayed",
                &done.fingerprint,
                &"done",
                &0i64,
                &i64::MAX,
                &200i32,
                &names,
                &values,
                &r.body,
            ],
        )
        .await
        .unwrap();
    }
    let (p, run_id) = (pool.clone(), run.to_owned());
    let (n2, v2, body) = (names.clone(), values.clone(), r.body.clone());
    let raw_guarded = op(move |i| {
        let (p, key, names, values, body) = (
            p.clone(),
            format!("{run_id}:g{i}"),
            n2.clone(),
            v2.clone(),
            body.clone(),
        );
        async move {
            let c = p.get().await.unwrap();
            let (ins, upd) = (
                c.prepare_cached(INSERT).await.unwrap(),
                c.prepare_cached(UPDATE).await.unwrap(),
            );
            let none: (
                Option<i32>,
                Option<Vec<String>>,
                Option<Vec<Vec<u8>>>,
                Option<Vec<u8>>,
            ) = (None, None, None, None);
            c.execute(
                &ins,
                &[
                    &key,
                    &"sha256:0123456789abcdef",
                    &"processing",
                    &(NOW as i64),
                    &(NOW as i64 + 600_000),
                    &none.0,
                    &none.1,
                    &none.2,
                    &none.3,
                ],
            )
            .await
            .unwrap();
            c.execute(
                &upd,
                &[
                    &key,
                    &"sha256:0123456789abcdef",
                    &"done",
                    &0i64,
                    &(NOW as i64 + 600_000),
                    &200i32,
                    &names,
                    &values,
                    &body,
                ],
            )
            .await
            .unwrap();
        }
    });
    let p = pool.clone();
    let raw_replay = op(move |_| {
        let p = p.clone();
        async move {
            let c = p.get().await.unwrap();
            let st = c.prepare_cached(SELECT).await.unwrap();
            assert_eq!(c.query(&st, &[&"replayed"]).await.unwrap().len(), 1);
        }
    });
    let pairs = vec![
        Pair {
            label: "claim+complete vs INSERT + UPDATE",
            store: guarded,
            raw: raw_guarded,
        },
        Pair {
            label: "replay vs SELECT",
            store: replay,
            raw: raw_replay,
        },
    ];
    (pairs, store)
}

/// `IDEM_BENCH_ROWS=TEXT` runs only the table rows whose label contains TEXT.
fn row_selected(label: &str) -> bool {
    std::env::var("IDEM_BENCH_ROWS").map_or(true, |only| label.contains(&only))
}

fn guard_ops(store: Arc<dyn Store>, run: &str) -> (Op, Op) {
    let guard = Guard::builder(store).build().unwrap();
    let respond = || async {
        Ok::<_, std::convert::Infallible>(Response {
            status: 200,
            headers: vec![],
            body: b"paid".to_vec(),
        })
    };
    let (g, run_id) = (guard.clone(), run.to_owned());
    let executed = op(move |i| {
        let (g, key) = (g.clone(), format!("{run_id}:run{i}"));
        async move {
            assert!(matches!(
                g.run(&key, "fp", |_| respond()).await.unwrap(),
                idem::Outcome::Executed(_)
            ));
        }
    });
    let (g, key) = (guard, format!("{run}:run-replayed"));
    let replayed = op(move |_| {
        let (g, key) = (g.clone(), key.clone());
        async move {
            let outcome = g.run(&key, "fp", |_| respond()).await.unwrap();
            assert!(matches!(
                outcome,
                idem::Outcome::Executed(_) | idem::Outcome::Replayed(_)
            ));
        }
    });
    (executed, replayed)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let secs = Duration::from_secs_f64(support::secs(3.0));
    let run = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    // Store, operation, callers: idem's figures and raw's.
    let mut table: Vec<(String, &str, usize, Figures, Figures)> = Vec::new();
    // Store, operation, callers: the figures through the component.
    let mut guard_rows: Vec<(String, &str, usize, Figures)> = Vec::new();
    for (store_name, name, options) in [
        ("redis", "REDIS", ""),
        ("valkey", "VALKEY", ""),
        ("valkey cas=script", "VALKEY", "&cas=script"),
        ("redis-cluster", "REDIS_CLUSTER", ""),
        ("redis-cluster wait=1", "REDIS_CLUSTER", "&wait=1"),
        ("postgres", "POSTGRES", ""),
    ] {
        let Some(url) = url(name) else {
            eprintln!(
                "{store_name}: skipped, IDEM_BENCH_{name}_URL (or IDEM_TEST_{name}_URL) is not set"
            );
            continue;
        };
        if std::env::var("IDEM_BENCH_STORES").is_ok_and(|only| !store_name.contains(&only)) {
            continue;
        }
        let store_name = store_name.to_owned();
        let (pairs, store) = rt.block_on(async {
            if name == "POSTGRES" {
                postgres_pairs(&url, &run).await
            } else {
                redis_pairs(&url, options, &run).await
            }
        });
        let mut group = criterion.benchmark_group(&store_name);
        for pair in &pairs {
            for (side, f) in [("idem", &pair.store), ("raw", &pair.raw)] {
                group.bench_function(format!("{} [{side}]", pair.label), |b| {
                    b.to_async(&rt).iter(|| f(fresh()));
                });
            }
        }
        group.finish();
        for pair in pairs.iter().filter(|p| row_selected(p.label)) {
            for callers in [1, 32] {
                let works = [&pair.store, &pair.raw];
                let figures = rt.block_on(measure(callers, secs, TURNS, &works));
                let (label, name) = (pair.label, store_name.clone());
                table.push((name, label, callers, figures[0], figures[1]));
            }
        }
        let (executed, replayed) = guard_ops(store, &run);
        for (label, f) in [
            ("Guard::run executed", &executed),
            ("Guard::run replayed", &replayed),
        ] {
            if !row_selected(label) {
                continue;
            }
            for callers in [1, 32] {
                let figures = rt.block_on(measure(callers, secs, 1, &[f]));
                guard_rows.push((store_name.clone(), label, callers, figures[0]));
            }
        }
        // A cluster's keys are left to expire (10 minutes): one `UNLINK`
        // cannot span its slots.
        if name == "REDIS" || name == "VALKEY" {
            rt.block_on(support::unlink_matching(
                &url,
                &format!("idem-bench*:{run}:*"),
            ));
        }
    }
    println!(
        "\n| store | operation | callers | idem ops/s | raw ops/s | idem/raw | idem p50 µs | raw p50 µs | idem p99 µs | raw p99 µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (store, label, callers, i, r) in &table {
        println!(
            "| {store} | {label} | {callers} | {:.0} | {:.0} | {:.0}% | {} | {} | {} | {} |",
            i.ops_per_s,
            r.ops_per_s,
            100.0 * i.ops_per_s / r.ops_per_s,
            i.p50.as_micros(),
            r.p50.as_micros(),
            i.p99.as_micros(),
            r.p99.as_micros()
        );
    }
    println!("\n| store | through the component | callers | ops/s | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for (store, label, callers, f) in &guard_rows {
        println!(
            "| {store} | {label} | {callers} | {:.0} | {} | {} |",
            f.ops_per_s,
            f.p50.as_micros(),
            f.p99.as_micros()
        );
    }
    criterion.final_summary();
}
