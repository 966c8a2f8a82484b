//! The load generator the HTTP benches share: `connections` workers, each
//! sending one request after another for a fixed time, fresh keys, replays
//! of keys placed beforehand, or no key; successes timed, failures counted.

// Each bench that includes this module uses part of it.
#![allow(dead_code)]

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Keys placed before a replay run, then replayed round robin.
const REPLAY_KEYS: u64 = 256;

/// One measurement.
pub struct Figures {
    pub name: String,
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latencies_us: Vec<u32>,
}

#[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)] // counts and indexes far below 2^52
impl Figures {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    pub fn percentile(&self, q: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us[((self.latencies_us.len() - 1) as f64 * q).round() as usize]
    }
}

#[derive(Clone, Copy)]
pub enum Keys {
    /// A fresh key (and order) per request: every request executes.
    New,
    /// Keys placed beforehand: every request is a replay.
    Replay,
    /// No key: a plain request (for the direct baseline).
    None,
}

pub struct Target {
    /// The servers to spread requests over, round robin by request number.
    pub addrs: Vec<SocketAddr>,
    pub path: &'static str,
    pub keys: Keys,
}

impl Target {
    pub fn one(addr: SocketAddr, path: &'static str, keys: Keys) -> Target {
        Target {
            addrs: vec![addr],
            path,
            keys,
        }
    }
}

pub async fn measure(
    name: &str,
    target: &Target,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<Figures> {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http();
    let run = fastrand::u32(..);
    let seq = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    if matches!(target.keys, Keys::Replay) {
        for i in 0..REPLAY_KEYS {
            let (status, _) = send(&client, target, &format!("r-{run:08x}-{i}")).await?;
            if status != 201 {
                bail!("{name}: placing replay key {i} got {status}");
            }
        }
    }
    // Warm up connections and the guard's instance pool.
    for _ in 0..connections.min(64) {
        let _ = send(
            &client,
            target,
            &format!("w-{run:08x}-{}", seq.fetch_add(1, Ordering::Relaxed)),
        )
        .await?;
    }
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (client, seq, errors) = (client.clone(), seq.clone(), errors.clone());
        let target = Target {
            addrs: target.addrs.clone(),
            path: target.path,
            keys: target.keys,
        };
        workers.spawn(async move {
            let mut latencies = Vec::with_capacity(16 * 1024);
            while Instant::now() < deadline {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let key = match target.keys {
                    Keys::Replay => format!("r-{run:08x}-{}", n % REPLAY_KEYS),
                    Keys::New | Keys::None => format!("n-{run:08x}-{n}"),
                };
                let t = Instant::now();
                match send_to(&client, &target, n, &key).await {
                    Ok((200..=299, _)) => {
                        latencies.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies
        });
    }
    let mut latencies_us = Vec::new();
    while let Some(done) = workers.join_next().await {
        latencies_us.extend(done?);
    }
    let elapsed = started.elapsed();
    latencies_us.sort_unstable();
    Ok(Figures {
        name: name.to_owned(),
        requests: latencies_us.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        elapsed,
        latencies_us,
    })
}

/// One request to the first server of `target`.
pub async fn send(
    client: &Client<HttpConnector, Body>,
    target: &Target,
    key: &str,
) -> anyhow::Result<(u16, bytes::Bytes)> {
    send_to(client, target, 0, key).await
}

/// One request, the `n`th: to server `n` modulo their number.
async fn send_to(
    client: &Client<HttpConnector, Body>,
    target: &Target,
    n: u64,
    key: &str,
) -> anyhow::Result<(u16, bytes::Bytes)> {
    #[allow(clippy::cast_possible_truncation)] // a remainder below the number of servers
    let addr = target.addrs[(n % target.addrs.len() as u64) as usize];
    let mut req = Request::post(format!("http://{addr}{}", target.path))
        .header("content-type", "application/json");
    if !matches!(target.keys, Keys::None) {
        req = req.header("idempotency-key", key);
    }
    let body = serde_json::json!({"order": key, "sku": "A", "qty": 1, "cents": 100}).to_string();
    let response = client
        .request(req.body(Body::from(body))?)
        .await
        .context("request")?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
