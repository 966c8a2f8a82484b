//! What the gateway costs, measured over loopback in one run — direct to
//! the ledger, then through the gateway on each store, for new keys and for
//! replays: requests per second and latency percentiles.
//!
//! `cargo bench -p idem --bench gateway -- --duration 3s --connections 32 --stores memory:,sqlite:`

#![allow(clippy::pedantic)]

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::ledger::Ledger;
use idem::server::{Config, Gateway};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Keys placed before a replay run, then replayed round robin.
const REPLAY_KEYS: u64 = 256;

#[derive(clap::Parser)]
struct Args {
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// How long each throughput measurement runs.
    #[arg(long, default_value = "3s", value_parser = idem::server::parse_duration)]
    duration: Duration,
    /// Concurrent connections for the throughput measurements.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Stores to measure through the gateway, comma-separated.
    #[arg(long, default_value = "memory:,sqlite:", value_delimiter = ',')]
    stores: Vec<String>,
    /// Also write the results as Markdown here.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
}

/// One measurement.
struct Figures {
    name: String,
    requests: u64,
    errors: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

#[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)] // counts and indexes far below 2^52
impl Figures {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    fn percentile(&self, q: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us[((self.latencies_us.len() - 1) as f64 * q).round() as usize]
    }
}

#[derive(Clone, Copy)]
enum Keys {
    /// A fresh key (and order) per request: every request executes.
    New,
    /// Keys placed beforehand: every request is a replay.
    Replay,
    /// No key: a plain request (for the direct baseline).
    None,
}

struct Target {
    addr: SocketAddr,
    path: &'static str,
    keys: Keys,
}

async fn measure(
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
            addr: target.addr,
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
                match send(&client, &target, &key).await {
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

async fn send(
    client: &Client<HttpConnector, Body>,
    target: &Target,
    key: &str,
) -> anyhow::Result<(u16, bytes::Bytes)> {
    let mut req = Request::post(format!("http://{}{}", target.addr, target.path))
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

#[allow(clippy::too_many_lines)] // one measured run, top to bottom
fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (stop_tx, stop) = watch::channel(false);
    let ledger = Ledger::new(i64::MAX / 2, Duration::ZERO);
    let ledger_listener = TcpListener::bind("127.0.0.1:0").await?;
    let ledger_addr = ledger_listener.local_addr()?;
    tokio::spawn(idem::ledger::run(
        ledger,
        ledger_listener,
        stopped(stop.clone()),
    ));
    // The loopback round trip itself: an HTTP server that does nothing.
    let ping_listener = TcpListener::bind("127.0.0.1:0").await?;
    let ping_addr = ping_listener.local_addr()?;
    let ping = Router::new().route("/ping", get(|| async { "" }).post(|| async { "" }));
    let ping_stop = stopped(stop.clone());
    tokio::spawn(async move {
        axum::serve(ping_listener, ping)
            .with_graceful_shutdown(ping_stop)
            .await
    });

    let mut rows: Vec<(Figures, Figures)> = Vec::new();
    let mut measure_both = async |name: &str, target: Target| -> anyhow::Result<()> {
        let single = measure(name, &target, 1, args.duration.min(Duration::from_secs(2))).await?;
        let many = measure(name, &target, args.connections, args.duration).await?;
        eprintln!(
            "{name:<32} c=1 p50 {:>5} µs p99 {:>5} µs | c={} {:>8.0} req/s p50 {:>5} µs p99 {:>6} µs errors {}",
            single.percentile(0.5),
            single.percentile(0.99),
            args.connections,
            many.rps(),
            many.percentile(0.5),
            many.percentile(0.99),
            many.errors
        );
        rows.push((single, many));
        Ok(())
    };
    measure_both(
        "loopback round trip (empty HTTP)",
        Target {
            addr: ping_addr,
            path: "/ping",
            keys: Keys::None,
        },
    )
    .await?;
    measure_both(
        "direct to the ledger",
        Target {
            addr: ledger_addr,
            path: "/orders",
            keys: Keys::None,
        },
    )
    .await?;

    // The proxy alone: a gateway forwarding keyless requests unguarded. Every
    // gateway figure below is this hop plus the guard, so this row is the
    // ceiling any guarded figure can reach in this setup.
    let mut gateways = Vec::new();
    let store = idem::store::open("memory:").await?;
    let (addr, gateway) = start_gateway(store, ledger_addr, stop.clone()).await?;
    gateways.push(gateway);
    measure_both(
        PROXY_ALONE,
        Target {
            addr,
            path: "/orders",
            keys: Keys::None,
        },
    )
    .await?;
    for url in &args.stores {
        let (url, cleanup) = if url == "sqlite:" {
            let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            (
                format!("sqlite:{}", dir.join("bench.db").display()),
                Some(dir),
            )
        } else {
            (url.clone(), None)
        };
        let store = match idem::store::open(&url).await {
            Ok(store) => store,
            Err(e) => {
                eprintln!("skipping {url}: {e}");
                continue;
            }
        };
        let name = store.name();
        let (addr, gateway) = start_gateway(store, ledger_addr, stop.clone()).await?;
        gateways.push(gateway);
        measure_both(
            &format!("gateway ({name}), new keys"),
            Target {
                addr,
                path: "/orders",
                keys: Keys::New,
            },
        )
        .await?;
        measure_both(
            &format!("gateway ({name}), replays"),
            Target {
                addr,
                path: "/orders",
                keys: Keys::Replay,
            },
        )
        .await?;
        if let Some(dir) = cleanup {
            gateways.push(tokio::spawn(async move {
                let _ = std::fs::remove_dir_all(dir);
            }));
        }
    }
    let _ = stop_tx.send(true);
    for g in gateways {
        let _ = g.await;
    }

    let report = report(&rows, args.connections, args.duration);
    println!("{report}");
    if let Some(out) = args.out {
        std::fs::write(&out, &report).with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}

fn report(rows: &[(Figures, Figures)], connections: usize, duration: Duration) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| scenario | c=1 p50 µs | c=1 p99 µs | c={connections} req/s | c={connections} p50 µs | c={connections} p99 µs | errors |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|---:|---:|");
    for (single, many) in rows {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {:.0} | {} | {} | {} |",
            single.name,
            single.percentile(0.5),
            single.percentile(0.99),
            many.rps(),
            many.percentile(0.5),
            many.percentile(0.99),
            single.errors + many.errors
        );
    }
    let find = |prefix: &str| rows.iter().find(|(s, _)| s.name.starts_with(prefix));
    if let (Some((rtt, _)), Some((direct, direct_many))) = (find("loopback"), find("direct")) {
        let _ = writeln!(
            text,
            "\nTargets (p50 at c=1: gateway − direct ≤ one loopback round trip + 50 µs; throughput ≥ 50% of direct):\n"
        );
        let proxy = find(PROXY_ALONE);
        for (single, many) in rows.iter().filter(|(s, _)| s.name.starts_with("gateway")) {
            let added = i64::from(single.percentile(0.5)) - i64::from(direct.percentile(0.5));
            let budget = i64::from(rtt.percentile(0.5)) + 50;
            let share = many.rps() / direct_many.rps() * 100.0;
            let _ = write!(
                text,
                "- {}: adds {added} µs at p50 (budget {budget} µs: {}); {share:.0}% of direct throughput ({})",
                single.name,
                if added <= budget { "met" } else { "MISSED" },
                if share >= 50.0 { "met" } else { "MISSED" }
            );
            if let Some((_, proxy_many)) = proxy {
                let _ = write!(
                    text,
                    "; {:.0}% of the proxy alone",
                    many.rps() / proxy_many.rps() * 100.0
                );
            }
            let _ = writeln!(text);
        }
        if let Some((single, many)) = proxy {
            let _ = writeln!(
                text,
                "- for scale, the {}: adds {} µs at p50, {:.0}% of direct throughput: the most any gateway row can reach here",
                single.name,
                i64::from(single.percentile(0.5)) - i64::from(direct.percentile(0.5)),
                many.rps() / direct_many.rps() * 100.0
            );
        }
    }
    let _ = writeln!(
        text,
        "\n{} s per throughput run, {connections} connections, loopback, one process.",
        duration.as_secs_f64()
    );
    text
}

/// A gateway on `store` in front of the ledger, on a port of its own, until `stop`.
async fn start_gateway(
    store: Arc<dyn idem::Store>,
    ledger_addr: SocketAddr,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let gateway = Gateway::builder(
        Config {
            max_concurrent: 4096,
            ..Config::default()
        },
        store,
        &format!("http://{ledger_addr}"),
    )
    .build()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let serving = tokio::spawn(idem::server::run(gateway, listener, None, stopped(stop)));
    Ok((addr, serving))
}

/// The row of the gateway forwarding keyless requests, unguarded.
const PROXY_ALONE: &str = "proxy alone (keyless, unguarded)";

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
