//! The real `idem serve` stays up whatever its store does, black box over
//! HTTP with `idem ledger` behind it: started while Redis or PostgreSQL is
//! unreachable it answers 503 with `Retry-After`, says so in `/v1/stats` and
//! `/metrics`, and answers 201 once the store is back, without a restart;
//! while the store refuses writes (another process holding SQLite's write
//! lock, a read-only PostgreSQL session, Redis demoted to a replica) keys
//! that are done still replay, and a new key fails closed, never forwarded.
//! And the memory store on an address others reach is warned about.

use crate::cluster::redis_cli;
use crate::hostile::Stack;
use crate::netstores::postgres::{self, drop_table, raw, table, with};
use crate::netstores::{closed_port, host_port, via};
use crate::proxy::Proxy;
use crate::support::{IDEM, Proc, assert_answer, assert_replay, http};
use idem_harness::{server_url, unique};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a store that is back may take to be used: a few backoff steps
/// (at most 5 s each) on a loaded machine.
const RECOVERY: Duration = Duration::from_secs(90);

/// A replay's bound while the store refuses writes: far below the 20 s a
/// write waits for SQLite's lock in these tests, far above a replay's
/// milliseconds even on a loaded machine.
const REPLAY: Duration = Duration::from_secs(10);

async fn stats(stack: &Stack) -> Value {
    stack.admin("GET", "/v1/stats", "").await.json()
}

async fn metrics(stack: &Stack) -> String {
    String::from_utf8(stack.admin("GET", "/metrics", "").await.body).unwrap()
}

/// A gateway started on the server `var` names (`default_port` when its URL
/// names none), through a proxy that is cut, `params` added to its URL:
/// 503 with `Retry-After` and nothing forwarded while the store is
/// unreachable, the state in `/v1/stats` and `/metrics`, unguarded requests
/// still forwarded; once the proxy is restored, 201 for the same key without
/// a restart, and a replay after it. The server's URL; `None` when `var` is
/// not set.
async fn started_down_then_up(var: &str, default_port: u16, params: &str) -> Option<String> {
    let url = server_url(var)?;
    let proxy = Proxy::start(&host_port(&url, default_port)).await;
    proxy.cut();
    let store_url = with(&via(&url, proxy.addr), params);
    let stack = Stack::start("0ms", &["--store", &store_url]).await;
    let down = stack.order("down-1", "o-down").await;
    assert_answer(&down, 503, "store not connected yet");
    assert_eq!(down.header("retry-after"), Some("1"), "{down:?}");
    let link = &stats(&stack).await["store_connection"];
    assert_eq!(link["state"], "connecting", "{link}");
    assert!(link["attempts"].as_u64().unwrap() >= 1, "{link}");
    assert!(
        link["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("could not be opened")),
        "{link}"
    );
    assert!(
        metrics(&stack).await.contains("\nidem_store_connected 0\n"),
        "the gauge says the store is not there"
    );
    // Up for everything that does not need the store: unguarded requests.
    let books = http(stack.proxy, "GET", "/ledger", &[], "").await;
    assert_eq!(books.status, 200, "{books:?}");
    assert_eq!(stack.ledger().await["executions"], serde_json::json!({}));

    proxy.restore().await;
    let deadline = Instant::now() + RECOVERY;
    let first = loop {
        let reply = stack.order("down-1", "o-down").await;
        if reply.status == 201 {
            break reply;
        }
        assert_eq!(reply.status, 503, "{reply:?}");
        assert!(
            Instant::now() < deadline,
            "still {reply:?} {RECOVERY:?} after the store came back: {}",
            stats(&stack).await["store_connection"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stack.ledger().await["executions"]["o-down"], 1);
    let link = &stats(&stack).await["store_connection"];
    assert_eq!(link["state"], "connected", "{link}");
    assert!(link["attempts"].as_u64().unwrap() >= 2, "{link}");
    let metrics = metrics(&stack).await;
    assert!(metrics.contains("\nidem_store_connected 1\n"), "{metrics}");
    let replay = stack.order("down-1", "o-down").await;
    assert_replay(&replay, &first);
    Some(url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_redis_is_down_serves_once_it_is_up() {
    let prefix = unique("down");
    started_down_then_up("IDEM_TEST_REDIS_URL", 6379, &format!("prefix={prefix}:")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_postgres_is_down_serves_once_it_is_up() {
    let t = table();
    let params = format!("table={t}&pool=2");
    if let Some(url) = started_down_then_up("IDEM_TEST_POSTGRES_URL", 5432, &params).await {
        drop_table(&raw(&url).await, &t).await;
    }
}

/// Replays of a key that is done, asked while the store refuses writes:
/// `refuse` makes it refuse them (and says how to read the refusal), and
/// `allow` lets it write again. The key done before replays byte for byte;
/// a new key fails closed (503, never forwarded); once writes are allowed
/// again, new keys run.
async fn replays_while_writes_are_refused(
    stack: &Stack,
    refuse: impl AsyncFnOnce(),
    allow: impl AsyncFnOnce(),
) {
    let first = stack.order("done-1", "o-done").await;
    assert_eq!(first.status, 201, "{first:?}");
    refuse().await;
    for _ in 0..3 {
        let replay = tokio::time::timeout(REPLAY, stack.order("done-1", "o-done"))
            .await
            .expect("a replay does not wait for the store to take writes");
        assert_replay(&replay, &first);
    }
    let new = stack.order("new-1", "o-new").await;
    assert_eq!(new.status, 503, "a new key needs a write: {new:?}");
    let books = stack.ledger().await;
    assert_eq!(books["executions"]["o-done"], 1, "{books}");
    assert!(books["executions"]["o-new"].is_null(), "{books}");
    allow().await;
    // Another new key: the refused claim of `new-1` may have been written
    // once the store let it (a store call that timed out MAY have been
    // applied), and then holds that key until its lease runs out.
    let deadline = Instant::now() + RECOVERY;
    loop {
        let new = stack.order("new-2", "o-new-2").await;
        if new.status == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "writes allowed, still {new:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(stack.ledger().await["executions"]["o-new-2"], 1);
}

/// Another process (this test, beside the gateway's) holds SQLite's write
/// lock with `BEGIN IMMEDIATE`: every write waits out the busy timeout (20 s
/// here), yet replays are read without the lock, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_go_on_while_another_process_holds_the_sqlite_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let store = format!("sqlite:{}?busy_timeout_ms=20000", db.display());
    let stack = Stack::start("0ms", &["--store", &store, "--store-timeout", "1s"]).await;
    let holder = std::sync::Mutex::new(None);
    replays_while_writes_are_refused(
        &stack,
        async || {
            let locker = rusqlite::Connection::open(&db).unwrap();
            locker.execute_batch("BEGIN IMMEDIATE").unwrap();
            *holder.lock().unwrap() = Some(locker);
        },
        async || {
            let locker = holder.lock().unwrap().take().unwrap();
            locker.execute_batch("ROLLBACK").unwrap();
        },
    )
    .await;
}

/// A second gateway on the same table whose sessions are read only
/// (`default_transaction_read_only`, as on a hot standby) opens the table
/// another wrote, replays its done keys and refuses new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_go_on_from_a_read_only_postgres_session() {
    let Some(url) = postgres::url() else { return };
    let t = table();
    let writer = Stack::start(
        "0ms",
        &["--store", &with(&url, &format!("table={t}&pool=2"))],
    )
    .await;
    let first = writer.order("done-1", "o-done").await;
    assert_eq!(first.status, 201, "{first:?}");

    let read_only = with(
        &url,
        &format!("table={t}&pool=2&options=-c%20default_transaction_read_only%3Don"),
    );
    let reader = Stack::start("0ms", &["--store", &read_only]).await;
    let replay = reader.order("done-1", "o-done").await;
    assert_replay(&replay, &first);
    let new = reader.order("new-1", "o-new").await;
    assert_answer(&new, 503, "read-only transaction");
    assert_eq!(reader.ledger().await["executions"], serde_json::json!({}));
    drop_table(&raw(&url).await, &t).await;
}

/// A Redis server of the test's own, on a port below Linux's ephemeral
/// range that nothing listens on; killed on drop.
struct OwnRedis {
    port: u16,
    _server: Proc,
}

impl OwnRedis {
    /// Started with the `redis-server` of `IDEM_TEST_REDIS_SERVER`, tried
    /// again on another port (3 times at most) if it could not bind.
    fn start() -> Option<OwnRedis> {
        let server = server_url("IDEM_TEST_REDIS_SERVER")?;
        for _ in 0..3 {
            let port = 10_000 + fastrand::u16(..20_000);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            let child = Command::new(&server)
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            let mut proc = Proc(child);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && proc.0.try_wait().unwrap().is_none() {
                if redis_cli(port, &["ping"]).trim() == "PONG" {
                    return Some(OwnRedis {
                        port,
                        _server: proc,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = proc.0.kill();
        }
        panic!("no redis-server of the test's own started");
    }
}

/// Redis demoted to a replica under a running gateway (`REPLICAOF`, as in
/// a failover; its primary out of reach, so it serves what it holds):
/// writes are refused with `READONLY`, done keys still replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_go_on_when_redis_is_demoted_to_a_replica() {
    let Some(redis) = OwnRedis::start() else {
        return;
    };
    let store = format!("redis://127.0.0.1:{}?prefix=demoted:", redis.port);
    let stack = Stack::start("0ms", &["--store", &store]).await;
    let nowhere = closed_port().await;
    replays_while_writes_are_refused(
        &stack,
        async || {
            let port = nowhere.port().to_string();
            let said = redis_cli(redis.port, &["replicaof", "127.0.0.1", &port]);
            assert_eq!(said.trim(), "OK");
            let role = redis_cli(redis.port, &["role"]);
            assert!(role.starts_with("slave"), "{role}");
            let refused = redis_cli(redis.port, &["set", "probe", "1"]);
            assert!(refused.contains("READONLY"), "{refused}");
        },
        async || {
            let said = redis_cli(redis.port, &["replicaof", "no", "one"]);
            assert_eq!(said.trim(), "OK");
        },
    )
    .await;
}

/// Everything `idem serve ARGS` prints on stderr up to and including its
/// bound line; then it is killed.
fn start_up_lines(args: &[&str]) -> Vec<String> {
    let mut child = Command::new(IDEM)
        .args([
            "serve",
            "--admin-listen",
            "off",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let bound = line.starts_with("idem serve: http://");
        seen.push(line);
        if bound {
            break;
        }
    }
    // What it printed before serving (eprintln is unbuffered) is all there.
    child.kill().unwrap();
    seen.extend(lines.map_while(Result::ok));
    let _ = child.wait();
    seen
}

#[test]
fn the_memory_store_on_an_address_others_reach_warns_that_a_restart_forgets_every_key() {
    let exposed = start_up_lines(&["--store", "memory:", "--listen", "0.0.0.0:0"]);
    assert!(
        exposed
            .iter()
            .any(|l| l.contains("warning: the memory store")
                && l.contains("a restart forgets every key")),
        "{exposed:#?}"
    );
    let private = start_up_lines(&["--store", "memory:", "--listen", "127.0.0.1:0"]);
    assert!(
        private
            .iter()
            .any(|l| l.starts_with("idem serve: http://127.0.0.1:")),
        "{private:#?}"
    );
    assert!(
        !private.iter().any(|l| l.contains("warning")),
        "loopback is this machine's own: {private:#?}"
    );
}
