//! The gateway end to end over real HTTP on port 0: a test upstream that
//! counts executions, the proxy in front of it, the admin API beside it.
//!
//! The harness is here; the tests are by topic in the files beside it.

mod admin;
mod exactly_once;
mod http;
mod upstream;

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
use idem::server::{AdminListener, Config, Gateway, InFlight, Profile, StorePolicy};
use idem::testing::{Books, Ledger};
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
pub(crate) struct Upstream {
    ledger: Ledger,
    calls: Arc<AtomicUsize>,
    /// `/slow` reports its arrival here, then waits for a permit.
    arrived: mpsc::UnboundedSender<()>,
    pub(crate) go: Arc<Semaphore>,
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

/// A gateway on the memory store in front of [`Upstream`], with its admin
/// API; the admin API's contract test (`admin_contract.rs`) uses it too.
pub(crate) struct Harness {
    pub(crate) proxy: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) upstream: Upstream,
    pub(crate) arrivals: mpsc::UnboundedReceiver<()>,
    gateway: Gateway,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    pub(crate) client: Client<HttpConnector, Body>,
}

pub(crate) async fn start(config: Config) -> Harness {
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

/// `gateway` on a port of its own, proxy only, until the test ends.
async fn serve(gateway: Gateway) -> SocketAddr {
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(idem::server::run(
        gateway,
        proxy,
        None,
        std::future::pending(),
    ));
    addr
}

/// A gateway on the memory store in front of `upstream`, [`serve`]d; and
/// its port.
async fn serve_memory(upstream: SocketAddr) -> (Gateway, SocketAddr) {
    let store = idem::store::open("memory:").await.unwrap();
    let gateway = Gateway::builder(Config::default(), store, &format!("http://{upstream}"))
        .build()
        .unwrap();
    let addr = serve(gateway.clone()).await;
    (gateway, addr)
}

/// `POST http://{addr}{path}` with the idempotency key `key` and no body.
async fn post_empty(
    client: &Client<HttpConnector, Body>,
    addr: SocketAddr,
    path: &str,
    key: &str,
) -> Reply {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap();
    Reply::read(client.request(req).await.unwrap()).await
}

#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    async fn read(response: axum::http::Response<hyper::body::Incoming>) -> Reply {
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    /// A problem's `detail`.
    fn detail(&self) -> String {
        self.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
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

    pub(crate) async fn admin(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
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
        Reply::read(response).await
    }

    async fn admin_get(&self, path: &str) -> Reply {
        self.admin("GET", path, &[], "").await
    }

    /// `PUT /v1/faults` with the JSON `body`.
    async fn put_faults(&self, body: &str) -> Reply {
        self.admin("PUT", "/v1/faults", &[], body).await
    }

    /// `POST /slow` with `key` on a task of its own, once it has arrived
    /// upstream: it waits there for a permit on `upstream.go`.
    pub(crate) async fn slow_held(&mut self, key: &str) -> tokio::task::JoinHandle<Reply> {
        let (client, proxy, key) = (self.client.clone(), self.proxy, key.to_owned());
        let reply = tokio::spawn(async move { post_empty(&client, proxy, "/slow", &key).await });
        self.arrivals.recv().await.unwrap();
        reply
    }

    /// `POST /slow` with `key` and no body, answered.
    async fn post_slow(&self, key: &str) -> Reply {
        self.send("POST", "/slow", &[("idempotency-key", key)], "")
            .await
    }

    pub(crate) async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
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

    pub(crate) async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.served.await.unwrap();
    }
}

fn order(id: &str, qty: i64) -> String {
    json!({"order": id, "sku": "A", "qty": qty, "cents": 1000}).to_string()
}

/// `reply` replays a response of `status` with exactly `body`, marked so.
fn assert_replayed(reply: &Reply, status: u16, body: &[u8]) {
    assert_eq!(
        (
            reply.status,
            &reply.body[..],
            reply.header("idempotent-replayed")
        ),
        (status, body, Some("true")),
        "{reply:?}"
    );
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
