//! Time, black box: the real `idem serve` with its wall clock stepped or
//! skewed by libfaketime — only `CLOCK_REALTIME` moves, as an NTP step, a VM
//! resumed or a mis-set host moves it; the monotonic and boot clocks stay
//! real — in front of an upstream (in this process, on the real clock) that
//! counts each order's executions and holds them until the test lets go.
//!
//! Every scenario of issue 40, on SQLite and Redis, and the two-gateway skew
//! on PostgreSQL too: a step forward past the lease never takes a running
//! key over, two gateways a minute apart never run a key twice, a completed
//! key outlives a step past its retention and replays the same bytes, and a
//! step back never holds a key longer than its lease.
//!
//! Needs libfaketime (Debian package `faketime`, installed by `.ci/run`).

use crate::support::{IDEM, Proc, Reply, http, post_order};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idem_harness::{server_url, unique};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};

/// Where Debian's libfaketime is.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How long a test waits for a state it polls for, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// A wall-clock offset for the processes started with it, changed while
/// they run: libfaketime reads the file on every clock call.
struct FakeTime {
    file: PathBuf,
}

impl FakeTime {
    fn new(dir: &Path, name: &str) -> FakeTime {
        assert!(
            Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: these tests need libfaketime (apt-get install faketime; .ci/run installs it)"
        );
        let fake = FakeTime {
            file: dir.join(format!("faketime-{name}")),
        };
        fake.set(0);
        fake
    }

    /// The wall clock `seconds` ahead of the real one (behind if negative),
    /// from the next clock call of every process started with this offset.
    fn set(&self, seconds: i64) {
        std::fs::write(&self.file, format!("{seconds:+}\n")).unwrap();
    }

    fn apply(&self, command: &mut Command) {
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
}

/// The orders' upstream: counts each order's executions (and the fence each
/// was sent with), then holds it until the test adds a permit.
#[derive(Clone)]
struct Upstream {
    executions: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    arrived: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl Upstream {
    async fn start() -> (Upstream, u16) {
        let upstream = Upstream {
            executions: Arc::default(),
            arrived: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        };
        let app = Router::new()
            .route("/orders", post(order))
            .with_state(upstream.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (upstream, port)
    }

    /// The fences `order` ran with, one per execution.
    fn runs(&self, order: &str) -> Vec<u64> {
        self.executions
            .lock()
            .unwrap()
            .get(order)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `order` has run `n` times (held or answered).
    async fn until_run(&self, order: &str, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.runs(order).len() < n {
            assert!(
                Instant::now() < deadline,
                "{order} ran {} times, not {n}",
                self.runs(order).len()
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), self.arrived.notified()).await;
        }
    }

    fn let_go(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

async fn order(
    State(upstream): State<Upstream>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let id = body["order"].as_str().unwrap_or_default().to_owned();
    let fence = headers
        .get("idempotency-fence")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let execution = {
        let mut executions = upstream.executions.lock().unwrap();
        let runs = executions.entry(id.clone()).or_default();
        runs.push(fence);
        runs.len()
    };
    upstream.arrived.notify_waiters();
    upstream.gate.acquire().await.unwrap().forget();
    (
        StatusCode::CREATED,
        Json(json!({"order": id, "execution": execution, "fence": fence})),
    )
}

/// One `idem serve` process on `store`, its wall clock offset by `fake`.
struct Gateway {
    port: u16,
    proc: Proc,
}

impl Gateway {
    fn start(store: &str, upstream: u16, fake: &FakeTime, flags: &[&str]) -> Gateway {
        let (proc, [port]) = idem_harness::spawn_bound(
            serve(
                store,
                upstream,
                fake,
                &[&["--admin-listen", "off"], flags].concat(),
            ),
            ["idem serve: http://"],
        );
        Gateway { port, proc }
    }

    /// `POST /orders` for `order` under the idempotency key `key`.
    async fn order(&self, key: &str, order: &str) -> Reply {
        post_order(self.port, key, &json!({"order": order}).to_string()).await
    }

    /// The order sent in a task of its own, once `upstream` holds its run.
    async fn order_held(
        &self,
        upstream: &Upstream,
        key: &str,
        order: &str,
    ) -> tokio::task::JoinHandle<Reply> {
        let (port, key, body) = (
            self.port,
            key.to_owned(),
            json!({"order": order}).to_string(),
        );
        let reply = tokio::spawn(async move { post_order(port, &key, &body).await });
        upstream.until_run(order, 1).await;
        reply
    }

    /// The run `upstream` holds of `first` let go: it answers 201, a repeat
    /// replays it, and `order` ran once.
    async fn held_run_finishes_once(
        &self,
        upstream: &Upstream,
        first: tokio::task::JoinHandle<Reply>,
        key: &str,
        order: &str,
    ) {
        upstream.let_go(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201, "{first:?}");
        assert_replays(&self.order(key, order).await, &first, "after it ran");
        assert_eq!(upstream.runs(order).len(), 1, "{order} ran once");
    }
}

/// `idem serve` on `store` in front of `upstream`, on port 0, its wall clock `fake`'s.
fn serve(store: &str, upstream: u16, fake: &FakeTime, flags: &[&str]) -> Command {
    let mut command = Command::new(IDEM);
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        store,
        "--upstream",
        &format!("http://127.0.0.1:{upstream}"),
        "--require-key",
        "true",
    ]);
    command.args(flags);
    fake.apply(&mut command);
    command
}

/// The 409 of a key in flight, with a Retry-After no longer than `lease`.
fn assert_in_flight(reply: &Reply, lease: Duration, what: &str) {
    assert_eq!(reply.status, 409, "{what}: {reply:?}");
    let retry_after: u64 = reply
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no Retry-After: {reply:?}"));
    assert!(
        retry_after <= lease.as_secs(),
        "{what}: Retry-After {retry_after} s is longer than the {} s lease",
        lease.as_secs()
    );
}

/// A replay: the first answer's status and body, marked replayed.
fn assert_replays(reply: &Reply, first: &Reply, what: &str) {
    assert_eq!(
        (reply.status, &reply.body),
        (first.status, &first.body),
        "{what}: not the first answer's bytes"
    );
    assert_eq!(
        reply.header("idempotent-replayed"),
        Some("true"),
        "{what}: {reply:?}"
    );
}

/// The stores a scenario runs on: a fresh SQLite file, a fresh Redis key
/// prefix, a fresh PostgreSQL table (`None` where the server is not set and
/// IDEM_TEST_SKIP_NETSTORES=1 says to skip it).
fn sqlite(dir: &Path) -> Option<String> {
    Some(format!("sqlite:{}", dir.join("idem.db").display()))
}

fn redis(_: &Path) -> Option<String> {
    let url = server_url("IDEM_TEST_REDIS_URL")?;
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}prefix={}:", unique("clock")))
}

fn postgres(_: &Path) -> Option<String> {
    let url = server_url("IDEM_TEST_POSTGRES_URL")?;
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{sep}table={}",
        unique("clock").replace('-', "_")
    ))
}

/// A 20 s lease (long: these scenarios step the clock, they do not wait).
const LONG_LEASE: &[&str] = &[
    "--lease",
    "20s",
    "--store-timeout",
    "2s",
    "--upstream-timeout",
    "15s",
];

/// A lease a test waits out.
const SHORT_LEASE: Duration = Duration::from_secs(4);
const SHORT: &[&str] = &[
    "--lease",
    "4s",
    "--store-timeout",
    "2s",
    "--upstream-timeout",
    "3s",
];

/// Runs `scenario` on each store that `stores` opens.
macro_rules! on_stores {
    ($scenario:ident: $($store:ident),+) => {
        mod $scenario {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $store() {
                    let dir = tempfile::tempdir().unwrap();
                    if let Some(store) = super::$store(dir.path()) {
                        super::$scenario(dir.path(), &store).await;
                    }
                }
            )+
        }
    };
}

/// A request is running when the gateway's wall clock steps a minute, then
/// an hour, past its lease: the repeats are told it is in flight, and the
/// order runs once (issue 40's first row: it ran twice, fences 1 and 2).
async fn a_step_forward_mid_request_takes_nothing_over(dir: &Path, store: &str) {
    let (upstream, up) = Upstream::start().await;
    let fake = FakeTime::new(dir, "a");
    let gateway = Gateway::start(store, up, &fake, LONG_LEASE);
    let first = gateway.order_held(&upstream, "k-1", "o-1").await;
    for step in [60, 3_600] {
        fake.set(step);
        let repeat = gateway.order("k-1", "o-1").await;
        assert_in_flight(&repeat, Duration::from_secs(20), &format!("+{step} s"));
    }
    gateway
        .held_run_finishes_once(&upstream, first, "k-1", "o-1")
        .await;
}
on_stores!(a_step_forward_mid_request_takes_nothing_over: sqlite, redis);

/// Two gateways on one store, one of them a minute ahead (three leases):
/// a repeat at either while the other runs the order is in flight, then
/// replays; each order runs once (issue 40's second row).
async fn two_gateways_a_minute_apart_run_each_order_once(dir: &Path, store: &str) {
    let (upstream, up) = Upstream::start().await;
    let (behind, ahead) = (FakeTime::new(dir, "behind"), FakeTime::new(dir, "ahead"));
    ahead.set(60);
    let gateways = [
        Gateway::start(store, up, &behind, LONG_LEASE),
        Gateway::start(store, up, &ahead, LONG_LEASE),
    ];
    for (first_at, repeat_at, order) in [(0, 1, "o-1"), (1, 0, "o-2")] {
        let key = format!("k-{order}");
        let first = gateways[first_at].order_held(&upstream, &key, order).await;
        let repeat = gateways[repeat_at].order(&key, order).await;
        assert_in_flight(
            &repeat,
            Duration::from_secs(20),
            &format!("{order} repeated at gateway {repeat_at}"),
        );
        upstream.let_go(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201, "{first:?}");
        for gateway in &gateways {
            assert_replays(&gateway.order(&key, order).await, &first, order);
        }
        assert_eq!(upstream.runs(order).len(), 1, "{order} ran once");
    }
}
on_stores!(two_gateways_a_minute_apart_run_each_order_once: sqlite, redis, postgres);

/// A completed key, then a step of three hours past a two-hour retention:
/// the key is still remembered and replays its bytes (issue 40's third row:
/// a second run and a second, different body).
async fn a_step_past_the_retention_forgets_no_key(dir: &Path, store: &str) {
    let (upstream, up) = Upstream::start().await;
    let fake = FakeTime::new(dir, "a");
    let flags = [LONG_LEASE, &["--retention", "2h"]].concat();
    let gateway = Gateway::start(store, up, &fake, &flags);
    upstream.let_go(1);
    let first = gateway.order("k-1", "o-1").await;
    assert_eq!(first.status, 201, "{first:?}");
    fake.set(3 * 3_600);
    assert_replays(&gateway.order("k-1", "o-1").await, &first, "+3 h");
    assert_eq!(upstream.runs("o-1").len(), 1, "o-1 ran once");
}
on_stores!(a_step_past_the_retention_forgets_no_key: sqlite, redis);

/// A gateway killed while its order runs, restarted an hour behind on the
/// same store: the key is in flight for the rest of the lease only, then a
/// retry takes it over with a higher fence (issue 40's fourth row: held
/// for an hour, Retry-After 3,594 s).
async fn a_gateway_restarted_an_hour_behind_holds_a_key_for_its_lease(dir: &Path, store: &str) {
    let (upstream, up) = Upstream::start().await;
    let fake = FakeTime::new(dir, "a");
    let mut gateway = Gateway::start(store, up, &fake, SHORT);
    let _lost = gateway.order_held(&upstream, "k-1", "o-1").await;
    gateway.proc.kill_9();
    fake.set(-3_600);
    let gateway = Gateway::start(store, up, &fake, SHORT);
    upstream.let_go(2); // the killed holder's run, and the takeover's
    let deadline = Instant::now() + PATIENCE;
    let taken_over = loop {
        let reply = gateway.order("k-1", "o-1").await;
        if reply.status != 409 {
            break reply;
        }
        assert_in_flight(&reply, SHORT_LEASE, "the killed holder's key");
        assert!(
            Instant::now() < deadline,
            "still in flight long after the lease"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(taken_over.status, 201, "{taken_over:?}");
    let fences = upstream.runs("o-1");
    assert_eq!(fences.len(), 2, "the holder's run and the takeover's");
    assert!(fences[1] > fences[0], "a higher fence: {fences:?}");
}
on_stores!(a_gateway_restarted_an_hour_behind_holds_a_key_for_its_lease: sqlite, redis);

/// The wall clock steps an hour back while an order runs: it completes and
/// replays (no second run), and a key whose holder was killed during the
/// step is taken over after its lease, not after the hour (issue 40's
/// last row).
async fn a_step_back_mid_request_holds_no_key_past_its_lease(dir: &Path, store: &str) {
    let (upstream, up) = Upstream::start().await;
    let fake = FakeTime::new(dir, "a");
    let gateway = Gateway::start(store, up, &fake, SHORT);
    let first = gateway.order_held(&upstream, "k-1", "o-1").await;
    fake.set(-3_600);
    assert_in_flight(
        &gateway.order("k-1", "o-1").await,
        SHORT_LEASE,
        "stepped back",
    );
    gateway
        .held_run_finishes_once(&upstream, first, "k-1", "o-1")
        .await;

    // A holder killed an hour "later" than its claim: its lease is the lease.
    fake.set(0);
    let mut holder = Gateway::start(store, up, &fake, SHORT);
    let _lost = holder.order_held(&upstream, "k-2", "o-2").await;
    holder.proc.kill_9();
    upstream.let_go(2);
    fake.set(-3_600);
    let started = Instant::now();
    let deadline = started + PATIENCE;
    loop {
        let reply = gateway.order("k-2", "o-2").await;
        if reply.status == 201 {
            break;
        }
        assert_in_flight(&reply, SHORT_LEASE, "the killed holder's key");
        assert!(Instant::now() < deadline, "held long after its lease");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(upstream.runs("o-2").len(), 2);
}
on_stores!(a_step_back_mid_request_holds_no_key_past_its_lease: sqlite, redis);

/// An operator sees the guard's time authority, its error bound, and how
/// far the host's wall clock is from it: here an hour ahead, by libfaketime.
async fn stats_name_the_authority_and_the_wall_clocks_offset(dir: &Path, store: &str) {
    let (_upstream, up) = Upstream::start().await;
    // Opened first on the real clock: a new SQLite file is anchored at the
    // wall clock of the first process to open it.
    drop(idem::store::open(store).await.unwrap());
    let fake = FakeTime::new(dir, "a");
    fake.set(3_600);
    let (_proc, [_proxy, admin]) = idem_harness::spawn_bound(
        serve(store, up, &fake, &["--admin-listen", "127.0.0.1:0"]),
        ["idem serve: http://", "admin API: http://"],
    );
    let stats: idem_admin_api::Stats =
        serde_json::from_slice(&http(admin, "GET", "/v1/stats", &[], "").await.body).unwrap();
    let clock = stats.clock;
    let (want, bound_ms) = if store.starts_with("sqlite:") {
        ("SQLite file", 0)
    } else {
        ("Redis server's clock", 1_000)
    };
    assert!(clock.authority.contains(want), "{clock:?}");
    assert!(
        clock.error_ms.is_some_and(|e| e <= bound_ms),
        "known, within its bound: {clock:?}"
    );
    let off = clock.wall_offset_ms - 3_600_000;
    assert!(
        off.abs() < 10_000,
        "the wall clock an hour ahead: {clock:?}"
    );
    let metrics = http(admin, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("\nidem_clock_known 1\n"), "{text}");
    assert!(
        text.contains("\nidem_wall_clock_offset_seconds 3"),
        "{text}"
    );
}
on_stores!(stats_name_the_authority_and_the_wall_clocks_offset: sqlite, redis);
