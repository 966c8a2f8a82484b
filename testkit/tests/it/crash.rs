//! Crash recovery: a real `idem` process (`idem-testkit crash`) is `kill -9`ed
//! in the handler, inside `complete` before and after the store write, and
//! in the middle of store writes — on SQLite and on PostgreSQL. A guard
//! opened afresh on the same store must then replay every acknowledged
//! response byte for byte, answer in flight for every stuck claim until its
//! lease runs out, then let exactly one retry take it over; and no key ever
//! holds two different responses.
//!
//! The restarted guard runs on a manual clock that starts at the store's
//! time (its time authority, which the crashed process used too), so a
//! lease "runs out" by moving the clock, not by sleeping.

use crate::support::{TESTKIT, server_url, unique};
use idem::store::{ListQuery, Store};
use idem::{Clock, Decision, Guard, ManualClock, Outcome, Response};
use idem_harness::{Proc, spawn_bound};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

const FP: &str = "fp-crash";
/// Long enough that the restart surely happens within it on a loaded
/// machine; the manual clock makes its length cost nothing.
const LEASE: Duration = Duration::from_secs(5);
/// How long the test waits for one line from the child.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `idem-testkit crash`, its stdout read line by line on a thread.
struct Crashing {
    process: Proc,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Crashing {
    fn spawn(
        store_url: &str,
        crash_at: &str,
        keys: usize,
        body_file: &Path,
        extra: &[&str],
    ) -> Self {
        let prefix = format!("{}/", unique("crash"));
        let mut child = Command::new(TESTKIT)
            .args(["crash", "--store", store_url, "--crash-at", crash_at])
            .args(["--keys", &keys.to_string(), "--prefix", &prefix])
            .args(["--lease-ms", &LEASE.as_millis().to_string()])
            .arg("--body-file")
            .arg(body_file)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start idem-testkit crash");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Crashing {
            stdin: child.stdin.take(),
            process: Proc(child),
            lines,
        }
    }

    /// The next line, split into words; fails on a line that reports
    /// something unexpected, on the end of output and on a timeout.
    fn next(&self) -> Vec<String> {
        let line = self
            .lines
            .recv_timeout(LINE_TIMEOUT)
            .expect("idem-testkit crash said nothing more");
        assert!(
            !line.starts_with("unexpected") && !line.starts_with("not-written"),
            "idem-testkit crash: {line}"
        );
        line.split(' ').map(str::to_owned).collect()
    }

    /// Every line printed before the kill, once the pipe is closed.
    fn rest(&self) -> Vec<Vec<String>> {
        self.lines
            .iter()
            .map(|l| l.split(' ').map(str::to_owned).collect())
            .collect()
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
}

/// The response `crash` stores for `key`: the key, a newline, the body file.
fn first_response(key: &str, body: &[u8]) -> Response {
    Response {
        status: 201,
        headers: vec![("x-idem-key".into(), key.as_bytes().to_vec())],
        body: [key.as_bytes(), b"\n", body].concat(),
    }
}

/// What a retry after the takeover stores: different from the first.
fn retry_response(key: &str) -> Response {
    Response {
        status: 200,
        headers: vec![],
        body: format!("retried {key}").into_bytes(),
    }
}

/// A body of `n` bytes that compresses badly, written to `dir/body.bin`.
fn body_file(dir: &Path, n: usize) -> (std::path::PathBuf, Vec<u8>) {
    let body: Vec<u8> = (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = dir.join("body.bin");
    std::fs::write(&path, &body).unwrap();
    (path, body)
}

/// What the restarted guard found.
#[derive(Debug, Default)]
struct Recovery {
    /// Keys whose first response was stored: replayed byte for byte.
    replayed: Vec<String>,
    /// Keys left claimed: taken over after their lease, with the retry's fence.
    taken_over: BTreeMap<String, u64>,
}

/// Opens a guard on `store` as a restarted process would and checks every
/// key in `keys`: each either replays its first response byte for byte or is
/// in flight; every key in `acknowledged` replays. Then, past the lease,
/// four concurrent retries per stuck key: exactly one runs its handler, and
/// from then on every key replays one response — its first, or the retry's.
async fn recover(
    store: Arc<dyn Store>,
    keys: &[String],
    acknowledged: &HashSet<String>,
    body: &[u8],
) -> Recovery {
    let clock = ManualClock::new(store.clock().now_ms());
    let guard = Guard::builder(store)
        .clock(clock.clone())
        .lease(LEASE)
        .build()
        .unwrap();
    let mut recovery = Recovery::default();
    let mut stuck = Vec::new();
    for key in keys {
        match guard.begin(key, FP).await.unwrap() {
            Decision::Replay(response) => {
                assert!(
                    response == first_response(key, body),
                    "{key}: the replay is not the stored response, byte for byte"
                );
                recovery.replayed.push(key.clone());
            }
            Decision::InFlight { retry_after_ms } => {
                assert!(
                    !acknowledged.contains(key),
                    "{key}: its completion was acknowledged, yet the response is gone"
                );
                assert!(
                    retry_after_ms > 0 && retry_after_ms <= LEASE.as_millis() as u64,
                    "{key}: retry after {retry_after_ms} ms, beyond the lease"
                );
                stuck.push(key.clone());
            }
            other => panic!("{key}: after the crash, within the lease: {other:?}"),
        }
    }

    // Every claim was made before the restart: one lease later all have run out.
    clock.advance(LEASE + Duration::from_millis(1));
    for key in &stuck {
        let runs = AtomicUsize::new(0);
        let fence = Mutex::new(None);
        let retry = || async {
            let (runs, fence) = (&runs, &fence);
            guard
                .run(key, FP, |f| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    *fence.lock().unwrap() = Some(f.0);
                    Ok::<_, std::convert::Infallible>(retry_response(key))
                })
                .await
                .unwrap()
        };
        let outcomes = futures::future::join_all((0..4).map(|_| retry())).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{key}: four retries after the lease, the handler must run once: {outcomes:?}"
        );
        for outcome in &outcomes {
            assert!(
                matches!(outcome, Outcome::Executed(r) | Outcome::Replayed(r) if *r == retry_response(key))
                    || matches!(outcome, Outcome::InFlight { .. }),
                "{key}: {outcome:?}"
            );
        }
        let fence = fence.lock().unwrap().unwrap();
        recovery.taken_over.insert(key.clone(), fence);
    }

    // One response per key from now on.
    for key in keys {
        let expected = if recovery.taken_over.contains_key(key) {
            retry_response(key)
        } else {
            first_response(key, body)
        };
        assert!(
            guard.begin(key, FP).await.unwrap() == Decision::Replay(expected),
            "{key}: does not replay the one response it was given"
        );
    }
    recovery
}

/// Every live record in the store decodes.
async fn all_rows_decode(store: &Arc<dyn Store>) -> usize {
    let query = ListQuery {
        limit: 1_000_000,
        ..ListQuery::default()
    };
    store
        .list(&query, store.clock().now_ms())
        .await
        .expect("every record decodes")
        .len()
}

/// The lines of `crash_at` for `keys` keys, as (key, number) pairs.
fn halted(child: &Crashing, word: &str, keys: usize) -> BTreeMap<String, u64> {
    (0..keys)
        .map(|_| {
            let line = child.next();
            assert_eq!(line[0], word, "{line:?}");
            let n = line.get(2).map_or(0, |n| n.parse().unwrap());
            (line[1].clone(), n)
        })
        .collect()
}

const KEYS: usize = 4;

/// What a `store-write` child reported before it died.
#[derive(Default)]
struct Writes {
    claimed: Vec<String>,
    acknowledged: HashSet<String>,
}

impl Writes {
    fn record(&mut self, line: &[String]) {
        match line[0].as_str() {
            "claimed" => self.claimed.push(line[1].clone()),
            "acknowledged" => {
                self.acknowledged.insert(line[1].clone());
            }
            "waiting" | "finished" => {}
            other => panic!("unexpected line {other:?}"),
        }
    }
}

/// `idem-testkit crash --crash-at CRASH_AT` on `store_url` with a body of
/// `body_bytes`: once each of its keys has printed its `halted` line, it is
/// killed with `kill -9` and its keys recovered. The keys with the number
/// each printed, and what the recovery found.
async fn crash_then_recover(
    store_url: &str,
    crash_at: &str,
    halted_word: &str,
    body_bytes: usize,
) -> (BTreeMap<String, u64>, Recovery) {
    let dir = tempfile::tempdir().unwrap();
    let (body_path, body) = body_file(dir.path(), body_bytes);
    let mut child = Crashing::spawn(store_url, crash_at, KEYS, &body_path, &[]);
    let halted = halted(&child, halted_word, KEYS);
    child.process.kill_9();

    let keys: Vec<String> = halted.keys().cloned().collect();
    let store = idem::store::open(store_url).await.unwrap();
    let recovery = recover(store, &keys, &HashSet::new(), &body).await;
    (halted, recovery)
}

/// Killed while every handler runs: the claims are stored, no response is.
async fn killed_in_the_handler(store_url: &str) {
    let (fences, recovery) = crash_then_recover(store_url, "handler", "in-handler", 1000).await;
    assert!(recovery.replayed.is_empty(), "{recovery:?}");
    for (key, crashed) in &fences {
        let fence = recovery.taken_over[key];
        assert!(
            fence > *crashed,
            "{key}: the takeover's fence {fence} must be above the crashed holder's {crashed}"
        );
    }
}

/// Killed inside `complete`, before the store saw the write: taken over.
async fn killed_before_the_write(store_url: &str) {
    let (_, recovery) =
        crash_then_recover(store_url, "complete-unwritten", "halted-before-write", 1000).await;
    assert!(recovery.replayed.is_empty(), "{recovery:?}");
    assert_eq!(recovery.taken_over.len(), KEYS, "{recovery:?}");
}

/// Killed inside `complete`, after the store wrote the response and before
/// the guard heard so: the write counts, the response replays.
async fn killed_after_the_write(store_url: &str) {
    let (halted, recovery) =
        crash_then_recover(store_url, "complete-written", "halted-after-write", 100_000).await;
    let keys: Vec<String> = halted.into_keys().collect();
    assert_eq!(recovery.replayed, keys, "{recovery:?}");
    assert!(recovery.taken_over.is_empty(), "{recovery:?}");
}

/// A real `idem serve` (run as `idem-testkit idem serve`) on port 0, killed on drop.
struct Serve {
    process: Proc,
    addr: std::net::SocketAddr,
}

impl Serve {
    fn start(store_url: &str, upstream: std::net::SocketAddr) -> Serve {
        let mut idem = Command::new(TESTKIT);
        idem.args([
            "idem",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "off",
        ])
        .args([
            "--store",
            store_url,
            "--upstream",
            &format!("http://{upstream}"),
        ])
        .args([
            "--lease",
            "2s",
            "--store-timeout",
            "1s",
            "--upstream-timeout",
            "1500ms",
        ])
        .stdin(Stdio::null());
        let (process, [port]) = spawn_bound(idem, ["idem serve: http://"]);
        Serve {
            process,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }
}

/// The upstream: counts calls to `POST /orders`; the first one reports its
/// arrival and never answers, every later one answers 201 with its number.
async fn upstream() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    use axum::routing::post;
    let calls = Arc::new(AtomicUsize::new(0));
    let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/orders",
        post(move |body: String| async move {
            let call = counted.fetch_add(1, Ordering::SeqCst) + 1;
            if call == 1 {
                let _ = arrived.send(());
                std::future::pending::<()>().await;
            }
            (
                axum::http::StatusCode::CREATED,
                [("x-upstream-call", call.to_string())],
                format!("{{\"call\":{call},\"order\":{body}}}"),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls, arrivals)
}

/// `POST /orders` with a key through the gateway at `addr`.
async fn post_order(
    addr: std::net::SocketAddr,
    key: &str,
) -> Result<(u16, axum::http::HeaderMap, Vec<u8>), String> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<axum::body::Body>();
    let request = axum::http::Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"sku":"A","qty":1}"#))
        .unwrap();
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((parts.status.as_u16(), parts.headers, body.to_vec()))
}

/// Starts `idem serve` off the async runtime (it blocks until the gateway listens).
async fn start_serve(store_url: &str, upstream: std::net::SocketAddr) -> Serve {
    let store_url = store_url.to_owned();
    tokio::task::spawn_blocking(move || Serve::start(&store_url, upstream))
        .await
        .unwrap()
}

/// `idem serve` killed while its upstream handles a request. A second
/// gateway on the same store, started beforehand so that it answers within
/// milliseconds of the crash, gets 409 with Retry-After and calls nothing.
/// A third, started after the crash, is retried once the 2 s lease has run
/// out: one retry takes the key over and the upstream runs once more; from
/// then on both replay that response byte for byte.
async fn serve_killed_mid_request(store_url: &str) {
    let (upstream_addr, calls, mut arrivals) = upstream().await;
    let (mut first, standby) = tokio::join!(
        start_serve(store_url, upstream_addr),
        start_serve(store_url, upstream_addr)
    );
    let key = format!("\"{}\"", unique("order"));
    let (gateway, k) = (first.addr, key.clone());
    let lost = tokio::spawn(async move { post_order(gateway, &k).await });
    tokio::time::timeout(LINE_TIMEOUT, arrivals.recv())
        .await
        .expect("the request reached the upstream");
    // The claim was made before the upstream was called.
    let lease_end = Instant::now() + Duration::from_secs(2);
    first.process.kill_9();
    assert!(
        lost.await.unwrap().is_err(),
        "the client of the killed gateway got no answer"
    );

    let (status, headers, body) = post_order(standby.addr, &key).await.unwrap();
    assert!(
        Instant::now() < lease_end,
        "the retry came after the lease; the machine is too slow for this test"
    );
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a 409 calls nothing");

    let restarted = start_serve(store_url, upstream_addr).await;
    tokio::time::sleep(lease_end.saturating_duration_since(Instant::now())).await;
    let (status, headers, body) = loop {
        let reply = post_order(restarted.addr, &key).await.unwrap();
        if reply.0 != 409 {
            break reply;
        }
        assert!(
            Instant::now() < lease_end + Duration::from_secs(5),
            "still in flight long after the lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the takeover ran the upstream once"
    );
    assert_eq!(headers["x-upstream-call"], "2");
    assert!(headers.get("idempotent-replayed").is_none());

    for gateway in [restarted.addr, standby.addr] {
        let (again, replayed, replay) = post_order(gateway, &key).await.unwrap();
        assert_eq!(again, 201);
        assert_eq!(
            replay, body,
            "the replay is the takeover's body, byte for byte"
        );
        assert_eq!(replayed["idempotent-replayed"], "true");
        assert_eq!(replayed["x-upstream-call"], "2");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a replay calls nothing");
}

/// The crash scenarios every store goes through, as tests of the module that
/// invokes it, each on a store of its own that the module's `with_store`
/// gives it.
macro_rules! crash_scenarios {
    () => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_the_handler_then_takeover_after_the_lease() {
            with_store(killed_in_the_handler).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_complete_before_the_write_then_takeover() {
            with_store(killed_before_the_write).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn idem_serve_killed_mid_request_then_takeover_after_the_lease() {
            with_store(serve_killed_mid_request).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_complete_after_the_write_replays() {
            with_store(killed_after_the_write).await;
        }
    };
}

mod sqlite {
    use super::*;

    fn url(dir: &Path) -> String {
        format!("sqlite:{}", dir.join("idem.db").display())
    }

    /// A database file of its own.
    async fn with_store(scenario: impl AsyncFnOnce(&str)) {
        let dir = tempfile::tempdir().unwrap();
        scenario(&url(dir.path())).await;
    }

    crash_scenarios!();

    /// Frames in the write-ahead log after its last commit frame: pages of a
    /// transaction that was being written and never committed. Walks the
    /// frames whose salts match the header's (older frames left behind by a
    /// WAL reset carry other salts).
    fn uncommitted_frames(wal: &Path) -> usize {
        let Ok(wal) = std::fs::read(wal) else {
            return 0;
        };
        let be = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
        if wal.len() < 32 || !matches!(be(&wal, 0), 0x377f_0682 | 0x377f_0683) {
            return 0;
        }
        let page = be(&wal, 8) as usize;
        let salts = &wal[16..24];
        let (mut frames, mut committed) = (0, 0);
        for frame in wal[32..].chunks_exact(24 + page) {
            if &frame[8..16] != salts {
                break;
            }
            frames += 1;
            if be(frame, 4) != 0 {
                committed = frames;
            }
        }
        frames - committed
    }

    /// Killed inside a SQLite write transaction holding large completions:
    /// its statements ran and spilled pages into the write-ahead log, its
    /// COMMIT never did. After the restart the file is intact, nothing of
    /// that transaction is visible (its keys are taken over after their
    /// lease), and every response committed before it replays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_sqlite_inside_a_write_transaction_loses_no_acknowledged_response() {
        let dir = tempfile::tempdir().unwrap();
        // 32 responses of 256 KiB a round: more than SQLite's 2 MB page
        // cache holds, so the open transaction has written to the WAL.
        let (body_path, body) = body_file(dir.path(), 256 << 10);
        let store_url = url(dir.path());
        let mut child = Crashing::spawn(
            &store_url,
            "sqlite-transaction",
            32,
            &body_path,
            &["--rounds", "2"],
        );
        let mut seen = Writes::default();
        let in_transaction: usize = loop {
            let line = child.next();
            if line[0] == "in-transaction" {
                break line[1].parse().unwrap();
            }
            seen.record(&line);
        };
        child.process.kill_9();
        for line in child.rest() {
            seen.record(&line);
        }
        let torn = uncommitted_frames(&dir.path().join("idem.db-wal"));
        assert!(
            torn > 0,
            "the killed transaction left uncommitted pages in the WAL"
        );

        let store = idem::store::open(&store_url).await.unwrap();
        let check: String = rusqlite::Connection::open(dir.path().join("idem.db"))
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "the file is intact");
        assert_eq!(all_rows_decode(&store).await, seen.claimed.len());
        let recovery = recover(store, &seen.claimed, &seen.acknowledged, &body).await;
        println!(
            "{} claimed, {} acknowledged, {} replayed, {} taken over; killed in a transaction of \
             {in_transaction} completions with {torn} uncommitted WAL frames",
            seen.claimed.len(),
            seen.acknowledged.len(),
            recovery.replayed.len(),
            recovery.taken_over.len()
        );
        // The killed transaction holds more than half of the round's
        // completions, or all of those not yet committed; any queued behind
        // it were never written. Both kinds of key are still claimed. Had the
        // transaction's writes survived, fewer keys than it held would be
        // claimed: fewer were queued behind it than it held.
        assert!(
            recovery.taken_over.len() >= in_transaction,
            "every key of the uncommitted transaction is still claimed: {} taken over, \
             {in_transaction} in the transaction",
            recovery.taken_over.len()
        );
        assert_eq!(
            recovery.replayed.len() + recovery.taken_over.len(),
            seen.claimed.len()
        );
    }
}

mod postgres {
    use super::*;
    use deadpool_postgres::tokio_postgres::{self, NoTls};

    /// A table of its own, dropped at the end; `None` when no server is configured.
    struct Table {
        server: String,
        name: String,
    }

    impl Table {
        fn new() -> Option<Table> {
            let server = server_url("IDEM_TEST_POSTGRES_URL")?;
            let name = format!("crash_{}_{}", std::process::id(), fastrand::u32(..));
            Some(Table { server, name })
        }

        /// The store URL on this table, with `extra` parameters.
        fn url(&self, extra: &str) -> String {
            let sep = if self.server.contains('?') { '&' } else { '?' };
            format!("{}{sep}table={}&pool=4{extra}", self.server, self.name)
        }

        async fn client(&self) -> tokio_postgres::Client {
            let (client, connection) = tokio_postgres::connect(&self.server, NoTls).await.unwrap();
            tokio::spawn(connection);
            client
        }

        async fn drop_table(&self) {
            let t = &self.name;
            self.client()
                .await
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {t}; DROP FUNCTION IF EXISTS {t}_claim; \
                     DELETE FROM idem_schema WHERE table_name = '{t}'"
                ))
                .await
                .unwrap();
        }
    }

    /// A table of its own, dropped after the scenario; none when no server
    /// is configured.
    async fn with_store(scenario: impl AsyncFnOnce(&str)) {
        let Some(table) = Table::new() else { return };
        scenario(&table.url("")).await;
        table.drop_table().await;
    }

    crash_scenarios!();

    /// How many server sessions of `application` match `condition`.
    async fn sessions(client: &tokio_postgres::Client, application: &str, condition: &str) -> i64 {
        client
            .query_one(
                &format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND {condition}"
                ),
                &[&application],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Waits up to 20 s for `count` sessions of `application` to match `condition`.
    async fn await_sessions(
        client: &tokio_postgres::Client,
        application: &str,
        condition: &str,
        count: i64,
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = sessions(client, application, condition).await;
            if n == count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} sessions of {application} where {condition}, expected {count}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Killed while one of its completions is a transaction open in the
    /// server (held there by a row lock the test takes): the server ends
    /// the dead client's sessions, leaves no lock behind, the table is
    /// intact, every acknowledged response replays, and the key whose
    /// transaction was open either replays (the server finished it) or is
    /// taken over after its lease — never lost once acknowledged, never
    /// two responses.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_postgres_with_a_transaction_open_loses_no_acknowledged_response() {
        const KEYS: usize = 8;
        let Some(table) = Table::new() else { return };
        let application = format!("idem_crash_{}", fastrand::u32(..));
        let dir = tempfile::tempdir().unwrap();
        let (body_path, body) = body_file(dir.path(), 256 << 10);
        let mut child = Crashing::spawn(
            &table.url(&format!("&application_name={application}")),
            "store-write",
            KEYS,
            &body_path,
            &["--wait-before-complete"],
        );
        let mut seen = Writes::default();
        while seen.claimed.len() < KEYS {
            seen.record(&child.next());
        }
        assert_eq!(child.next(), ["waiting"]);

        // Lock one key's row, so its completion waits inside the server.
        let held = seen.claimed[0].clone();
        let lock = table.client().await;
        lock.batch_execute("BEGIN").await.unwrap();
        let t = &table.name;
        lock.query_one(
            &format!("SELECT 1 FROM {t} WHERE key = $1 FOR UPDATE"),
            &[&held],
        )
        .await
        .unwrap();
        child.go();
        while seen.acknowledged.len() < KEYS - 1 {
            seen.record(&child.next());
        }
        let monitor = table.client().await;
        let waiting = "state = 'active' AND wait_event_type = 'Lock' AND xact_start IS NOT NULL";
        await_sessions(&monitor, &application, waiting, 1).await;

        child.process.kill_9();
        for line in child.rest() {
            seen.record(&line);
        }
        assert!(!seen.acknowledged.contains(&held), "{held} was blocked");
        assert_eq!(
            sessions(&monitor, &application, waiting).await,
            1,
            "the dead client's transaction is still open in the server"
        );
        lock.batch_execute("ROLLBACK").await.unwrap();
        // The server notices the dead client and ends its sessions; none is left holding a lock.
        await_sessions(&monitor, &application, "true", 0).await;
        let locks: i64 = monitor
            .query_one(
                &format!(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                     WHERE c.relname = '{t}' AND l.pid <> pg_backend_pid()"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(locks, 0, "no lock on the table is left behind");

        let store = idem::store::open(&table.url("")).await.unwrap();
        assert_eq!(all_rows_decode(&store).await, KEYS);
        let recovery = recover(store, &seen.claimed, &seen.acknowledged, &body).await;
        assert_eq!(
            recovery.replayed.len() + recovery.taken_over.len(),
            KEYS,
            "{recovery:?}"
        );
        assert!(
            recovery.taken_over.keys().all(|k| *k == held),
            "only the key whose transaction was open may be unwritten: {recovery:?}"
        );
        println!(
            "the open transaction's write {} after the client died",
            if recovery.taken_over.is_empty() {
                "landed (the server finished it)"
            } else {
                "never landed (taken over after the lease)"
            }
        );
        table.drop_table().await;
    }
}
