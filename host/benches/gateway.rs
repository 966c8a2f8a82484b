//! What the gateway costs, measured over loopback in one run — direct to
//! the ledger, then through the gateway on each store, for new keys and for
//! replays: requests per second and latency percentiles.
//!
//! `cargo bench -p idem --bench gateway -- --duration 3s --connections 32 --stores memory:,sqlite:`

#![allow(clippy::pedantic)]

mod load;

use anyhow::Context;
use axum::Router;
use axum::routing::get;
use idem::server::{Config, Gateway};
use idem::testing::Ledger;
use load::{Figures, Keys, Target, measure};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

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
    /// A process whose CPU time to count per request beside the bench's own
    /// (e.g. the Redis server's pid, `pgrep -f 'redis-server.*:6379'`).
    #[arg(long, value_name = "PID")]
    server_pid: Option<u32>,
    /// Also write the results as Markdown here.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
    /// Measure each gateway row twice, side by side: with its log off, and
    /// with `idem serve`'s log lines at info (one per request) written to
    /// this file (e.g. /tmp/gateway-bench.log; /dev/null still formats and
    /// writes each line).
    #[arg(long, value_name = "FILE")]
    log_file: Option<std::path::PathBuf>,
}

/// Switches the gateways' log between off and info (a reloadable filter in
/// front of `idem serve`'s text lines off a terminal, written to
/// `--log-file`).
struct Logs(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
);

impl Logs {
    fn install(path: &std::path::Path) -> anyhow::Result<Logs> {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let file =
            std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
        let (filter, handle) =
            tracing_subscriber::reload::Layer::new(tracing_subscriber::EnvFilter::new("off"));
        tracing_subscriber::registry()
            .with(filter)
            .with(idem::cli::log_lines(
                idem::cli::LogFormat::Text,
                idem::cli::Batched::new(file),
            ))
            .try_init()?;
        Ok(Logs(handle))
    }

    fn set(&self, level: &str) {
        let _ = self.0.reload(tracing_subscriber::EnvFilter::new(level));
    }
}

#[allow(clippy::too_many_lines)] // one measured run, top to bottom
fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let logs = args.log_file.as_deref().map(Logs::install).transpose()?;
    let (stop_tx, stop) = watch::channel(false);
    let ledger = Ledger::new(i64::MAX / 2, Duration::ZERO);
    let ledger_listener = TcpListener::bind("127.0.0.1:0").await?;
    let ledger_addr = ledger_listener.local_addr()?;
    tokio::spawn(idem::testing::run(
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

    let mut rows: Vec<(Figures, Figures, Cpu)> = Vec::new();
    let server_pid = args.server_pid.map(|pid| pid.to_string());
    let mut measure_both = async |name: &str, target: Target| -> anyhow::Result<()> {
        let single = measure(name, &target, 1, args.duration.min(Duration::from_secs(2))).await?;
        let before = Ticks::now(server_pid.as_deref());
        let many = measure(name, &target, args.connections, args.duration).await?;
        let cpu = Ticks::now(server_pid.as_deref()).per_request_since(before, many.requests);
        eprintln!(
            "{name:<32} c=1 p50 {:>5} µs p99 {:>5} µs | c={} {:>8.0} req/s p50 {:>5} µs p99 {:>6} µs errors {} | CPU µs/req bench {:.0} user + {:.0} system, server {:.0}",
            single.percentile(0.5),
            single.percentile(0.99),
            args.connections,
            many.rps(),
            many.percentile(0.5),
            many.percentile(0.99),
            many.errors,
            cpu.user_us,
            cpu.system_us,
            cpu.server_us,
        );
        rows.push((single, many, cpu));
        Ok(())
    };
    measure_both(
        "loopback round trip (empty HTTP)",
        Target::one(ping_addr, "/ping", Keys::None),
    )
    .await?;
    measure_both(
        "direct to the ledger",
        Target::one(ledger_addr, "/orders", Keys::None),
    )
    .await?;

    // The proxy alone: a gateway forwarding keyless requests unguarded. Every
    // gateway figure below is this hop plus the guard, so this row is the
    // ceiling any guarded figure can reach in this setup.
    let mut gateways = Vec::new();
    let store = idem::store::open("memory:").await?;
    let (addr, gateway) = start_gateway(store, ledger_addr, stop.clone()).await?;
    gateways.push(gateway);
    measure_both(PROXY_ALONE, Target::one(addr, "/orders", Keys::None)).await?;
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
        for (what, keys) in [("new keys", Keys::New), ("replays", Keys::Replay)] {
            // Side by side: its log off, then at info (with --log-file).
            let levels: &[(&str, &str)] = if logs.is_some() {
                &[("off", ", log off"), ("info", ", log at info")]
            } else {
                &[("off", "")]
            };
            for (level, suffix) in levels {
                if let Some(logs) = &logs {
                    logs.set(level);
                }
                measure_both(
                    &format!("gateway ({name}), {what}{suffix}"),
                    Target::one(addr, "/orders", keys),
                )
                .await?;
            }
        }
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

fn report(rows: &[(Figures, Figures, Cpu)], connections: usize, duration: Duration) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| scenario | c=1 p50 µs | c=1 p99 µs | c={connections} req/s | c={connections} p50 µs | c={connections} p99 µs | errors | CPU µs/req, bench user | bench system | server |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (single, many, cpu) in rows {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            single.name,
            single.percentile(0.5),
            single.percentile(0.99),
            many.rps(),
            many.percentile(0.5),
            many.percentile(0.99),
            single.errors + many.errors,
            cpu.user_us,
            cpu.system_us,
            cpu.server_us,
        );
    }
    let find = |prefix: &str| {
        rows.iter()
            .find(|(s, _, _)| s.name.starts_with(prefix))
            .map(|(s, m, _)| (s, m))
    };
    if let (Some((rtt, _)), Some((direct, direct_many))) = (find("loopback"), find("direct")) {
        let _ = writeln!(
            text,
            "\nTargets (p50 at c=1: gateway − direct ≤ one loopback round trip + 50 µs; throughput ≥ 50% of direct):\n"
        );
        let proxy = find(PROXY_ALONE);
        for (single, many, _) in rows
            .iter()
            .filter(|(s, _, _)| s.name.starts_with("gateway"))
        {
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
        "\n{} s per throughput run, {connections} connections, loopback, one process. CPU µs/req: \
         the CPU time (user, system) the bench process (load, gateway and ledger together) and the \
         `--server-pid` process spent during the c={connections} run, over the requests answered.",
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

/// CPU time so far, in clock ticks: this process's user and system time
/// and the `--server-pid` process's total (0 without it), from
/// `/proc/PID/stat`.
#[derive(Clone, Copy, Default)]
struct Ticks {
    user: u64,
    system: u64,
    server: u64,
}

/// CPU time per request answered, in µs, between two [`Ticks`].
#[derive(Default)]
struct Cpu {
    user_us: f64,
    system_us: f64,
    server_us: f64,
}

impl Ticks {
    fn now(server: Option<&str>) -> Ticks {
        let (user, system) = cpu_ticks("self").unwrap_or_default();
        let (server_user, server_system) = server.and_then(cpu_ticks).unwrap_or_default();
        Ticks {
            user,
            system,
            server: server_user + server_system,
        }
    }

    fn per_request_since(self, before: Ticks, requests: u64) -> Cpu {
        // USER_HZ: 100 ticks a second on Linux.
        let us = |now: u64, then: u64| {
            now.saturating_sub(then) as f64 * 10_000.0 / requests.max(1) as f64
        };
        Cpu {
            user_us: us(self.user, before.user),
            system_us: us(self.system, before.system),
            server_us: us(self.server, before.server),
        }
    }
}

/// (utime, stime) of a process, in clock ticks.
fn cpu_ticks(pid: &str) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, inside parentheses).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// The row of the gateway forwarding keyless requests, unguarded.
const PROXY_ALONE: &str = "proxy alone (keyless, unguarded)";

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
