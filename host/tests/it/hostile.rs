//! The real `idem serve` binary, black box over HTTP, where it used to break:
//! a claim slower than its lease allows, a store that hangs, expired keys
//! that were never freed, and slow clients holding every slot. Each test is
//! a reproduction an operator ran (`idem ledger` as the upstream).

use crate::support::{
    Proc, Reply, assert_answer, assert_replay, http, post_order, read_reply, spawn_ledger,
    spawn_serve,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// `idem ledger` and `idem serve` in front of it, on fresh ports.
pub(crate) struct Stack {
    pub(crate) proxy: u16,
    pub(crate) admin: u16,
    pub(crate) ledger: u16,
    _procs: [Proc; 2],
}

impl Stack {
    /// `serve_args` are added to `idem serve`'s listeners, upstream and admin.
    pub(crate) async fn start(ledger_latency: &str, serve_args: &[&str]) -> Stack {
        let (ledger_proc, ledger) = spawn_ledger(&["--latency", ledger_latency]);
        let upstream = format!("http://127.0.0.1:{ledger}");
        let (serve_proc, proxy, admin) =
            spawn_serve(&[&["--upstream", &upstream], serve_args].concat());
        Stack {
            proxy,
            admin,
            ledger,
            _procs: [ledger_proc, serve_proc],
        }
    }

    pub(crate) async fn order(&self, key: &str, order: &str) -> Reply {
        post_order(self.proxy, key, &order_body(order)).await
    }

    pub(crate) async fn ledger(&self) -> Value {
        http(self.ledger, "GET", "/ledger", &[], "").await.json()
    }

    /// How many distinct orders the ledger ran.
    async fn orders_run(&self) -> usize {
        self.ledger().await["executions"].as_object().unwrap().len()
    }

    pub(crate) async fn admin(&self, method: &str, path: &str, body: &str) -> Reply {
        http(self.admin, method, path, &[], body).await
    }

    async fn fault(&self, faults: Value) {
        let reply = self
            .admin(
                "PUT",
                "/v1/faults",
                &json!({ "faults": faults }).to_string(),
            )
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
}

/// The ledger's body for one unit of `order` at 10.00.
fn order_body(order: &str) -> String {
    json!({"order": order, "sku": "A", "qty": 1, "cents": 1000}).to_string()
}

/// The reproduction: a claim whose store round trip takes 40 % of a 2 s
/// lease, then an upstream taking 1.4 s of its 1.5 s timeout. A repeat 2.05 s
/// after the first used to find the lease run out, take the key over and run
/// the order a second time, and the two clients got different 2xx bodies.
/// Now the holder renews its lease before forwarding (and while it waits),
/// so the repeat is told the key is in flight, or replays the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_claim_never_runs_a_key_twice() {
    let stack = Stack::start(
        "1400ms",
        &[
            "--store",
            "memory:",
            "--lease",
            "2s",
            "--store-timeout",
            "1s",
            "--upstream-timeout",
            "1500ms",
        ],
    )
    .await;
    stack
        .fault(json!({"insert": {"kind": "delay", "latency_ms": 800, "count": 1}}))
        .await;
    let first = {
        let proxy = stack.proxy;
        tokio::spawn(async move { post_order(proxy, "K", &order_body("o-1")).await })
    };
    tokio::time::sleep(Duration::from_millis(2050)).await;
    let second = stack.order("K", "o-1").await;
    let first = first.await.unwrap();

    let books = stack.ledger().await;
    assert_eq!(books["executions"]["o-1"], 1, "the order ran once: {books}");
    assert_eq!(first.status, 201, "{first:?}");
    match second.status {
        409 => assert!(second.header("retry-after").is_some(), "{second:?}"),
        201 => assert_eq!(second.body, first.body, "a repeat replays the first body"),
        _ => panic!("the repeat got {second:?}"),
    }
    // And afterwards every repeat replays the one response.
    let again = stack.order("K", "o-1").await;
    assert_replay(&again, &first);
}

/// A store that hangs (a 30 s delay on every claim) is answered 503 within
/// the store timeout, not after the 30 s, and the order is never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_store_is_answered_503_within_the_store_timeout() {
    let stack = Stack::start("0ms", &["--store", "memory:", "--store-timeout", "1s"]).await;
    stack
        .fault(json!({"insert": {"kind": "delay", "latency_ms": 30000}}))
        .await;
    let asked = Instant::now();
    let reply = stack.order("hung-1", "o-hung").await;
    let took = asked.elapsed();
    assert_answer(&reply, 503, "store timeout of 1000 ms");
    assert!(
        took < Duration::from_secs(20),
        "answered after {took:?}, as if the store's 30 s delay held the request"
    );
    assert_eq!(stack.ledger().await["executions"], json!({}));
}

/// Expired records are purged on SQLite: 300 keys with a 3 s retention are
/// all gone from the file two purge periods (1 s) after they expired, and
/// `/v1/stats` and `/metrics` count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_rows_are_purged_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let store = format!("sqlite:{}", db.display());
    let stack = Stack::start(
        "0ms",
        &[
            "--store",
            &store,
            "--retention",
            "3s",
            "--lease",
            "2s",
            "--store-timeout",
            "1s",
            "--upstream-timeout",
            "500ms",
            "--purge-interval",
            "1s",
        ],
    )
    .await;
    for i in 0..300 {
        let reply = stack.order(&format!("p-{i}"), &format!("o-{i}")).await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    let rows = || -> i64 {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT count(*) FROM records", [], |r| r.get(0))
            .unwrap()
    };
    // On a loaded machine the first rows may expire, and be purged, before
    // the last is written: every row is either still there or counted purged.
    let purged = || async {
        stack.admin("GET", "/v1/stats", "").await.json()["purge"]["purged"]
            .as_i64()
            .unwrap()
    };
    let (left, gone) = (rows(), purged().await);
    assert!(
        left + gone >= 300,
        "{left} rows left and {gone} purged: rows were lost"
    );
    let last_written = Instant::now();
    // Loaded machines run late: a generous bound, and the time it took printed.
    let deadline = last_written + Duration::from_secs(60);
    while rows() > 0 {
        assert!(Instant::now() < deadline, "{} rows left after 60 s", rows());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "all 300 rows purged {:?} after the last write (retention 3 s, purge every 1 s)",
        last_written.elapsed()
    );
    let stats = stack.admin("GET", "/v1/stats", "").await.json();
    assert_eq!(stats["purge"]["purged"], 300, "{stats}");
    let metrics = String::from_utf8(stack.admin("GET", "/metrics", "").await.body).unwrap();
    assert!(
        metrics.contains("idem_purged_records_total 300"),
        "{metrics}"
    );
}

/// 1,100 connections send a keyed POST head with `Content-Length: 100000`
/// and then a byte now and then: more than the 1,024 handling slots. A
/// normal keyed request still gets its answer, and the slow bodies are
/// cut with 408 once they fall under the minimum rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_take_the_gateway_down() {
    const SLOW: usize = 1_100;
    // This process holds both ends' sockets: 1,100 client connections here.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let stack = Stack::start(
        "0ms",
        &[
            "--store",
            "memory:",
            "--body-read-timeout",
            "60s",
            "--min-body-rate",
            "100",
        ],
    )
    .await;
    let mut slow = Vec::with_capacity(SLOW);
    for i in 0..SLOW {
        let mut stream = TcpStream::connect(("127.0.0.1", stack.proxy))
            .await
            .unwrap();
        let head = format!(
            "POST /orders HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: slow-{i}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        slow.push(stream);
    }
    let asked = Instant::now();
    let normal = stack.order("normal-1", "o-normal").await;
    let took = asked.elapsed();
    println!(
        "a normal request beside {SLOW} slow bodies: {} in {took:?}",
        normal.status
    );
    assert_eq!(normal.status, 201, "{normal:?}");
    assert_eq!(stack.ledger().await["executions"]["o-normal"], 1);

    // The slow bodies fell under 100 bytes/s after the 2 s grace: each is
    // answered 408, and none reached the upstream.
    let mut first = slow.swap_remove(0);
    let cut = tokio::time::timeout(Duration::from_secs(60), read_reply(&mut first))
        .await
        .expect("a slow body is cut within the body timeout");
    assert_answer(&cut, 408, "100 bytes/s");
    assert_eq!(stack.orders_run().await, 1, "no slow order was forwarded");
}

/// A client that shuts down its sending side once its request is out
/// (`shutdown(SHUT_WR)`) still reads its answer, and the order ran once;
/// the gateway used to drop such a connection unanswered although the
/// request ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_client_reads_its_answer() {
    let stack = Stack::start("0ms", &["--store", "memory:"]).await;
    let body = json!({"order": "o-half", "sku": "A", "qty": 1, "cents": 1000}).to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", stack.proxy))
        .await
        .unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: half-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(60), read_reply(&mut stream))
        .await
        .expect("an answer, not a connection left open");
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(stack.ledger().await["executions"]["o-half"], 1);
    // A retry replays what the half-closed client was given.
    let again = stack.order("half-1", "o-half").await;
    assert_replay(&again, &reply);
}

/// A head with `Content-Length: 100000` and the first `sent` bytes of the
/// body, on a connection of its own, left open; `headers` end with `\r\n`.
async fn slow_body(proxy: u16, method: &str, headers: &str, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", proxy)).await.unwrap();
    let head = format!(
        "{method} /orders HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    let body = format!("{{\"order\":\"slow\",\"pad\":\"{}", "x".repeat(sent));
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body.as_bytes()[..sent]).await.unwrap();
    stream
}

/// 1,100 connections send a POST without `Idempotency-Key` — forwarded
/// unguarded, as `--require-key false` (the default) says — with
/// `Content-Length: 100000` and then 100 bytes: more than the 1,024 slots.
/// They used to take every slot until the upstream timeout, and keyed
/// requests got 503 meanwhile. Now unguarded requests have slots of their
/// own (`--max-concurrent-unguarded`, 1,024), so while all of those are
/// held keyed orders still get 201; the slow bodies are cut with 408 at the
/// body deadline, as guarded ones are, and the 76 past the limit get 503
/// at once. None of them runs an order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_slow_bodies_cannot_shut_out_keyed_requests() {
    const SLOW: usize = 1_100;
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    // At 1 byte/s after the grace, 100 bytes hold a slot past the 30 s
    // body deadline: the slots stay taken while the probes run.
    let stack = Stack::start("0ms", &["--store", "memory:", "--min-body-rate", "1"]).await;
    let mut slow = Vec::with_capacity(SLOW);
    for _ in 0..SLOW {
        slow.push(slow_body(stack.proxy, "POST", "", 100).await);
    }
    let slots = || async { stack.admin("GET", "/v1/stats", "").await.json()["slots"].clone() };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = slots().await;
        let unguarded = &now["unguarded"];
        if unguarded["in_use"] == 1024 && unguarded["refused"] == SLOW as u64 - 1024 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow bodies never held every unguarded slot: {now}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..5 {
        let order = format!("o-keyed-{i}");
        let probe = stack.order(&format!("keyed-{i}"), &order).await;
        assert_eq!(
            probe.status, 201,
            "a keyed order beside {SLOW} slow bodies: {probe:?}"
        );
        assert_eq!(stack.ledger().await["executions"][&order], 1);
    }
    let after = slots().await;
    assert_eq!(
        after["unguarded"]["in_use"], 1024,
        "the probes ran while every unguarded slot was held: {after}"
    );
    assert_eq!(after["guarded"]["refused"], 0, "{after}");

    let replies = futures::future::join_all(slow.iter_mut().map(|stream| async move {
        tokio::time::timeout(Duration::from_secs(120), read_reply(stream))
            .await
            .expect("every slow body is answered")
    }))
    .await;
    let count = |status: u16| replies.iter().filter(|r| r.status == status).count();
    assert_eq!(
        (count(408), count(503)),
        (1024, SLOW - 1024),
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    let cut = replies.iter().find(|r| r.status == 408).unwrap();
    assert_answer(cut, 408, "within 30000 ms");
    let shed = replies.iter().find(|r| r.status == 503).unwrap();
    assert_answer(shed, 503, "max-concurrent-unguarded");
    assert_eq!(stack.orders_run().await, 5, "only the keyed orders ran");
}

/// A request of a method the gateway does not guard (`--methods PATCH`
/// leaves POST unguarded, key or not) streams its body to the upstream
/// under the same minimum rate as a guarded body: one byte and then
/// nothing is cut with 408 once the 2 s grace is over, and frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unguarded_method_s_slow_body_is_cut_at_the_minimum_rate() {
    let stack = Stack::start(
        "0ms",
        &[
            "--store",
            "memory:",
            "--methods",
            "PATCH",
            "--min-body-rate",
            "100",
        ],
    )
    .await;
    let mut stream = slow_body(stack.proxy, "POST", "Idempotency-Key: k-1\r\n", 1).await;
    let cut = tokio::time::timeout(Duration::from_secs(60), read_reply(&mut stream))
        .await
        .expect("cut within the body deadline, not left to the upstream timeout");
    assert_answer(&cut, 408, "100 bytes/s");
    let stats = stack.admin("GET", "/v1/stats", "").await.json();
    assert_eq!(stats["slots"]["unguarded"]["in_use"], 0, "{stats}");
    assert_eq!(stack.ledger().await["executions"], json!({}));
}
