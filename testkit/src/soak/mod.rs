//! `idem-testkit soak`: the chaos soak. One `idem ledger` and two `idem serve`
//! gateways in front of it, sharing one store, take orders from clients that
//! retry, duplicate and repeat them, while store faults are switched on and
//! off at random through each gateway's admin API and a gateway is killed
//! with SIGKILL and restarted on the same port. At the end the ledger, the
//! stored responses and everything the clients saw are checked against each
//! other ([`check`]); any violation makes the exit status non-zero.
//!
//! A handler may legitimately run more than once for one order: when the
//! gateway holding its claim is killed, or when a store fault keeps its
//! response from being recorded, the claim is taken over once its lease runs
//! out and the order runs again under a new fence. The ledger absorbs repeats
//! of an order id (one reservation and one charge), so the effect is still
//! applied once. The soak counts these re-runs by cause; a re-run it cannot
//! explain, or two runs under the same fence, is a violation.
//!
//! Some faults come near the lease: store latency spikes of 40–90 % of it on
//! the guard's `insert` and `replace`, and a gateway stopped with SIGSTOP for
//! longer than the lease, then continued with SIGCONT. Two checks are about
//! them: every 2xx body a key gave is the one it kept (a response a store
//! fault or a pause kept from being recorded aside), and two runs of one
//! key overlap in time only as a takeover whose earlier run's response was
//! refused.

mod chaos;
mod check;
mod clients;
mod clock;
mod gateways;
mod report;
mod slow;

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{HeaderValue, Request};
use chaos::{Upset, share_of, upsets};
use check::{OrderLog, Reuse, Stored, check};
use clients::{Plan, Tally, bump, get, plans};
use clock::WallClock;
use gateways::{Gateway, Process, free_ports};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::testing::Books;
use report::{Figures, print_figures};
use slow::{SlowTally, UNGUARDED_SLOTS, shut_out};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// The store both gateways share: redis://…, postgres://… or dynamodb://… (add
    /// `?prefix=` or `?table=` to keep runs apart), or sqlite:FILE on one machine.
    #[arg(long, value_name = "URL")]
    store: String,
    /// Orders to place.
    #[arg(long, default_value_t = 10_000)]
    orders: usize,
    /// Seeds the orders' behaviours, the faults and the kills [default: random, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Orders in progress at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The gateways' lease: short, so a killed gateway's claims are taken over within the run.
    #[arg(long, default_value = "2s", value_parser = idem::server::parse_duration)]
    lease: Duration,
    /// How many times a gateway is killed with SIGKILL and restarted.
    #[arg(long, default_value_t = 2)]
    kills: usize,
    /// How many times a gateway is stopped with SIGSTOP for 1.2–2 leases, then continued.
    #[arg(long, default_value_t = 2)]
    pauses: usize,
    /// The ledger's work per order [default: a tenth of the lease], so
    /// upstream calls take a noticeable part of it. One order in four asks
    /// for 40–60 % of the lease more; the sum stays below the upstream
    /// timeout (three quarters of the lease).
    #[arg(long, value_parser = idem::server::parse_duration)]
    ledger_latency: Option<Duration>,
    /// Start no new orders after this long; the orders started are still finished and checked.
    #[arg(long, default_value = "10m", value_parser = idem::server::parse_duration)]
    duration_limit: Duration,
    /// How far gateway 1's wall clock runs ahead of gateway 0's, for the
    /// whole run (libfaketime; `0s` for none). Many leases: the guard must
    /// judge time by the store's clock, not the gateways'.
    #[arg(long, default_value = "90s", value_parser = idem::server::parse_duration)]
    skew: Duration,
    /// How many times a gateway's wall clock steps an hour (forward, then
    /// back), at even steps through the orders, alternating gateways.
    #[arg(long, default_value_t = 2)]
    clock_steps: usize,
    /// Keyless slow clients beside the orders (spread over the gateways, each
    /// holding an unguarded slot with a body it never finishes); 0 for none.
    #[arg(long, default_value_t = 48)]
    slow_clients: usize,
}

/// How long a client waits for one answer before it gives up on the request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a client sends one request before it gives up on it.
const MAX_TRIES: u32 = 40;
/// The longest pause between tries, whatever `Retry-After` says.
const MAX_BACKOFF: Duration = Duration::from_millis(250);
/// Concurrent copies of an order in the `Concurrent` behaviour.
const COPIES: usize = 3;
/// A latency spike on the store, as a share of the lease: 40–90 %.
const SPIKE_PERCENT: std::ops::RangeInclusive<u32> = 40..=90;
/// A slow order's extra work at the ledger, as a share of the lease: with
/// the ledger's latency, still below the upstream timeout, and long enough
/// that a claim slowed by a spike can lapse while its upstream call runs.
const SLOW_ORDER_PERCENT: std::ops::RangeInclusive<u32> = 40..=60;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Everything the clients, the chaos and the crashes share.
struct Soak {
    http: Client<HttpConnector, Body>,
    gateways: Vec<Arc<Gateway>>,
    ledger: Mutex<Option<Process>>,
    /// `http://127.0.0.1:PORT` of the ledger.
    ledger_url: String,
    /// The clients' `Authorization`: the gateways scope keys by it.
    authorization: HeaderValue,
    lease: Duration,
    upstream_timeout: Duration,
    tally: Tally,
    slow: SlowTally,
    killed_in_flight: Mutex<HashSet<usize>>,
    /// Where the gateways' wall clocks are kept (`clock.rs`), removed at the end.
    clock_dir: Option<std::path::PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.store.starts_with("memory:") {
        bail!(
            "--store memory: is private to one process; the gateways need a shared store (redis://…, postgres://… or dynamodb://…)"
        );
    }
    if args.orders == 0 || args.concurrency == 0 {
        bail!("--orders and --concurrency must be at least 1");
    }
    if ledger_latency(&args) + share_of(args.lease, *SLOW_ORDER_PERCENT.end())
        >= upstream_timeout(args.lease)
    {
        bail!(
            "--ledger-latency plus a slow order's work ({} % of the lease) must be below the upstream timeout ({:?})",
            SLOW_ORDER_PERCENT.end(),
            upstream_timeout(args.lease)
        );
    }
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    // Not from the seed: a rerun with the same seed must not meet the keys of the last.
    let run_id = fastrand::u32(..);
    let plans = Arc::new(plans(args.orders, seed, run_id, args.lease));
    // Enough for every order's largest quantity: running out would be a 409 from the ledger.
    let stock_at_start = i64::try_from(args.orders).context("--orders is too large")? * 10;

    let soak = Arc::new(Soak::start(&args, stock_at_start, run_id).await?);
    print_plan(&args, &soak, seed);

    let started = Instant::now();
    let logs = soak.drive(&args, &plans, seed, started).await?;
    println!(
        "{:>6.1}s {} orders done; faults off, waiting a lease for held claims",
        started.elapsed().as_secs_f64(),
        logs.len()
    );
    let orders = soak.settle(&args, &plans, logs).await?;
    let (totals, injected_by_gateway) = soak.all_totals().await;
    let books = soak.books().await?;
    let stored = soak.stored_all(&orders).await;
    soak.stop();

    let mut report = check(&orders, &books, stock_at_start, &stored);
    report
        .violations
        .extend(shut_out(&totals, args.slow_clients));
    print_figures(&Figures {
        tally: &soak.tally,
        slow: &soak.slow,
        slow_clients: args.slow_clients,
        totals: &totals,
        injected_by_gateway: &injected_by_gateway,
        books: &books,
        report: &report,
        orders_planned: args.orders,
        kills_planned: args.kills,
        pauses_planned: args.pauses,
        steps_planned: args.clock_steps,
        skew: args.skew,
        lease: args.lease,
        orders: &orders,
        elapsed: started.elapsed(),
    });
    if !report.violations.is_empty() {
        bail!(
            "soak FAILED: {} violations (seed {seed})",
            report.violations.len()
        );
    }
    println!("soak passed: no violations (seed {seed})");
    Ok(())
}

/// What the run will do: its settings, the processes' addresses and the chaos.
fn print_plan(args: &Args, soak: &Soak, seed: u64) {
    println!(
        "idem soak: {} orders, seed {seed}, store {}, lease {:?}, {} kills",
        args.orders, args.store, args.lease, args.kills
    );
    println!(
        "  upstream timeout {:?}, ledger latency {:?} (slow orders {}–{} % of the lease more), {} pauses",
        soak.upstream_timeout,
        ledger_latency(args),
        SLOW_ORDER_PERCENT.start(),
        SLOW_ORDER_PERCENT.end(),
        args.pauses
    );
    println!("  ledger     {}/ledger", soak.ledger_url);
    for gateway in &soak.gateways {
        println!(
            "  gateway {}  http://{}/orders  admin http://{}/v1/stats",
            gateway.index, gateway.proxy, gateway.admin
        );
    }
    println!(
        "clients: retries, duplicates to both gateways, {COPIES} concurrent copies, repeats after an answer, keys reused with another body,"
    );
    println!("  copies sent 0.5–1.2 leases after the first, answered or not;");
    println!(
        "store faults (error, timeout, delay, lost reply) switched on and off at random on both gateways."
    );
    println!(
        "wall clocks: gateway 1 {} s ahead of gateway 0; {} steps of an hour (libfaketime).",
        args.skew.as_secs(),
        args.clock_steps
    );
    println!(
        "{} keyless slow clients beside the orders (bodies never finished; {UNGUARDED_SLOTS} unguarded slots a gateway).",
        args.slow_clients
    );
    println!(
        "latency spikes of {}–{} % of the lease on insert and replace; gateways stopped with SIGSTOP past their lease.",
        SPIKE_PERCENT.start(),
        SPIKE_PERCENT.end()
    );
}

/// The gateways' upstream timeout: below the lease, as `idem serve` requires.
fn upstream_timeout(lease: Duration) -> Duration {
    lease.mul_f64(0.75)
}

fn ledger_latency(args: &Args) -> Duration {
    args.ledger_latency.unwrap_or(args.lease / 10)
}

impl Soak {
    /// Starts the ledger and both gateways and waits until they answer.
    async fn start(args: &Args, stock_at_start: i64, run_id: u32) -> anyhow::Result<Soak> {
        let [ledger_port, proxy_0, admin_0, proxy_1, admin_1] = free_ports()?;
        let ledger = Process::spawn(
            &[
                "ledger".into(),
                "--listen".into(),
                format!("127.0.0.1:{ledger_port}"),
                "--stock".into(),
                stock_at_start.to_string(),
                "--latency".into(),
                format!("{}ms", ledger_latency(args).as_millis()),
            ],
            None,
        )?;
        let upstream_timeout = upstream_timeout(args.lease);
        let skew_s = i64::try_from(args.skew.as_secs()).context("--skew is too large")?;
        let clock_dir = (skew_s != 0 || args.clock_steps > 0)
            .then(|| std::env::temp_dir().join(format!("idem-soak-clocks-{run_id:08x}")));
        if let Some(dir) = &clock_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let mut gateways = Vec::new();
        for (index, (proxy, admin)) in [(proxy_0, admin_0), (proxy_1, admin_1)]
            .into_iter()
            .enumerate()
        {
            let gateway_args = [
                "serve",
                "--listen",
                &format!("127.0.0.1:{proxy}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--upstream",
                &format!("http://127.0.0.1:{ledger_port}"),
                "--store",
                &args.store,
                // Keyless requests are forwarded, unguarded: the slow clients'
                // way in. Every order the soak places has a key.
                "--require-key",
                "false",
                "--max-concurrent-unguarded",
                &UNGUARDED_SLOTS.to_string(),
                "--lease",
                &format!("{}ms", args.lease.as_millis()),
                // Half the lease: a renewal lands inside the lease even
                // when it takes the whole store timeout.
                "--store-timeout",
                &format!("{}ms", (args.lease / 2).as_millis()),
                "--upstream-timeout",
                &format!("{}ms", upstream_timeout.as_millis()),
                // An hour past the last order's start, longer than a soak
                // runs: the final check reads every key's kept response, and
                // one expired would read as lost.
                "--retention",
                &format!(
                    "{}s",
                    (args.duration_limit + Duration::from_hours(1)).as_secs()
                ),
            ]
            .map(str::to_owned)
            .to_vec();
            let gateway = Gateway {
                index,
                proxy: SocketAddr::from(([127, 0, 0, 1], proxy)),
                admin: SocketAddr::from(([127, 0, 0, 1], admin)),
                args: gateway_args,
                process: Mutex::default(),
                faults: Mutex::default(),
                paused: Mutex::default(),
                in_flight: Mutex::default(),
                earlier: Mutex::default(),
                // Gateway 1 runs `--skew` ahead of gateway 0.
                clock: clock_dir
                    .as_deref()
                    .map(|dir| {
                        let offset = if index == 1 { skew_s } else { 0 };
                        WallClock::new(dir, &index.to_string(), offset)
                    })
                    .transpose()?,
            };
            gateway.start()?;
            gateways.push(Arc::new(gateway));
        }
        let soak = Soak {
            http: Client::builder(TokioExecutor::new()).build_http(),
            gateways,
            ledger: Mutex::new(Some(ledger)),
            ledger_url: format!("http://127.0.0.1:{ledger_port}"),
            authorization: HeaderValue::from_str(&format!("Bearer soak-{run_id:08x}"))?,
            lease: args.lease,
            upstream_timeout,
            tally: Tally::default(),
            slow: SlowTally::default(),
            killed_in_flight: Mutex::default(),
            clock_dir,
        };
        soak.wait_ready(&format!("{}/ledger", soak.ledger_url))
            .await
            .context("the ledger did not start")?;
        for gateway in &soak.gateways {
            soak.wait_ready(&format!("http://{}/v1/stats", gateway.admin))
                .await
                .with_context(|| format!("gateway {} did not start", gateway.index))?;
        }
        Ok(soak)
    }

    /// Runs the clients, the faults and the kills until every order has been
    /// tried (or the duration limit stops new ones). Returns each order's log
    /// with its index.
    async fn drive(
        self: &Arc<Self>,
        args: &Args,
        plans: &Arc<Vec<Plan>>,
        seed: u64,
        started: Instant,
    ) -> anyhow::Result<Vec<(usize, OrderLog)>> {
        let stop_starting = Arc::new(AtomicBool::new(false));
        let mut clients = self.spawn_clients(args.concurrency, plans, &stop_starting);
        let stop_faults = Arc::new(AtomicBool::new(false));
        let faults = self.spawn_faults(seed, &stop_faults);
        let mut upsets_left = upsets(
            [args.kills, args.pauses, args.clock_steps],
            args.orders,
            seed,
        );
        let mut slow = self.spawn_slow_clients(args.slow_clients, &stop_faults);
        let mut kill_rng = fastrand::Rng::with_seed(seed ^ 0x0000_0b17);
        let mut crashing: Option<tokio::task::JoinHandle<anyhow::Result<()>>> = None;
        let mut logs = Vec::new();
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            if crashing
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished)
                && let Some(crash) = crashing.take()
            {
                crash.await.context("the crash task panicked")??;
            }
            if crashing.is_none()
                && let Some(&(at, upset, gateway)) = upsets_left.last()
                && get(&self.tally.orders_done) >= at
            {
                upsets_left.pop();
                let soak = self.clone();
                crashing = Some(match upset {
                    Upset::Kill => {
                        let down = Duration::from_millis(kill_rng.u64(200..=800));
                        tokio::spawn(async move {
                            soak.crash(&soak.gateways[gateway], started, down).await
                        })
                    }
                    Upset::Pause => {
                        let paused = args.lease.mul_f64(1.2 + 0.8 * kill_rng.f64());
                        tokio::spawn(async move {
                            soak.pause(&soak.gateways[gateway], started, paused).await
                        })
                    }
                    Upset::Step { forward } => {
                        let by_s = if forward { 3_600 } else { -3_600 };
                        tokio::spawn(
                            async move { soak.step(&soak.gateways[gateway], started, by_s) },
                        )
                    }
                });
            }
            if started.elapsed() > args.duration_limit
                && !stop_starting.swap(true, Ordering::Relaxed)
            {
                println!(
                    "{:>6.1}s duration limit reached: no new orders",
                    started.elapsed().as_secs_f64()
                );
            }
            tokio::select! {
                joined = clients.join_next() => match joined {
                    Some(finished) => logs.extend(finished.context("a client task panicked")?),
                    None => break,
                },
                _ = ticker.tick() => self.progress(args.orders, started),
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        if let Some(crash) = crashing {
            crash.await.context("the crash task panicked")??;
        }
        stop_faults.store(true, Ordering::Relaxed);
        faults.await.context("the fault task panicked")?;
        while let Some(done) = slow.join_next().await {
            done.context("a slow client panicked")?;
        }
        logs.sort_by_key(|(index, _)| *index);
        Ok(logs)
    }

    /// `concurrency` clients taking the next order until none is left.
    fn spawn_clients(
        self: &Arc<Self>,
        concurrency: usize,
        plans: &Arc<Vec<Plan>>,
        stop_starting: &Arc<AtomicBool>,
    ) -> tokio::task::JoinSet<Vec<(usize, OrderLog)>> {
        let next = Arc::new(AtomicUsize::new(0));
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (soak, plans, next, stop_starting) = (
                self.clone(),
                plans.clone(),
                next.clone(),
                stop_starting.clone(),
            );
            clients.spawn(async move {
                let mut logs = Vec::new();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= plans.len() || stop_starting.load(Ordering::Relaxed) {
                        return logs;
                    }
                    logs.push((index, soak.order(index, &plans[index]).await));
                    bump(&soak.tally.orders_done);
                }
            });
        }
        clients
    }

    /// Switches a fault every 50–300 ms until `stop`.
    fn spawn_faults(
        self: &Arc<Self>,
        seed: u64,
        stop: &Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let (soak, stop) = (self.clone(), stop.clone());
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x00c4_a05c);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(rng.u64(50..=300))).await;
                soak.toggle_fault(&mut rng).await;
            }
        })
    }

    fn progress(&self, orders: usize, started: Instant) {
        let faults_on: usize = self.gateways.iter().map(|g| lock(&g.faults).on.len()).sum();
        println!(
            "{:>6.1}s orders={}/{orders} {} faults_on={faults_on} kills={}",
            started.elapsed().as_secs_f64(),
            get(&self.tally.orders_done),
            self.tally.line(),
            get(&self.tally.kills),
        );
    }

    /// The end: faults off, leases left to run out, then every order (or
    /// reused key) without a final answer is sent again. Marks the orders
    /// that had a request at a gateway when it was killed.
    async fn settle(
        self: &Arc<Self>,
        args: &Args,
        plans: &[Plan],
        logs: Vec<(usize, OrderLog)>,
    ) -> anyhow::Result<Vec<OrderLog>> {
        self.faults_off().await?;
        tokio::time::sleep(args.lease + Duration::from_millis(500)).await;
        let mut settled = Vec::with_capacity(logs.len());
        for chunk in logs.chunks(args.concurrency) {
            let retried = chunk.iter().map(|(index, log)| async move {
                let plan = &plans[*index];
                let log = Mutex::new(log.clone());
                if lock(&log).status.is_none() {
                    let body = plan.body(0);
                    self.place_order(0, *index, &body, &log).await;
                }
                if lock(&log).reuse == Reuse::Unanswered {
                    self.reuse(1, *index, plan, &log).await;
                }
                log.into_inner().unwrap_or_else(PoisonError::into_inner)
            });
            settled.extend(futures_util::future::join_all(retried).await);
        }
        let killed = lock(&self.killed_in_flight).clone();
        for ((index, _), log) in logs.iter().zip(&mut settled) {
            log.at_kill = killed.contains(index);
        }
        Ok(settled)
    }

    async fn books(&self) -> anyhow::Result<Books> {
        let request = Request::get(format!("{}/ledger", self.ledger_url)).body(Body::empty())?;
        let answer = self.send(request).await.context("GET /ledger")?;
        serde_json::from_slice(&answer.body).context("GET /ledger: not the ledger's books")
    }

    /// Every order's record, 32 reads at a time.
    async fn stored_all(&self, orders: &[OrderLog]) -> Vec<Stored> {
        let mut stored = Vec::with_capacity(orders.len());
        for chunk in orders.chunks(32) {
            stored.extend(
                futures_util::future::join_all(chunk.iter().map(|o| self.stored(&o.id))).await,
            );
        }
        stored
    }

    /// Kills every process.
    fn stop(&self) {
        for gateway in &self.gateways {
            drop(lock(&gateway.process).take());
        }
        drop(lock(&self.ledger).take());
        if let Some(dir) = &self.clock_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
