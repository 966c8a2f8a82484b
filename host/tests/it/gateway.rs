//! The gateway end to end over real HTTP on port 0: a test upstream that
//! counts executions, the proxy in front of it, the admin API beside it.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::ledger::{Books, Ledger};
use idem::server::{AdminListener, Config, Gateway, InFlight, Profile, StorePolicy};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// The service behind the gateway: the ledger, plus endpoints that echo,
/// fail, hang, or wait for the test's go-ahead.
#[derive(Clone)]
struct Upstream {
    ledger: Ledger,
    calls: Arc<AtomicUsize>,
    /// `/slow` reports its arrival here, then waits for a permit.
    arrived: mpsc::UnboundedSender<()>,
    go: Arc<Semaphore>,
}

async fn echo(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::http::Response<Body> {
    let n = up.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let client = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    axum::http::Response::builder()
        .status(201)
        .header("content-type", "application/json")
        .header("set-cookie", "a=1")
        .header("set-cookie", "b=2")
        .header("x-call", n.to_string())
        .body(Body::from(
            json!({"call": n, "client": client, "echo": String::from_utf8_lossy(&body)})
                .to_string(),
        ))
        .unwrap()
}

async fn slow(State(up): State<Upstream>) -> (StatusCode, String) {
    let n = up.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = up.arrived.send(());
    up.go.acquire().await.unwrap().forget();
    (StatusCode::OK, format!("slow call {n}"))
}

async fn fail(State(up): State<Upstream>) -> (StatusCode, String) {
    let n = up.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::INTERNAL_SERVER_ERROR, format!("failure {n}"))
}

async fn hang(State(up): State<Upstream>) -> StatusCode {
    up.calls.fetch_add(1, Ordering::SeqCst);
    std::future::pending::<()>().await;
    StatusCode::OK
}

async fn big(State(up): State<Upstream>) -> Vec<u8> {
    up.calls.fetch_add(1, Ordering::SeqCst);
    vec![b'x'; 64 * 1024]
}

struct Harness {
    proxy: SocketAddr,
    admin: SocketAddr,
    upstream: Upstream,
    arrivals: mpsc::UnboundedReceiver<()>,
    gateway: Gateway,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    client: Client<HttpConnector, Body>,
}

async fn start(config: Config) -> Harness {
    start_with(config, None).await
}

async fn start_with(config: Config, token: Option<&str>) -> Harness {
    let (arrived, arrivals) = mpsc::unbounded_channel();
    let upstream = Upstream {
        ledger: Ledger::new(1_000, Duration::from_millis(20)),
        calls: Arc::default(),
        arrived,
        go: Arc::new(Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/echo", post(echo).patch(echo).put(echo))
        .route("/slow", post(slow))
        .route("/fail", post(fail))
        .route("/hang", post(hang))
        .route("/big", post(big))
        .with_state(upstream.clone())
        .merge(upstream.ledger.router());
    let upstream_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream_listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(upstream_listener, app).await.unwrap() });

    let store = idem::store::open("memory:").await.unwrap();
    let gateway = Gateway::builder(config, store, &format!("http://{upstream_addr}"))
        .build()
        .unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (proxy_addr, admin_addr) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
    let admin = AdminListener::new(admin, token.map(str::to_owned)).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(idem::server::run(
        gateway.clone(),
        proxy,
        Some(admin),
        async {
            let _ = stopped.await;
        },
    ));
    Harness {
        proxy: proxy_addr,
        admin: admin_addr,
        upstream,
        arrivals,
        gateway,
        stop: Some(stop),
        served,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    /// Every header but the ones that differ per response on the wire.
    fn stable_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .filter(|(n, _)| n.as_str() != "idempotent-replayed")
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect()
    }
}

impl Harness {
    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.send_to(self.proxy, method, path, headers, body).await
    }

    async fn admin(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.send_to(self.admin, method, path, headers, body).await
    }

    async fn send_to(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(format!("http://{addr}{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let response = self
            .client
            .request(req.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    /// `POST /slow` with `key` on a task of its own: it arrives upstream and
    /// waits there for a permit on `upstream.go`.
    fn spawn_slow(&self, key: &str) -> tokio::task::JoinHandle<Reply> {
        let (client, proxy, key) = (self.client.clone(), self.proxy, key.to_owned());
        tokio::spawn(async move {
            let req = Request::post(format!("http://{proxy}/slow"))
                .header("idempotency-key", key)
                .body(Body::empty())
                .unwrap();
            let (parts, body) = client.request(req).await.unwrap().into_parts();
            Reply {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: body.collect().await.unwrap().to_bytes(),
            }
        })
    }

    async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
        self.send(
            "POST",
            path,
            &[
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await
    }

    fn calls(&self) -> usize {
        self.upstream.calls.load(Ordering::SeqCst)
    }

    fn books(&self) -> Books {
        self.upstream.ledger.books()
    }

    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.served.await.unwrap();
    }
}

fn order(id: &str, qty: i64) -> String {
    json!({"order": id, "sku": "A", "qty": qty, "cents": 1000}).to_string()
}

fn assert_problem(reply: &Reply, status: u16, slug: &str) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["status"], status, "{body}");
    assert!(body["type"].as_str().unwrap().ends_with(slug), "{body}");
    assert!(
        !body["title"].as_str().unwrap().is_empty() && !body["detail"].as_str().unwrap().is_empty(),
        "{body}"
    );
}

#[tokio::test]
async fn first_request_runs_once_and_repeats_replay_it_byte_for_byte() {
    let h = start(Config::default()).await;
    let first = h.post("/echo", "k-1", r#"{"amount":5}"#).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotent-replayed"), None);
    let cookies: Vec<_> = first.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);

    for _ in 0..3 {
        let again = h.post("/echo", "k-1", r#"{"amount":5}"#).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.stable_headers(), first.stable_headers());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(h.calls(), 1, "the upstream ran once");
    // The upstream learns the claim's fence.
    assert_eq!(first.json()["call"], 1);
    h.shutdown().await;
}

#[tokio::test]
async fn the_upstream_sees_the_key_and_the_fence() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let app = Router::new().route(
        "/x",
        post(move |headers: HeaderMap| async move {
            let get = |n: &str| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
            recorded.lock().unwrap().push((
                get("idempotency-key"),
                get("idempotency-fence"),
                get("host"),
            ));
            "ok"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let gateway = Gateway::builder(
        Config::default(),
        idem::store::open("memory:").await.unwrap(),
        &format!("http://{addr}"),
    )
    .build()
    .unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    tokio::spawn(idem::server::run(
        gateway,
        proxy,
        None,
        std::future::pending(),
    ));
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let req = Request::post(format!("http://{proxy_addr}/x"))
        .header("idempotency-key", "\"abc\"")
        .body(Body::empty())
        .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [(
            Some("\"abc\"".to_owned()),
            Some("1".to_owned()),
            Some(addr.to_string())
        )]
    );
}

#[tokio::test]
async fn a_repeat_in_flight_gets_409_with_retry_after_then_the_replay() {
    let mut h = start(Config {
        lease: Duration::from_secs(30),
        upstream_timeout: Duration::from_secs(5),
        store_timeout: Duration::from_secs(2),
        ..Config::default()
    })
    .await;
    let first = h.spawn_slow("k");
    h.arrivals.recv().await.unwrap();
    let busy = h
        .send("POST", "/slow", &[("idempotency-key", "k")], "")
        .await;
    assert_problem(&busy, 409, "idempotency-key-in-flight");
    let retry_after: u64 = busy.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (1..=7).contains(&retry_after),
        "Retry-After {retry_after}: the holder finishes within its 5 s upstream timeout and a 2 s \
         completion, not the whole 30 s lease"
    );

    h.upstream.go.add_permits(1);
    let Reply { status, body, .. } = first.await.unwrap();
    assert_eq!((status, &body[..]), (200, &b"slow call 1"[..]));
    let replay = h
        .send("POST", "/slow", &[("idempotency-key", "k")], "")
        .await;
    assert_eq!(
        (replay.status, &replay.body[..]),
        (200, &b"slow call 1"[..])
    );
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_execute_once() {
    let h = start(Config::default()).await;
    let body = order("o-50", 1);
    let replies =
        futures::future::join_all((0..50).map(|_| h.post("/orders", "o-50", &body))).await;
    let books = h.books();
    assert_eq!(books.executions.get("o-50"), Some(&1), "{books:?}");
    assert_eq!(books.stock, 999);
    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|r| r.body == created[0].body),
        "every 201 carries the one stored body"
    );
    assert!(
        replies.iter().all(|r| r.status == 201 || r.status == 409),
        "only 201 or 409"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn with_waiting_enabled_concurrent_repeats_all_get_the_first_response() {
    let h = start(Config {
        in_flight: InFlight::Wait(Duration::from_secs(10)),
        ..Config::default()
    })
    .await;
    let body = order("o-wait", 2);
    let replies =
        futures::future::join_all((0..50).map(|_| h.post("/orders", "o-wait", &body))).await;
    assert_eq!(h.books().executions.get("o-wait"), Some(&1));
    assert!(
        replies
            .iter()
            .all(|r| r.status == 201 && r.body == replies[0].body),
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.header("idempotent-replayed").is_none())
            .count(),
        1
    );
    // Replays register to wait too; none may outlive its request.
    for i in 0..20 {
        assert_eq!(h.post("/orders", "o-wait", &body).await.status, 201, "{i}");
    }
    assert_eq!(
        h.gateway.gate().waiting_keys(),
        0,
        "no waiter outlives its request"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_key_reused_for_another_payload_is_422_and_runs_nothing() {
    let h = start(Config::default()).await;
    assert_eq!(h.post("/orders", "o-1", &order("o-1", 1)).await.status, 201);
    let other = h.post("/orders", "o-1", &order("o-1", 5)).await;
    assert_problem(&other, 422, "idempotency-key-mismatch");
    // Another path with the same key is another request too.
    assert_problem(
        &h.post("/echo", "o-1", &order("o-1", 1)).await,
        422,
        "idempotency-key-mismatch",
    );
    assert_eq!(h.books().executions.get("o-1"), Some(&1));
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn missing_and_malformed_keys_get_400_problems() {
    let h = start(Config {
        require_key: true,
        ..Config::default()
    })
    .await;
    assert_problem(
        &h.send("POST", "/echo", &[], "{}").await,
        400,
        "idempotency-key-missing",
    );
    for bad in [
        "\"unterminated",
        "\"\"",
        "has space",
        "\"bad\\escape\"",
        &"k".repeat(201),
    ] {
        let reply = h.post("/echo", bad, "{}").await;
        assert_problem(&reply, 400, "idempotency-key-malformed");
    }
    let twice = h
        .send(
            "POST",
            "/echo",
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
            "{}",
        )
        .await;
    assert_problem(&twice, 400, "idempotency-key-malformed");
    assert!(
        twice.json()["detail"]
            .as_str()
            .unwrap()
            .contains("more than one")
    );
    let long = h.post("/echo", &"k".repeat(201), "{}").await;
    assert!(
        long.json()["detail"]
            .as_str()
            .unwrap()
            .contains("limit is 200")
    );
    // Unguarded methods pass through without a key.
    let get = h.send("GET", "/ledger", &[], "").await;
    assert_eq!(get.status, 200);
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn without_require_key_a_keyless_post_passes_through_unguarded() {
    let h = start(Config::default()).await;
    assert_eq!(h.send("POST", "/echo", &[], "x").await.status, 201);
    assert_eq!(h.send("POST", "/echo", &[], "x").await.status, 201);
    assert_eq!(h.calls(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn two_clients_with_the_same_key_never_see_each_others_response() {
    let h = start(Config::default()).await;
    let send = |who: &'static str, body: &'static str| {
        let h = &h;
        async move {
            h.send(
                "POST",
                "/echo",
                &[("idempotency-key", "shared"), ("authorization", who)],
                body,
            )
            .await
        }
    };
    let alice = send("Bearer alice", "alice's order").await;
    let bob = send("Bearer bob", "bob's order").await;
    assert_eq!(
        (alice.status, bob.status),
        (201, 201),
        "bob's different payload is no conflict: his key is his own"
    );
    assert_eq!(alice.json()["client"], "Bearer alice");
    assert_eq!(bob.json()["client"], "Bearer bob");
    let alice_again = send("Bearer alice", "alice's order").await;
    let bob_again = send("Bearer bob", "bob's order").await;
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(h.calls(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn store_faults_set_through_the_admin_api_give_503_and_no_upstream_call() {
    let h = start(Config::default()).await;
    let put = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"insert":{"kind":"error","message":"connection refused"}}}"#,
        )
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    assert_eq!(put.json()["faults"]["insert"]["kind"], "error");
    assert_eq!(put.json()["faults"]["get"]["kind"], "off");

    let down = h.post("/orders", "o-down", &order("o-down", 1)).await;
    assert_problem(&down, 503, "store-unavailable");
    assert_eq!(down.header("retry-after"), Some("1"));
    assert!(
        down.json()["detail"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );
    assert!(
        h.books().executions.is_empty(),
        "the upstream was never called"
    );

    let faults = h.admin("GET", "/v1/faults", &[], "").await.json();
    assert_eq!(faults["injected"], 1);
    let stats = h.admin("GET", "/v1/stats", &[], "").await.json();
    assert_eq!(stats["outcomes"]["unavailable"], 1);
    assert_eq!(stats["store"], "memory");

    let off = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"insert":{"kind":"off"}}}"#,
        )
        .await;
    assert_eq!(off.json()["faults"]["insert"]["kind"], "off");
    assert_eq!(
        h.post("/orders", "o-down", &order("o-down", 1))
            .await
            .status,
        201
    );
    assert_eq!(h.books().executions.get("o-down"), Some(&1));
    h.shutdown().await;
}

#[tokio::test]
async fn invalid_fault_rules_are_refused_naming_the_field_and_nothing_changes() {
    let h = start(Config::default()).await;
    let bad = h.admin("PUT", "/v1/faults", &[], r#"{"faults":{"get":{"kind":"delay","latency_ms":5},"insert":{"kind":"error","probability":1.5}}}"#).await;
    assert_problem(&bad, 400, "about:blank");
    let detail = bad.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("faults.insert") && detail.contains("outside 0 to 1"),
        "{detail}"
    );
    assert_eq!(
        h.admin("GET", "/v1/faults", &[], "").await.json()["faults"]["get"]["kind"],
        "off",
        "all or nothing"
    );
    let unknown = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"purge":{"kind":"error"}}}"#,
        )
        .await;
    assert!(
        unknown.json()["detail"]
            .as_str()
            .unwrap()
            .contains("faults.purge")
    );
    let kind = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"get":{"kind":"explode"}}}"#,
        )
        .await;
    assert_eq!(kind.status, 400);
    assert_eq!(
        h.admin("PUT", "/v1/faults", &[], "not json").await.status,
        400
    );
    // A count of 0 would hit no call: refused, not fired once.
    let zero = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"insert":{"kind":"error","count":0}}}"#,
        )
        .await;
    assert_eq!(zero.status, 400, "{zero:?}");
    assert!(
        zero.json()["detail"]
            .as_str()
            .unwrap()
            .contains("count 0 would hit no call"),
        "{zero:?}"
    );
    assert_eq!(
        h.post("/orders", "o-count", &order("o-count", 1))
            .await
            .status,
        201
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_admin_token_is_enforced_and_required_off_loopback() {
    let h = start_with(Config::default(), Some("s3cret")).await;
    let none = h.admin("GET", "/v1/stats", &[], "").await;
    assert_problem(&none, 401, "about:blank");
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        h.admin("GET", "/v1/stats", &[("authorization", "Bearer wrong")], "")
            .await
            .status,
        401
    );
    assert_eq!(
        h.admin("GET", "/metrics", &[("authorization", "Bearer s3cre")], "")
            .await
            .status,
        401
    );
    assert_eq!(
        h.admin(
            "GET",
            "/v1/stats",
            &[("authorization", "Bearer s3cret")],
            ""
        )
        .await
        .status,
        200
    );
    h.shutdown().await;

    let open = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = AdminListener::new(open, None).err().unwrap().to_string();
    assert!(
        err.contains("not a loopback address") && err.contains("--admin-token"),
        "{err}"
    );
    let open = TcpListener::bind("0.0.0.0:0").await.unwrap();
    assert!(AdminListener::new(open, Some("t".into())).is_ok());
}

#[tokio::test]
#[allow(clippy::too_many_lines)] // one key's life through the admin API
async fn admin_keys_list_get_release_expire_delete() {
    let mut h = start(Config::default()).await;
    let done = h.post("/echo", "k-done", "hello").await;
    let slow = h.spawn_slow("k-busy");
    h.arrivals.recv().await.unwrap();
    h.post("/echo", "k-done", "hello").await; // one replay

    let list = h.admin("GET", "/v1/keys", &[], "").await.json();
    let keys: Vec<&str> = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["anon/k-busy", "anon/k-done"]);
    let busy = &list["keys"][0];
    assert_eq!(
        (
            busy["state"].as_str(),
            busy["fence"].as_u64(),
            busy["status"].is_null()
        ),
        (Some("processing"), Some(1), true)
    );
    assert!(busy["lease_remaining_ms"].as_u64().unwrap() > 0);
    assert_eq!(list["keys"][1]["replays"], 1);
    assert_eq!(list["keys"][1]["status"], 201);

    let processing = h
        .admin("GET", "/v1/keys?state=processing&limit=1", &[], "")
        .await
        .json();
    assert_eq!(processing["keys"].as_array().unwrap().len(), 1);
    let first_page = h.admin("GET", "/v1/keys?limit=1", &[], "").await.json();
    assert_eq!(first_page["next"], "anon/k-busy");
    let second_page = h
        .admin("GET", "/v1/keys?limit=1&after=anon%2Fk-busy", &[], "")
        .await
        .json();
    assert_eq!(second_page["keys"][0]["key"], "anon/k-done");
    let by_replays = h
        .admin("GET", "/v1/keys?sort=replays&order=desc", &[], "")
        .await
        .json();
    assert_eq!(
        (
            by_replays["keys"][0]["key"].as_str(),
            by_replays["total"].as_u64()
        ),
        (Some("anon/k-done"), Some(2))
    );
    assert_eq!(
        h.admin("GET", "/v1/keys?limit=5000", &[], "").await.status,
        400
    );
    assert_eq!(
        h.admin("GET", "/v1/keys?state=lost", &[], "").await.status,
        400
    );

    let one = h
        .admin("GET", "/v1/keys/anon%2Fk-done", &[], "")
        .await
        .json();
    let response = &one["response"];
    assert_eq!(response["status"], 201);
    let stored = base64::engine::general_purpose::STANDARD
        .decode(response["body_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(stored, done.body, "the admin API shows the bytes replayed");
    assert_eq!(response["body_bytes"], done.body.len());
    assert!(
        response["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "set-cookie" && h[1] == "a=1")
    );

    assert_eq!(
        h.admin("POST", "/v1/keys/anon%2Fk-done/release", &[], "")
            .await
            .status,
        409
    );
    let released = h
        .admin("POST", "/v1/keys/anon%2Fk-busy/release", &[], "")
        .await;
    assert_eq!(released.status, 200);
    assert_eq!(released.json()["lease_remaining_ms"], 0);
    // The lease is over: a retry takes the key over (a second execution, as the operator asked).
    let takeover = h.spawn_slow("k-busy");
    h.arrivals.recv().await.unwrap();
    h.upstream.go.add_permits(2);
    assert_eq!(takeover.await.unwrap().status, 200);
    // The released holder's completion is refused: its client is told the
    // request ran but was not recorded, never handed a second 2xx body.
    assert_problem(&slow.await.unwrap(), 503, "response-not-recorded");

    assert_eq!(
        h.admin("POST", "/v1/keys/anon%2Fk-done/expire", &[], "")
            .await
            .status,
        200
    );
    assert_eq!(
        h.admin("GET", "/v1/keys/anon%2Fk-done", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(
        h.admin("DELETE", "/v1/keys/anon%2Fk-busy", &[], "")
            .await
            .status,
        204
    );
    assert_problem(
        &h.admin("DELETE", "/v1/keys/anon%2Fk-busy", &[], "").await,
        404,
        "about:blank",
    );
    assert_eq!(
        h.admin("POST", "/v1/keys/nope/expire", &[], "")
            .await
            .status,
        404
    );
    h.shutdown().await;
}

#[tokio::test]
async fn server_errors_release_the_key_unless_the_policy_stores_them() {
    let h = start(Config::default()).await;
    assert_eq!(h.post("/fail", "f", "").await.body, "failure 1");
    let retry = h.post("/fail", "f", "").await;
    assert_eq!(
        (retry.status, &retry.body[..]),
        (500, &b"failure 2"[..]),
        "released: the retry ran again"
    );
    h.shutdown().await;

    let h = start(Config {
        store_policy: StorePolicy {
            server_errors: true,
            timeouts: false,
        },
        ..Config::default()
    })
    .await;
    assert_eq!(h.post("/fail", "f", "").await.body, "failure 1");
    let again = h.post("/fail", "f", "").await;
    assert_eq!(
        (
            again.status,
            &again.body[..],
            again.header("idempotent-replayed")
        ),
        (500, &b"failure 1"[..], Some("true"))
    );
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn an_upstream_timeout_is_504_and_releases_the_key_unless_stored() {
    let h = start(Config {
        upstream_timeout: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    assert_eq!(h.calls(), 2, "released: the retry was forwarded again");
    h.shutdown().await;

    let policy = StorePolicy {
        server_errors: false,
        timeouts: true,
    };
    let h = start(Config {
        upstream_timeout: Duration::from_millis(100),
        store_policy: policy,
        ..Config::default()
    })
    .await;
    assert_problem(&h.post("/hang", "t", "").await, 504, "upstream-timeout");
    let replay = h.post("/hang", "t", "").await;
    assert_problem(&replay, 504, "upstream-timeout");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_releases_the_key() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let gateway = Gateway::builder(
        Config::default(),
        idem::store::open("memory:").await.unwrap(),
        &format!("http://{closed}"),
    )
    .build()
    .unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(idem::server::run(
        gateway.clone(),
        proxy,
        None,
        std::future::pending(),
    ));
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    for _ in 0..2 {
        let req = Request::post(format!("http://{addr}/x"))
            .header("idempotency-key", "u")
            .body(Body::empty())
            .unwrap();
        let r = client.request(req).await.unwrap();
        assert_eq!(r.status(), 502);
    }
    assert_eq!(
        gateway.observer().count(idem::server::Verdict::Executed),
        2,
        "each try was forwarded; the key was released"
    );
}

#[tokio::test]
async fn limits_on_bodies_and_responses() {
    let h = start(Config {
        max_request_bytes: 1024,
        max_response_bytes: 16 * 1024,
        lease: Duration::from_secs(1),
        upstream_timeout: Duration::from_millis(500),
        ..Config::default()
    })
    .await;
    let big = "x".repeat(2048);
    let reply = h.post("/echo", "b", &big).await;
    assert_problem(&reply, 413, "body-too-large");
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("1024 bytes")
    );
    assert_eq!(h.calls(), 0);

    let too_large = h.post("/big", "r", "").await;
    assert_problem(&too_large, 502, "response-too-large");
    assert!(
        too_large.json()["detail"]
            .as_str()
            .unwrap()
            .contains("16384 bytes"),
        "{too_large:?}"
    );
    // The upstream ran: the key is done with this answer in its place, so a
    // repeat, even long after the lease, replays it and never runs it again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let repeat = h.post("/big", "r", "").await;
    assert_problem(&repeat, 502, "response-too-large");
    assert_eq!(repeat.header("idempotent-replayed"), Some("true"));
    assert_eq!(repeat.body, too_large.body);
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn too_many_concurrent_requests_are_shed_with_503() {
    let mut h = start(Config {
        max_concurrent: 1,
        ..Config::default()
    })
    .await;
    let first = h.spawn_slow("c");
    h.arrivals.recv().await.unwrap();
    let shed = h.post("/echo", "other", "").await;
    assert_problem(&shed, 503, "overloaded");
    h.upstream.go.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn the_stripe_profile_speaks_stripe() {
    let mut h = start(Config {
        profile: Profile::Stripe,
        ..Config::default()
    })
    .await;
    assert_eq!(h.post("/echo", "s", "one").await.status, 201);
    let mismatch = h.post("/echo", "s", "two").await;
    assert_eq!(mismatch.status, 400);
    assert_eq!(mismatch.json()["error"]["type"], "idempotency_error");
    let replay = h.post("/echo", "s", "one").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    let first = h.spawn_slow("busy");
    h.arrivals.recv().await.unwrap();
    let busy = h
        .send("POST", "/slow", &[("idempotency-key", "busy")], "")
        .await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.json()["error"]["code"], "idempotency_key_in_use");
    h.upstream.go.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    h.shutdown().await;
}

/// A completion the store refuses: the upstream ran, but its response is not
/// handed out (a replay could contradict it). The client is told so, with
/// Retry-After; once the lease runs out the retry runs the order again under
/// a higher fence, and from then on every answer for the key is that one.
#[tokio::test]
async fn a_response_the_store_could_not_record_is_not_given_out() {
    let h = start(Config {
        lease: Duration::from_secs(1),
        upstream_timeout: Duration::from_millis(500),
        ..Config::default()
    })
    .await;
    let fault = h
        .admin(
            "PUT",
            "/v1/faults",
            &[],
            r#"{"faults":{"replace":{"kind":"error","message":"disk full","count":1}}}"#,
        )
        .await;
    assert_eq!(fault.status, 200, "{fault:?}");
    let body = order("o-nr", 1);
    let first = h.post("/orders", "o-nr", &body).await;
    assert_problem(&first, 503, "response-not-recorded");
    assert_eq!(first.header("retry-after"), Some("1"));
    assert!(
        first.json()["detail"]
            .as_str()
            .unwrap()
            .contains("disk full"),
        "{first:?}"
    );
    assert_eq!(h.books().executions.get("o-nr"), Some(&1));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = h.post("/orders", "o-nr", &body).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    let replay = h.post("/orders", "o-nr", &body).await;
    assert_eq!((replay.status, &replay.body), (201, &retry.body));
    let books = h.books();
    assert_eq!(books.executions.get("o-nr"), Some(&2), "{books:?}");
    let fences = &books.fences["o-nr"];
    assert!(
        fences[1] > fences[0],
        "the rerun has the higher fence: {fences:?}"
    );
    h.shutdown().await;
}

/// `OPTIONS *` asks about the server, not a resource: the gateway answers it
/// itself (400, naming why) and never appends `*` to the upstream's address,
/// which used to send it to port 80 of another host.
#[tokio::test]
async fn options_asterisk_is_not_forwarded() {
    let h = start(Config::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(h.proxy).await.unwrap();
    tcp.write_all(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not a path"), "{answer}");
    assert_eq!(h.calls(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_http_gets_an_error_and_the_gateway_keeps_serving() {
    let h = start(Config {
        max_headers: 20,
        ..Config::default()
    })
    .await;
    for garbage in [
        &b"\x00\x01\x02 nonsense\r\n\r\n"[..],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nBad Header\r\n\r\n",
    ] {
        let mut tcp = tokio::net::TcpStream::connect(h.proxy).await.unwrap();
        tcp.write_all(garbage).await.unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 400"),
            "{:?}",
            String::from_utf8_lossy(&answer)
        );
    }
    let many: Vec<(String, String)> = (0..30)
        .map(|i| (format!("x-h{i}"), "v".to_owned()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut tcp = tokio::net::TcpStream::connect(h.proxy).await.unwrap();
    let mut head = String::from("POST /echo HTTP/1.1\r\nHost: x\r\n");
    for (n, v) in &many {
        let _ = write!(head, "{n}: {v}\r\n");
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );

    // A body the upstream cannot parse is its 400, stored and replayed like any 4xx.
    let bad = h.post("/orders", "j", "{not json").await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        h.post("/orders", "j", "{not json")
            .await
            .header("idempotent-replayed"),
        Some("true")
    );
    assert_eq!(
        h.post("/echo", "fine", "ok").await.status,
        201,
        "still serving"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn decisions_stream_as_server_sent_events_and_metrics() {
    let h = start(Config::default()).await;
    let req = Request::get(format!("http://{}/v1/events", h.admin))
        .body(Body::empty())
        .unwrap();
    let response = h.client.request(req).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    // The subscription exists once the response head is back.
    h.post("/echo", "ev", "x").await;
    h.post("/echo", "ev", "x").await;
    h.admin(
        "PUT",
        "/v1/faults",
        &[],
        r#"{"faults":{"delete":{"kind":"delay","latency_ms":3}}}"#,
    )
    .await;
    let mut text = String::new();
    while !text.contains("event: fault") {
        let frame = body.frame().await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let decisions: Vec<Value> = text
        .split("\n\n")
        .filter(|e| e.starts_with("event: decision"))
        .map(|e| serde_json::from_str(e.split_once("data: ").unwrap().1).unwrap())
        .collect();
    assert_eq!(decisions.len(), 2, "{text}");
    assert_eq!(
        (
            decisions[0]["outcome"].as_str(),
            decisions[0]["status"].as_u64()
        ),
        (Some("executed"), Some(201))
    );
    assert_eq!(
        (
            decisions[1]["outcome"].as_str(),
            decisions[1]["key"].as_str()
        ),
        (Some("replayed"), Some("anon/ev"))
    );
    let fault: Value = serde_json::from_str(
        text.split("event: fault\ndata: ")
            .nth(1)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            fault["op"].as_str(),
            fault["kind"].as_str(),
            fault["latency_ms"].as_u64()
        ),
        (Some("delete"), Some("delay"), Some(3))
    );

    let metrics = h.admin("GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("idem_outcomes_total{outcome=\"executed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_outcomes_total{outcome=\"replayed\"} 1"),
        "{text}"
    );
    let stats = h.admin("GET", "/v1/stats", &[], "").await.json();
    assert!(stats["store_latency_us"]["max"].as_u64().is_some());
    assert!(stats["pool"]["instantiated"].as_u64().unwrap() >= 1);
    assert!(stats["rates_per_s"]["executed"].as_f64().unwrap() > 0.0);
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let mut h = start(Config::default()).await;
    let in_flight = h.spawn_slow("g");
    h.arrivals.recv().await.unwrap();
    let _ = h.stop.take().unwrap().send(());
    let proxy = h.proxy;
    // New connections are refused once the listener is closed; wait for that state.
    while tokio::net::TcpStream::connect(proxy).await.is_ok() {
        tokio::task::yield_now().await;
    }
    h.upstream.go.add_permits(1);
    let Reply { status, body, .. } = in_flight.await.unwrap();
    assert_eq!((status, &body[..]), (200, &b"slow call 1"[..]));
    h.served.await.unwrap();
    let _ = &h.gateway;
}

/// Serves `app` on a port of its own; a function that POSTs a body to its
/// `/orders` with an idempotency key and returns the status, headers and body.
async fn serve_app(
    app: Router,
) -> impl Fn(&'static str, &'static str) -> futures::future::BoxFuture<'static, (u16, HeaderMap, Bytes)>
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    move |key, body| {
        let client = client.clone();
        Box::pin(async move {
            let req = Request::post(format!("http://{addr}/orders"))
                .header("idempotency-key", key)
                .body(Body::from(body))
                .unwrap();
            let (parts, body) = client.request(req).await.unwrap().into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts.status.as_u16(), parts.headers, body)
        })
    }
}

#[tokio::test]
async fn the_tower_layer_gives_an_axum_app_the_same_semantics() {
    use idem::server::IdempotencyLayer;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let store = idem::store::open("memory:").await.unwrap();
    let layer = IdempotencyLayer::new(Config::default(), store).unwrap();
    let app: Router = Router::new()
        .route(
            "/orders",
            post(move |body: String| async move {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    format!("order {body} charged, run {n}"),
                )
            }),
        )
        .layer(layer.clone());
    let post_order = serve_app(app).await;
    let post = async |key, body| {
        let (status, headers, body) = post_order(key, body).await;
        (status, body, headers.contains_key("idempotent-replayed"))
    };
    let first = post("o-7", "o-7").await;
    assert_eq!(first, (201, Bytes::from("order o-7 charged, run 1"), false));
    assert_eq!(
        post("o-7", "o-7").await,
        (201, Bytes::from("order o-7 charged, run 1"), true)
    );
    assert_eq!(post("o-7", "other").await.0, 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The layer's store is the gateway's stack: its faults fail it closed.
    layer
        .faults()
        .set_all(&idem::FaultRule::error("down"))
        .unwrap();
    assert_eq!(post("o-8", "o-8").await.0, 503);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_handler_that_panics_gets_a_500_problem_and_the_server_goes_on() {
    use idem::server::IdempotencyLayer;
    let store = idem::store::open("memory:").await.unwrap();
    let app: Router = Router::new()
        .route(
            "/orders",
            post(|body: String| async move {
                assert!(body != "boom", "the handler panicked on purpose");
                (StatusCode::CREATED, format!("order {body}"))
            }),
        )
        .layer(IdempotencyLayer::new(Config::default(), store).unwrap());
    let post = serve_app(app).await;
    let (_, headers, body) = post("p-1", "boom").await;
    assert_eq!(
        headers[axum::http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 500);
    assert!(
        problem["detail"].as_str().unwrap().contains("panicked"),
        "{problem}"
    );
    // The same server, even the same pooled connection, goes on serving.
    let (_, _, body) = post("p-2", "fine").await;
    assert_eq!(&body[..], b"order fine");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_request_does_not_strand_its_key() {
    let mut h = start(Config {
        in_flight: InFlight::Wait(Duration::from_secs(10)),
        ..Config::default()
    })
    .await;
    let gone = h.spawn_slow("d");
    h.arrivals.recv().await.unwrap();
    gone.abort();
    let _ = gone.await;
    h.upstream.go.add_permits(1);
    // The first request still completes and is stored: the retry gets its response.
    let retry = h
        .send("POST", "/slow", &[("idempotency-key", "d")], "")
        .await;
    assert_eq!(
        (
            retry.status,
            &retry.body[..],
            retry.header("idempotent-replayed")
        ),
        (200, &b"slow call 1"[..], Some("true"))
    );
    assert_eq!(h.calls(), 1);
    h.shutdown().await;
}
