//! The gateway's footprint over time and under hostile clients, measured in
//! one run (`cargo bench -p idem --bench footprint`):
//!
//! - memory store, RSS over three rounds of 100,000 fresh keys whose 2 s
//!   retention runs out and which the purge (every 1 s) frees between rounds:
//!   the third round's peak must be within 10 % of the first's;
//! - a normal keyed request's latency on its own, then beside 1,000
//!   connections that sent a keyed POST head with `Content-Length: 100000`
//!   and stopped.
//!
//! The upstream answers a fixed body and keeps nothing, so the only memory
//! that grows with keys is the gateway's.

#![allow(clippy::pedantic)]

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::server::{Config, Gateway};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

const ROUNDS: u64 = 3;
const KEYS_PER_ROUND: u64 = 100_000;
const CONNECTIONS: u64 = 32;
const SLOW_CONNECTIONS: usize = 1_000;

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let _ = rlimit::increase_nofile_limit(u64::MAX);
        rss_over_rounds().await;
        slow_clients().await;
    });
}

/// The resident set of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// An upstream that answers every order with the same small body.
async fn upstream() -> SocketAddr {
    let app = Router::new().route(
        "/orders",
        routing::post(|| async { (axum::http::StatusCode::CREATED, r#"{"status":"paid"}"#) }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A gateway over a fresh memory store, served on port 0.
async fn gateway(config: Config) -> (SocketAddr, Gateway) {
    let up = upstream().await;
    let store = idem::store::open("memory:").await.unwrap();
    let gateway = Gateway::builder(config, store, &format!("http://{up}"))
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
    (addr, gateway)
}

async fn post(client: &Client<HttpConnector, Body>, addr: SocketAddr, key: &str) -> u16 {
    let req = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(format!(r#"{{"order":"{key}"}}"#)))
        .unwrap();
    let response = client.request(req).await.unwrap();
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

async fn rss_over_rounds() {
    let config = Config {
        lease: Duration::from_secs(1),
        retention: Duration::from_secs(2),
        upstream_timeout: Duration::from_millis(500),
        purge_interval: Duration::from_secs(1),
        ..Config::default()
    };
    let (addr, gateway) = gateway(config).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    println!(
        "memory store: {ROUNDS} rounds of {KEYS_PER_ROUND} keys, retention 2 s, purge every 1 s"
    );
    println!("| round | keys sent | RSS after the round | RSS after the purge | purged so far |");
    println!("|---|---|---|---|---|");
    let mut peaks = Vec::new();
    for round in 0..ROUNDS {
        let next = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (client, next) = (client.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= KEYS_PER_ROUND {
                            return;
                        }
                        let status = post(&client, addr, &format!("r{round}-k{i}")).await;
                        assert_eq!(status, 201);
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        let peak = rss_kib();
        peaks.push(peak);
        // Every key of the round expires 2 s after it was written; wait for the purge.
        let want = (round + 1) * KEYS_PER_ROUND;
        let give_up = Instant::now() + Duration::from_secs(60);
        while gateway.guard().purge_stats().unwrap().purged < want && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let purged = gateway.guard().purge_stats().unwrap().purged;
        println!(
            "| {} | {KEYS_PER_ROUND} | {:.1} MiB | {:.1} MiB | {purged} |",
            round + 1,
            peak as f64 / 1024.0,
            rss_kib() as f64 / 1024.0
        );
    }
    let (first, last) = (peaks[0], peaks[peaks.len() - 1]);
    println!(
        "third round's peak / first round's: {:.1} % (target: within 10 %)\n",
        last as f64 / first as f64 * 100.0
    );
}

async fn slow_clients() {
    let (addr, _gateway) = gateway(Config::default()).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let latency = |label: &'static str| {
        let client = client.clone();
        async move {
            let mut took = Vec::new();
            for i in 0..50 {
                let started = Instant::now();
                let status = post(&client, addr, &format!("{label}-{i}")).await;
                took.push(started.elapsed());
                assert_eq!(status, 201, "{label}");
            }
            took.sort();
            (took[took.len() / 2], took[took.len() - 1])
        }
    };
    let (alone_p50, alone_max) = latency("alone").await;
    let mut slow = Vec::with_capacity(SLOW_CONNECTIONS);
    for i in 0..SLOW_CONNECTIONS {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-{i}\r\nContent-Length: 100000\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        slow.push(stream);
    }
    let (beside_p50, beside_max) = latency("beside").await;
    println!("a normal keyed request, 50 in a row (new keys):");
    println!("| | p50 | max |");
    println!("|---|---|---|");
    println!("| alone | {alone_p50:?} | {alone_max:?} |");
    println!(
        "| beside {SLOW_CONNECTIONS} slow-body connections | {beside_p50:?} | {beside_max:?} |"
    );
    drop(slow);
}
