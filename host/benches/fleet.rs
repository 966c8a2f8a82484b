//! Many gateways, one store: 1, 2 and 4 `idem serve` processes over one
//! shared store (by default the loopback Redis Cluster of
//! `scripts/services.sh`), each with `--connections` clients of its own, new
//! keys spread round robin over the gateways; the throughput curve.
//!
//! `cargo bench -p idem --bench fleet -- --store "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002" --gateways 1,2,4`
//!
//! The gateways are real processes (the `idem` binary cargo built beside
//! this bench), so each has its own runtime, component pool and store
//! connections, as on separate hosts; the ledger they forward to and the
//! load generator run in this process. Every process shares this machine's
//! cores: the curve is only as steep as the cores allow, so the report
//! names their number.

#![allow(clippy::pedantic)]

mod load;

use anyhow::Context;
use idem::testing::Ledger;
use idem_harness::{Proc, spawn_bound};
use load::{Figures, Keys, Target, measure};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(clap::Parser)]
struct Args {
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// The store every gateway shares.
    #[arg(
        long,
        env = "IDEM_TEST_REDIS_CLUSTER_URL",
        default_value = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"
    )]
    store: String,
    /// The fleet sizes to measure, comma-separated.
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    gateways: Vec<usize>,
    /// Concurrent connections per gateway.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// How long each throughput measurement runs.
    #[arg(long, default_value = "5s", value_parser = idem::server::parse_duration)]
    duration: Duration,
    /// Also write the results as Markdown here.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
}

/// `idem serve` on `store` in front of `upstream`, on a port of its own
/// choosing (port 0), once it listens; the process is killed on drop.
fn spawn_gateway(store: &str, upstream: SocketAddr) -> (SocketAddr, Proc) {
    let mut idem = Command::new(env!("CARGO_BIN_EXE_idem"));
    idem.args(["serve", "--store", store, "--max-concurrent", "4096"])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .args(["--upstream", &format!("http://{upstream}")])
        // A line per request at info would be re-printed here, thousands a
        // second; the gateway bench measures what logging costs.
        .env("RUST_LOG", "warn");
    let (gateway, [port]) = spawn_bound(idem, ["idem serve: http://"]);
    (([127, 0, 0, 1], port).into(), gateway)
}

/// The machine's CPU time so far from `/proc/stat`: (busy, total) in ticks;
/// `None` off Linux.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0);
    Some((total - idle, total))
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (stop_tx, mut stop) = watch::channel(false);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let ledger_addr = listener.local_addr()?;
    let ledger = tokio::spawn(idem::testing::run(
        Ledger::new(i64::MAX / 2, Duration::ZERO),
        listener,
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ));

    let mut rows = Vec::new();
    for &n in &args.gateways {
        let mut addrs = Vec::new();
        let mut fleet = Vec::new();
        for _ in 0..n {
            let (addr, gateway) = spawn_gateway(&args.store, ledger_addr);
            addrs.push(addr);
            fleet.push(gateway);
        }
        let name = format!("{n} gateway{}", if n == 1 { "" } else { "s" });
        let target = Target {
            addrs,
            path: "/orders",
            keys: Keys::New,
        };
        let before = cpu_ticks();
        let figures = measure(&name, &target, args.connections * n, args.duration).await?;
        // How busy the machine's cores were: at 100 % the curve has met the
        // cores, not the store or the gateways.
        let busy = match (before, cpu_ticks()) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                (b1 - b0) as f64 / (t1 - t0) as f64 * 100.0
            }
            _ => f64::NAN,
        };
        eprintln!(
            "{name:<12} c={:<4} {:>8.0} req/s p50 {:>6} µs p99 {:>7} µs errors {} cpu {busy:.0}%",
            args.connections * n,
            figures.rps(),
            figures.percentile(0.5),
            figures.percentile(0.99),
            figures.errors
        );
        rows.push((n, figures, busy));
        drop(fleet);
    }
    let _ = stop_tx.send(true);
    let _ = ledger.await;

    let report = report(&rows, &args);
    println!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}

fn report(rows: &[(usize, Figures, f64)], args: &Args) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| gateways | connections | new keys req/s | × one gateway | p50 µs | p99 µs | errors | CPU busy |"
    );
    let _ = writeln!(text, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    let one = rows.first().map(|(_, f, _)| f.rps()).unwrap_or(0.0);
    for (n, f, busy) in rows {
        let _ = writeln!(
            text,
            "| {n} | {} | {:.0} | {:.2} | {} | {} | {} | {busy:.0} % |",
            args.connections * n,
            f.rps(),
            f.rps() / one,
            f.percentile(0.5),
            f.percentile(0.99),
            f.errors
        );
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        text,
        "\nStore `{}`; {} s per row; fresh keys (every request claims, forwards and completes); \
         every gateway, the store's servers, the ledger and the load generator share this machine's {cores} cores \
         (CPU busy: all of them, over the row, from /proc/stat).",
        args.store,
        args.duration.as_secs_f64()
    );
    text
}
