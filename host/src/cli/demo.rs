//! `idem demo`: the ledger, the gateway in front of it and a traffic
//! generator that misbehaves the way real clients do — retries after lost
//! responses, duplicates, concurrent repeats, keys reused for other
//! payloads — while the store fails for a few seconds. At the end the
//! ledger is checked: every order executed exactly once.

use crate::ledger::{Books, Ledger};
use crate::server::{AdminListener, Config, Gateway};
use crate::store::{FaultRule, Op};
use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

#[derive(clap::Args)]
pub struct Args {
    /// The store, as for `idem serve` [default: sqlite: in a temporary directory].
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Orders to place.
    #[arg(long, default_value_t = 600)]
    orders: usize,
    /// How long to send orders for; the run ends soon after.
    #[arg(long, default_value = "10s", value_parser = crate::server::parse_duration)]
    duration: Duration,
    /// Where the admin API listens, for an operator console to attach.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    admin_listen: String,
    /// The admin API's bearer token (required off loopback).
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Keep serving after the check, until Ctrl-C, so a console can look around.
    #[arg(long)]
    linger: bool,
    /// Never open the operator console, even in a terminal.
    #[arg(long)]
    headless: bool,
}

/// What clients saw, by kind of answer.
#[derive(Default)]
struct Seen {
    sent: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    conflict: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
    orders_done: AtomicU64,
}

impl Seen {
    /// `sent=600    executed=600   …`: each count padded to a fixed width,
    /// so the line printed every second keeps its columns.
    fn line(&self) -> String {
        let counts = [
            ("sent", 6, &self.sent),
            ("executed", 5, &self.executed),
            ("replayed", 5, &self.replayed),
            ("409_in_flight", 4, &self.in_flight),
            ("422_conflict", 4, &self.conflict),
            ("503_store_down", 4, &self.unavailable),
            ("other", 3, &self.other),
        ];
        let fields: Vec<String> = counts
            .iter()
            .map(|(name, width, count)| {
                let count = count.load(Ordering::Relaxed);
                format!("{name}={count:<width$}")
            })
            .collect();
        fields.join(" ")
    }
}

/// What the clients' counts mean, printed under them: they count answers
/// as clients saw them, so they differ from the ledger's counts.
const SEEN_LEGEND: &str = "  (what clients saw, one count per answer: executed = a first 201;
   replayed = the stored 201 again; 409/422/503 as told. An impatient client
   gives up on its first try after 1 ms; the gateway runs it anyway and the
   retry gets the stored response, so that order ran without its client
   seeing a first 201: clients' executed is below the ledger's executions,
   which count what ran. The time above is when the last order was answered,
   not when the console was closed.)";

/// How a client treats one order.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Sends once (retrying 409 and 503 as told).
    Once,
    /// Sends, loses the response, sends again: the repeat is a replay.
    LostResponse,
    /// Four copies at once, as a double-clicking user or an eager retry loop.
    Concurrent,
    /// Reuses the key for another payload: 422, nothing runs.
    ReusedKey,
    /// Gives up on the first try after 1 ms (the request keeps going) and retries.
    Impatient,
}

const BEHAVIOURS: [Behaviour; 5] = [
    Behaviour::Once,
    Behaviour::LostResponse,
    Behaviour::Concurrent,
    Behaviour::ReusedKey,
    Behaviour::Impatient,
];

#[derive(Clone)]
struct Shopper {
    http: Client<HttpConnector, Body>,
    gateway: SocketAddr,
    seen: Arc<Seen>,
}

struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Duration,
}

impl Shopper {
    async fn post(&self, key: &str, body: &str) -> anyhow::Result<Answer> {
        self.seen.sent.fetch_add(1, Ordering::Relaxed);
        let req = Request::post(format!("http://{}/orders", self.gateway))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))?;
        let response = self
            .http
            .request(req)
            .await
            .context("the gateway did not answer")?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .map_or(Duration::from_millis(200), Duration::from_secs);
        let _ = response.into_body().collect().await;
        let counter = match (status, replayed) {
            (201, false) => &self.seen.executed,
            (201 | 409, true) => &self.seen.replayed,
            (409, false) => &self.seen.in_flight,
            (422, _) => &self.seen.conflict,
            (503, _) => &self.seen.unavailable,
            _ => &self.seen.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(Answer {
            status,
            replayed,
            retry_after,
        })
    }

    /// Sends until the order is placed, waiting as `Retry-After` says.
    async fn place(&self, key: &str, body: &str) -> anyhow::Result<Answer> {
        for _ in 0..60 {
            let answer = self.post(key, body).await?;
            match answer.status {
                // Retry-After is the remaining lease (or 1 s); these clients
                // retry sooner, capped, to keep the demo short.
                409 | 503 => {
                    tokio::time::sleep(answer.retry_after.min(Duration::from_millis(200))).await;
                }
                _ => return Ok(answer),
            }
        }
        bail!("order {key}: still refused after 60 tries")
    }

    async fn order(&self, key: String, behaviour: Behaviour) -> anyhow::Result<()> {
        let body = order_json(&key, 1);
        let answer = match behaviour {
            Behaviour::Once => self.place(&key, &body).await?,
            Behaviour::LostResponse => {
                self.place(&key, &body).await?;
                let again = self.place(&key, &body).await?;
                if !again.replayed {
                    bail!("order {key}: the repeat after a lost response was not a replay");
                }
                again
            }
            Behaviour::Concurrent => {
                let copies =
                    futures_util::future::join_all((0..4).map(|_| self.place(&key, &body))).await;
                let mut last = None;
                for copy in copies {
                    last = Some(copy?);
                }
                last.expect("four copies")
            }
            Behaviour::ReusedKey => {
                let first = self.place(&key, &body).await?;
                let other = self.post(&key, &order_json(&key, 3)).await?;
                if other.status != 422 && other.status != 503 {
                    bail!(
                        "order {key}: a reused key with another payload got {} instead of 422",
                        other.status
                    );
                }
                first
            }
            Behaviour::Impatient => {
                let _ =
                    tokio::time::timeout(Duration::from_millis(1), self.post(&key, &body)).await;
                self.place(&key, &body).await?
            }
        };
        if answer.status != 201 {
            bail!("order {key}: ended with status {}", answer.status);
        }
        self.seen.orders_done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn order_json(key: &str, qty: i64) -> String {
    serde_json::json!({"order": key, "sku": "A", "qty": qty, "cents": 1250 * qty}).to_string()
}

/// A line on stdout. A stdout that went away (`idem demo | head`) is no
/// error: the run goes on unseen to its check and its clean-up, and its
/// exit code still says whether every order ran exactly once.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`out!`] unless the console owns the terminal.
macro_rules! say {
    ($quiet:expr, $($arg:tt)*) => {
        if !$quiet {
            out!($($arg)*);
        }
    };
}

/// The demo's own directory (its SQLite file), removed however the run
/// ends: success, a failed check, an error, a panic.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[allow(clippy::too_many_lines, clippy::single_match_else)] // one scripted run, top to bottom
pub async fn run(args: Args) -> anyhow::Result<()> {
    let (store_url, _temp_dir) = match args.store {
        Some(url) => (url, None),
        None => {
            let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let url = format!("sqlite:{}", dir.join("idem-demo.db").display());
            (url, Some(TempDir(dir)))
        }
    };
    let store = crate::store::open(&store_url).await?;

    let order_count = i64::try_from(args.orders).context("--orders is too large")?;
    let stock = order_count * 10;
    let ledger = Ledger::new(stock, Duration::from_millis(15));
    let ledger_listener = TcpListener::bind("127.0.0.1:0").await?;
    let ledger_addr = ledger_listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ledger_task = tokio::spawn(crate::ledger::run(
        ledger.clone(),
        ledger_listener,
        wait_stop(stop_rx.clone()),
    ));

    let config = Config {
        lease: Duration::from_secs(5),
        upstream_timeout: Duration::from_secs(4),
        // At most half the lease, so that a renewal lands inside it.
        store_timeout: Duration::from_millis(2_500),
        require_key: true,
        ..Config::default()
    };
    let gateway = Gateway::builder(config, store, &format!("http://{ledger_addr}")).build()?;
    let proxy = TcpListener::bind("127.0.0.1:0").await?;
    let proxy_addr = proxy.local_addr()?;
    let admin_listener = TcpListener::bind(&args.admin_listen)
        .await
        .with_context(|| format!("admin listen on {}", args.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let console_token = args.admin_token.clone();
    let admin = AdminListener::new(admin_listener, args.admin_token)?;
    let gateway_task = tokio::spawn(crate::server::run(
        gateway.clone(),
        proxy,
        Some(admin),
        wait_stop(stop_rx.clone()),
    ));

    out!(
        "idem demo: {} orders over {:?} through the gateway (store: {store_url})",
        args.orders,
        args.duration
    );
    out!("  ledger   http://{ledger_addr}/ledger");
    out!("  gateway  http://{proxy_addr}/orders");
    out!(
        "  admin    http://{admin_addr}/v1/stats   (events: /v1/events, keys: /v1/keys, metrics: /metrics)"
    );
    out!(
        "clients: retries after lost responses, duplicates, 4 concurrent copies, keys reused for other payloads, impatient retries;"
    );
    out!("the store fails 30% of inserts from 40% to 55% of the run.");

    // In a terminal, the operator console opens on the demo; the per-second
    // lines would garble it, so they are left to the console's own views.
    // The console is told when the run is over, so the operator knows `q`
    // now shows the verdict.
    let (banner, banner_rx) = tokio::sync::watch::channel(None);
    let quiet = !args.headless && std::io::stdout().is_terminal();
    if quiet {
        // Before the console takes the screen: a line printed after would
        // land inside it.
        out!("opening the operator console (q quits it; the summary follows)");
    }
    let console = quiet.then(|| {
        let url = format!("http://{admin_addr}");
        tokio::spawn(async move { idem_tui::run_with_banner(&url, console_token, banner_rx).await })
    });

    let seen = Arc::new(Seen::default());
    let client = Shopper {
        http: Client::builder(TokioExecutor::new()).build_http(),
        gateway: proxy_addr,
        seen: seen.clone(),
    };
    let started = Instant::now();
    let send_for = args.duration.mul_f64(0.7);
    let run_id = fastrand::u32(..);
    let mut orders = tokio::task::JoinSet::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut next_order = 0usize;
    let mut fault_on = false;
    let mut fault_done = false;
    let spacing = send_for
        .checked_div(args.orders.max(1) as u32)
        .unwrap_or_default();
    let mut next_at = tokio::time::Instant::now();
    loop {
        let elapsed = started.elapsed();
        let progress = elapsed.as_secs_f64() / args.duration.as_secs_f64();
        if !fault_on && !fault_done && progress >= 0.4 {
            let rule = FaultRule::error("injected: connection refused").with_probability(0.3);
            gateway.faults().set(Op::Insert, rule.clone())?;
            gateway.observer().fault_changed(Op::Insert, rule, None);
            fault_on = true;
            say!(
                quiet,
                "{:>5.1}s store fault ON: 30% of inserts fail",
                elapsed.as_secs_f64()
            );
        }
        if fault_on && progress >= 0.55 {
            gateway.faults().clear(Op::Insert);
            gateway
                .observer()
                .fault_changed(Op::Insert, FaultRule::default(), None);
            fault_on = false;
            fault_done = true;
            say!(quiet, "{:>5.1}s store fault OFF", elapsed.as_secs_f64());
        }
        if next_order == args.orders && orders.is_empty() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next_at), if next_order < args.orders => {
                let key = format!("demo-{run_id:08x}-{next_order:05}");
                let behaviour = BEHAVIOURS[next_order % BEHAVIOURS.len()];
                let client = client.clone();
                orders.spawn(async move { client.order(key, behaviour).await });
                next_order += 1;
                next_at += spacing;
            }
            _ = ticker.tick() => {
                say!(quiet,
                    "{:>5.1}s orders={}/{} {}",
                    started.elapsed().as_secs_f64(),
                    seen.orders_done.load(Ordering::Relaxed),
                    args.orders,
                    seen.line()
                );
            }
            Some(done) = orders.join_next() => {
                done.context("an order task panicked")??;
            }
        }
    }
    gateway.faults().clear_all();
    let answered_in = started.elapsed();
    let _ = banner.send(Some(format!(
        "The run is over: {} orders answered in {:.1}s · q closes and shows the verdict",
        args.orders,
        answered_in.as_secs_f64()
    )));
    if let Some(console) = console {
        console
            .await
            .context("the console panicked")?
            .context("the operator console failed")?;
    }
    out!(
        "{:>5.1}s all orders answered: {}",
        answered_in.as_secs_f64(),
        seen.line()
    );
    out!("{SEEN_LEGEND}");

    let books = ledger.books();
    let verdict = check(&books, args.orders, stock - order_count);
    out!(
        "ledger: orders={} executions={} reservations={} charges={} stock={} (started with {stock})",
        books.executions.len(),
        books.executions.values().sum::<u64>(),
        books.reservations.len(),
        books.charges.len(),
        books.stock
    );
    if args.linger && verdict.is_ok() {
        out!("serving on; Ctrl-C to stop");
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = stop_tx.send(true);
    let _ = gateway_task.await;
    let _ = ledger_task.await;
    verdict?;
    out!("exactly-once check passed: every order executed exactly once");
    Ok(())
}

/// Every order ran exactly once, with its first payload, and stock adds up.
fn check(books: &Books, orders: usize, expected_stock: i64) -> anyhow::Result<()> {
    let repeated = books.repeated();
    if !repeated.is_empty() {
        bail!(
            "exactly-once check FAILED: {} orders executed more than once, e.g. {:?}",
            repeated.len(),
            &repeated[..repeated.len().min(5)]
        );
    }
    if books.executions.len() != orders {
        bail!(
            "exactly-once check FAILED: {} of {orders} orders executed",
            books.executions.len()
        );
    }
    if books.reservations.values().any(|&qty| qty != 1) {
        bail!("exactly-once check FAILED: a reused key's other payload was executed");
    }
    if books.stock != expected_stock || books.charges.len() != orders {
        bail!(
            "exactly-once check FAILED: stock {} and {} charges do not add up for {orders} orders",
            books.stock,
            books.charges.len()
        );
    }
    Ok(())
}

async fn wait_stop(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
