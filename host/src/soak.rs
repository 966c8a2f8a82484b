//! `idem soak`: the chaos soak. One `idem ledger` and two `idem serve`
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

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::ledger::{Books, Run};
use idem::store::{FaultKind, FaultRule, Op};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// The store both gateways share: redis://… or postgres://… (add
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

/// What one order's clients did and saw: the input of [`check`].
#[derive(Clone, Debug, Default)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one order
pub struct OrderLog {
    pub id: String,
    pub qty: i64,
    pub cents: i64,
    /// Every 2xx body a client got for this key, first answers and replays.
    pub bodies: Vec<Seen>,
    /// The status of the last final answer (anything but 409, 5xx or no
    /// answer) to the order's own body; `None`: no client ever got one.
    pub status: Option<u16>,
    /// The key sent again with another body, and what came of it.
    pub reuse: Reuse,
    /// A request of the order was at a gateway when it was killed.
    pub at_kill: bool,
    /// A request of the order overlapped a store fault that fails an
    /// operation or loses its reply, or a latency spike on `replace`.
    pub under_fault: bool,
    /// A request of the order was at a gateway while it was stopped.
    pub at_pause: bool,
    /// A request of the order took longer than the upstream timeout, timed
    /// out at the client, or got a 5xx from the upstream (the gateway then
    /// releases the key for a retry, by design).
    pub slow: bool,
}

/// One 2xx answer a client got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub body: Vec<u8>,
    /// It came with `Idempotent-Replayed`: from the store.
    pub replayed: bool,
}

/// Whether an order's key was sent again with another body, and its final answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reuse {
    #[default]
    NotSent,
    Answered(u16),
    /// Sent, but no final answer came.
    Unanswered,
}

/// A key's record as the admin API shows it at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// No live record.
    Missing,
    /// Still claimed: its response was never recorded.
    Processing,
    /// Completed with this response.
    Done { status: u16, body: Vec<u8> },
    /// The admin API could not say.
    Unreadable(String),
}

/// The verdict on one soak.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// Orders whose handler ran more than once, and why.
    pub reexecuted: usize,
    pub reexecuted_at_kill: usize,
    pub reexecuted_under_fault: usize,
    pub reexecuted_slow: usize,
    pub reexecuted_paused: usize,
    /// 2xx answers checked against their key's kept response.
    pub answers_checked: usize,
    /// Pairs of runs of one key that overlapped in time.
    pub overlapping_runs: usize,
    /// Stored responses that match the ledger.
    pub stored_matching: usize,
    /// Keys still claimed at the end (a response a fault kept from being recorded).
    pub left_processing: usize,
}

/// Checks what the ledger did, what the store holds and what clients saw
/// against each other. `stored[i]` is the record of `orders[i]`'s key.
#[allow(clippy::too_many_lines)] // one check after another, each with its message
pub fn check(orders: &[OrderLog], books: &Books, stock_at_start: i64, stored: &[Stored]) -> Report {
    let mut report = Report::default();
    let mut v = Vec::new();
    let known: HashSet<&str> = orders.iter().map(|o| o.id.as_str()).collect();
    let in_ledger: BTreeSet<&String> = books
        .executions
        .keys()
        .chain(books.reservations.keys())
        .chain(books.charges.keys())
        .collect();
    for id in in_ledger {
        if !known.contains(id.as_str()) {
            v.push(format!("the ledger has order {id}, which no client sent"));
        }
    }
    let reserved: i64 = books.reservations.values().sum();
    if books.stock + reserved != stock_at_start {
        v.push(format!(
            "stock is not conserved: {} left + {reserved} reserved is not the {stock_at_start} at the start",
            books.stock
        ));
    }

    for (order, stored) in orders.iter().zip(stored) {
        let id = order.id.as_str();
        let charge = books.charges.get(id).copied();
        match (books.reservations.get(id), charge) {
            (Some(&qty), Some(cents)) if qty != order.qty || cents != order.cents => {
                v.push(format!(
                    "order {id}: reserved {qty} and charged {cents} cents, but the order was {} for {} cents",
                    order.qty, order.cents
                ));
            }
            (Some(_), None) | (None, Some(_)) => v.push(format!(
                "order {id}: a reservation without a charge, or a charge without a reservation"
            )),
            _ => {}
        }

        match order.status {
            None => v.push(format!("order {id}: no client ever got a final answer")),
            Some(status) if !(200..300).contains(&status) => v.push(format!(
                "order {id}: its final answer was {status}, not 2xx"
            )),
            Some(_) => {}
        }
        if !order.bodies.is_empty() && charge.is_none() {
            v.push(format!(
                "order {id}: a client got a 2xx, but the ledger has no charge"
            ));
        }
        for seen in &order.bodies {
            let (body_order, cents) =
                ledger_body(&seen.body).unwrap_or_else(|| ("<unreadable>".to_owned(), -1));
            if body_order != id {
                v.push(format!(
                    "order {id}: a client got the body of order {body_order}"
                ));
            } else if Some(cents) != charge {
                v.push(format!(
                    "order {id}: a client got a body with {cents} cents; the ledger charged {charge:?}"
                ));
            }
        }
        match order.reuse {
            Reuse::NotSent | Reuse::Answered(422) => {}
            Reuse::Answered(status) => v.push(format!(
                "order {id}: its key, reused with another body, got {status}, not 422"
            )),
            Reuse::Unanswered => v.push(format!(
                "order {id}: its key, reused with another body, never got a final answer"
            )),
        }

        match stored {
            Stored::Done { status, body } => match ledger_body(body) {
                Some((body_order, cents))
                    if (200..300).contains(status)
                        && body_order == id
                        && Some(cents) == charge =>
                {
                    report.stored_matching += 1;
                }
                _ => v.push(format!(
                    "order {id}: the stored response ({status}, {:?}) does not match the ledger's charge {charge:?}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                )),
            },
            Stored::Processing => report.left_processing += 1,
            Stored::Missing if charge.is_some() => v.push(format!(
                "order {id}: charged, but the store has no record of its key"
            )),
            Stored::Missing => {}
            Stored::Unreadable(why) => {
                v.push(format!("order {id}: its record could not be read: {why}"));
            }
        }

        let runs = books.executions.get(id).copied().unwrap_or(0);
        let fences = books.fences.get(id).map_or(&[][..], Vec::as_slice);
        if fences.len() as u64 != runs {
            v.push(format!(
                "order {id}: ran {runs} times, {} of them through the gateway with a fence",
                fences.len()
            ));
        }
        let distinct: BTreeSet<u64> = fences.iter().copied().collect();
        if distinct.len() != fences.len() {
            v.push(format!(
                "order {id}: two runs under one claim (fences {fences:?})"
            ));
        }
        let timed = books.runs.get(id).map_or(&[][..], Vec::as_slice);
        if !books.runs.is_empty() && timed.len() as u64 != runs {
            v.push(format!(
                "order {id}: ran {runs} times, {} of them with their times recorded",
                timed.len()
            ));
        }
        let kept = match stored {
            Stored::Done { status, body } if (200..300).contains(status) => Some(body.as_slice()),
            _ => None,
        };
        check_bodies(order, kept, &mut report, &mut v);
        check_overlaps(order, kept, timed, &mut report, &mut v);
        if runs > 1 {
            report.reexecuted += 1;
            if order.at_kill {
                report.reexecuted_at_kill += 1;
            } else if order.under_fault {
                report.reexecuted_under_fault += 1;
            } else if order.at_pause {
                report.reexecuted_paused += 1;
            } else if order.slow {
                report.reexecuted_slow += 1;
            } else {
                v.push(format!(
                    "order {id}: ran {runs} times (fences {fences:?}) with no kill, store fault, pause or slow request to explain it"
                ));
            }
        }
    }
    report.violations = v;
    report
}

/// No key gives two different 2xx bodies: every 2xx body a client saw, first
/// answer or replay, is the key's `kept` response, byte for byte. A replay
/// comes from the store, so it must be; a first answer is sent only once its
/// response is recorded (a gateway that cannot record it answers 503
/// `response-not-recorded` instead), so it must be too, whatever faults,
/// kills or pauses its request met.
fn check_bodies(order: &OrderLog, kept: Option<&[u8]>, report: &mut Report, v: &mut Vec<String>) {
    let id = &order.id;
    let kept_execution = kept.and_then(execution);
    for seen in &order.bodies {
        report.answers_checked += 1;
        if Some(seen.body.as_slice()) == kept {
            continue;
        }
        let got = execution(&seen.body);
        let what = if seen.replayed {
            "a replay"
        } else {
            "a first answer"
        };
        v.push(format!(
            "order {id}: two different 2xx bodies: {what} gave the body of execution {got:?}, the key kept execution {kept_execution:?}"
        ));
    }
}

/// Two runs of one key overlap in time only as a takeover: the later under
/// a higher fence, and the earlier's completion refused, so neither the kept
/// response nor any replay is the earlier run's.
fn check_overlaps(
    order: &OrderLog,
    kept: Option<&[u8]>,
    runs: &[Run],
    report: &mut Report,
    v: &mut Vec<String>,
) {
    let id = &order.id;
    let answered: BTreeSet<u64> = kept
        .into_iter()
        .chain(
            order
                .bodies
                .iter()
                .filter(|s| s.replayed)
                .map(|s| &s.body[..]),
        )
        .filter_map(execution)
        .collect();
    let mut runs: Vec<&Run> = runs.iter().collect();
    runs.sort_by_key(|r| (r.started_ms, r.ended_ms));
    for (i, earlier) in runs.iter().enumerate() {
        for later in runs[i + 1..]
            .iter()
            .filter(|later| later.started_ms < earlier.ended_ms)
        {
            report.overlapping_runs += 1;
            let overlap = format!(
                "two runs overlapped: execution {} (fence {:?}) ran {} ms, execution {} (fence {:?}) started {} ms into it",
                earlier.execution,
                earlier.fence,
                earlier.ended_ms - earlier.started_ms,
                later.execution,
                later.fence,
                later.started_ms - earlier.started_ms,
            );
            if !matches!((earlier.fence, later.fence), (Some(a), Some(b)) if b > a) {
                v.push(format!(
                    "order {id}: {overlap}, and the later has no higher fence"
                ));
            } else if answered.contains(&earlier.execution) {
                v.push(format!(
                    "order {id}: {overlap}, and the earlier's response was kept or replayed"
                ));
            }
        }
    }
}

/// The `execution` of a ledger response body: which run of the order made it.
fn execution(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("execution")?
        .as_u64()
}

/// The `order` and `cents` of a ledger response body.
fn ledger_body(body: &[u8]) -> Option<(String, i64)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    Some((
        value.get("order")?.as_str()?.to_owned(),
        value.get("cents")?.as_i64()?,
    ))
}

/// How a client treats one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Sends it until it gets a final answer.
    Once,
    /// Gets an answer, then sends it again, as after a lost response: a replay.
    Again,
    /// Sends it to both gateways at once.
    BothGateways,
    /// Sends [`COPIES`] copies at once to alternating gateways.
    Concurrent,
    /// Gets an answer, then sends the same key with another body: 422.
    ReusedKey,
    /// Sends it, and again to the other gateway after half a lease to 1.2
    /// leases, whether or not the first has been answered: a client whose
    /// own timeout is shorter than the gateway's. A copy that comes after a
    /// slow claim's lease meets it still running (issue 16).
    Impatient,
}

impl Behaviour {
    fn pick(rng: &mut fastrand::Rng) -> Behaviour {
        match rng.u32(0..100) {
            0..15 => Behaviour::Once,
            15..30 => Behaviour::Impatient,
            30..50 => Behaviour::Again,
            50..70 => Behaviour::BothGateways,
            70..85 => Behaviour::Concurrent,
            _ => Behaviour::ReusedKey,
        }
    }
}

/// One order, decided up front from the seed.
#[derive(Clone, Debug)]
struct Plan {
    id: String,
    qty: i64,
    cents: i64,
    behaviour: Behaviour,
    gateway: usize,
    /// A slow order's extra work at the ledger.
    work_ms: Option<u64>,
    /// When an impatient client sends its copy, in leases.
    impatience: f64,
}

impl Plan {
    /// The order's body; `more` asks for another quantity and price (the reused key's other body).
    fn body(&self, more: i64) -> String {
        let order = idem::ledger::Order {
            order: self.id.clone(),
            sku: "A".into(),
            qty: self.qty + more,
            cents: self.cents + 100 * more,
            work_ms: self.work_ms,
        };
        serde_json::to_string(&order).expect("an order serializes")
    }
}

/// What clients saw, by kind of answer, and what the soak did.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    conflict: AtomicU64,
    unavailable: AtomicU64,
    upstream_failed: AtomicU64,
    other: AtomicU64,
    connection_errors: AtomicU64,
    timeouts: AtomicU64,
    gave_up: AtomicU64,
    orders_done: AtomicU64,
    faults_on: AtomicU64,
    faults_off: AtomicU64,
    /// Latency spikes switched on (counted in `faults_on` too).
    spikes_on: AtomicU64,
    kills: AtomicU64,
    pauses: AtomicU64,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl Tally {
    fn line(&self) -> String {
        format!(
            "sent={} 2xx={} replayed={} 409={} 422={} 503={} 5xx={} conn_err={} timeouts={}",
            get(&self.sent),
            get(&self.executed),
            get(&self.replayed),
            get(&self.in_flight),
            get(&self.conflict),
            get(&self.unavailable),
            get(&self.upstream_failed),
            get(&self.connection_errors),
            get(&self.timeouts),
        )
    }
}

/// An `idem` child process, killed when dropped.
struct Process(std::process::Child);

impl Process {
    fn spawn(args: &[String]) -> anyhow::Result<Process> {
        let exe = std::env::current_exe().context("find the idem executable")?;
        let mut command = Command::new(exe);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // The children take their settings from these flags only.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("IDEM_") {
                command.env_remove(name);
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("start idem {}", args.join(" ")))?;
        Ok(Process(child))
    }

    /// SIGKILL: no drain, no clean close.
    fn kill(mut self) -> u32 {
        let pid = self.0.id();
        let _ = self.0.kill();
        let _ = self.0.wait();
        pid
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `SIGname` to `pid` with `kill(1)` (the workspace forbids the
/// `unsafe` a direct `kill(2)` would need).
async fn signal(pid: u32, name: &'static str) -> anyhow::Result<()> {
    let status = tokio::task::spawn_blocking(move || {
        Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
    })
    .await
    .context("the kill task panicked")?
    .with_context(|| format!("run kill -{name} {pid}"))?;
    if !status.success() {
        bail!("kill -{name} {pid}: {status}");
    }
    Ok(())
}

/// `N` distinct loopback ports that are free now. They are held together
/// while they are picked, so no two are the same, and they come from below
/// Linux's ephemeral range (32768 and up), so neither another `bind(:0)` nor
/// an outgoing connection's local port takes one before the child process
/// binds it, or while a killed gateway is down.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut rng = fastrand::Rng::new();
    let mut held = Vec::with_capacity(N);
    for _ in 0..10_000 {
        if held.len() == N {
            break;
        }
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", rng.u16(20_000..32_768))) {
            held.push(listener);
        }
    }
    let ports: Vec<u16> = held
        .iter()
        .map(|listener| Ok(listener.local_addr()?.port()))
        .collect::<std::io::Result<_>>()?;
    ports
        .try_into()
        .map_err(|_| anyhow::anyhow!("found fewer than {N} free ports in 20000..32768"))
}

/// Counters a gateway process keeps, read through its admin API.
#[derive(Clone, Debug, Default)]
struct Totals {
    injected: u64,
    outcomes: BTreeMap<String, u64>,
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.injected += other.injected;
        for (name, n) in &other.outcomes {
            *self.outcomes.entry(name.clone()).or_default() += n;
        }
    }

    fn outcome(&self, name: &str) -> u64 {
        self.outcomes.get(name).copied().unwrap_or(0)
    }
}

/// The faults the soak has switched on at one gateway.
#[derive(Default)]
struct FaultState {
    /// Operation → whether the fault on it [`disrupts`].
    on: BTreeMap<Op, bool>,
    /// Bumped whenever a fault that [`disrupts`] goes on.
    generation: u64,
}

impl FaultState {
    fn disruptive(&self) -> bool {
        self.on.values().any(|&disrupts| disrupts)
    }
}

/// Faults that can keep a claim or a response from being recorded: those
/// that fail an operation or lose its reply, and a latency spike on
/// `replace`, which can hold a completion or a renewal past the lease. A
/// spike on `insert` is not one: a claim, however slow, must never let two
/// runs of one key happen.
fn disrupts(rule: &FaultRule, op: Op, lease: Duration) -> bool {
    match rule.kind {
        FaultKind::Error | FaultKind::Timeout | FaultKind::Lost => true,
        FaultKind::Delay => op == Op::Replace && is_spike(rule, lease),
        FaultKind::Off => false,
    }
}

/// A state a gateway goes in and out of (a pause), as requests see it:
/// whether it holds, and how many times it has begun.
#[derive(Clone, Copy, Default)]
struct Spell {
    holds: bool,
    begun: u64,
}

impl Spell {
    fn begin(&mut self) {
        self.holds = true;
        self.begun += 1;
    }

    /// Whether it held at any time between `mark` (taken as a request
    /// started) and now.
    fn since(self, mark: Spell) -> bool {
        mark.holds || self.holds || self.begun != mark.begun
    }
}

/// One gateway: its addresses stay, its process comes and goes.
struct Gateway {
    index: usize,
    proxy: SocketAddr,
    admin: SocketAddr,
    args: Vec<String>,
    process: Mutex<Option<Process>>,
    faults: Mutex<FaultState>,
    /// Stopped with SIGSTOP.
    paused: Mutex<Spell>,
    /// Order index → requests of it now at this gateway.
    in_flight: Mutex<HashMap<usize, u32>>,
    /// Counters of the processes killed so far.
    earlier: Mutex<Totals>,
}

impl Gateway {
    fn start(&self) -> anyhow::Result<()> {
        *lock(&self.process) = Some(Process::spawn(&self.args)?);
        *lock(&self.faults) = FaultState::default();
        Ok(())
    }

    /// Whether a disruptive fault is on, and how many have gone on, as a request starts.
    fn fault_mark(&self) -> Spell {
        let faults = lock(&self.faults);
        Spell {
            holds: faults.disruptive(),
            begun: faults.generation,
        }
    }

    /// Whether a disruptive fault was on at any time since `mark`.
    fn disrupted_since(&self, mark: Spell) -> bool {
        self.fault_mark().since(mark)
    }

    fn pid(&self) -> Option<u32> {
        lock(&self.process).as_ref().map(|p| p.0.id())
    }

    fn enter(&self, order: usize) {
        *lock(&self.in_flight).entry(order).or_default() += 1;
    }

    fn leave(&self, order: usize) {
        let mut in_flight = lock(&self.in_flight);
        if let Some(n) = in_flight.get_mut(&order) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&order);
            }
        }
    }

    fn orders_in_flight(&self) -> Vec<usize> {
        lock(&self.in_flight).keys().copied().collect()
    }
}

/// An answer from a gateway.
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Duration,
    body: Bytes,
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
    killed_in_flight: Mutex<HashSet<usize>>,
}

impl Soak {
    async fn send(&self, request: Request<Body>) -> anyhow::Result<Answer> {
        let response = self.http.request(request).await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .map_or(MAX_BACKOFF, Duration::from_secs);
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            replayed,
            retry_after,
            body,
        })
    }

    async fn admin_json(
        &self,
        gateway: &Gateway,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", gateway.admin))
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))?;
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.send(request))
            .await
            .context("the admin API did not answer in time")??;
        let value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        Ok((answer.status, value))
    }

    /// One request for order `index`, recorded in its log and the tally.
    async fn attempt(
        &self,
        gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let gateway = &self.gateways[gateway];
        let id = lock(log).id.clone();
        let request = Request::post(format!("http://{}/orders", gateway.proxy))
            .header("idempotency-key", format!("\"{id}\""))
            .header("content-type", "application/json")
            .header("authorization", self.authorization.clone())
            .body(Body::from(body.to_owned()))
            .expect("a valid request");
        let mark = gateway.fault_mark();
        let pause_mark = *lock(&gateway.paused);
        gateway.enter(index);
        bump(&self.tally.sent);
        let started = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.send(request)).await;
        gateway.leave(index);
        let under_fault = gateway.disrupted_since(mark);
        let paused = lock(&gateway.paused).since(pause_mark);
        let mut log = lock(log);
        log.under_fault |= under_fault;
        log.at_pause |= paused;
        log.slow |= started.elapsed() > self.upstream_timeout;
        let answer = match result {
            Err(_) => {
                bump(&self.tally.timeouts);
                log.slow = true;
                return None;
            }
            Ok(Err(_)) => {
                bump(&self.tally.connection_errors);
                return None;
            }
            Ok(Ok(answer)) => answer,
        };
        let counter = match (answer.status, answer.replayed) {
            (200..=299, false) => &self.tally.executed,
            (200..=299, true) => &self.tally.replayed,
            (409, _) => &self.tally.in_flight,
            (422, _) => &self.tally.conflict,
            (503, _) => &self.tally.unavailable,
            (500..=599, _) => {
                log.slow = true;
                &self.tally.upstream_failed
            }
            _ => &self.tally.other,
        };
        bump(counter);
        if (200..300).contains(&answer.status) {
            log.bodies.push(Seen {
                body: answer.body.to_vec(),
                replayed: answer.replayed,
            });
        }
        Some(answer)
    }

    /// Sends until a final answer: 409, 5xx, connection errors and timeouts
    /// are retried with backoff, at the other gateway after a failure to
    /// connect. `None` after [`MAX_TRIES`].
    async fn place(
        &self,
        first_gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let mut gateway = first_gateway;
        for attempt in 0..MAX_TRIES {
            let pause = match self.attempt(gateway, index, body, log).await {
                Some(answer) if answer.status == 409 || answer.status >= 500 => {
                    answer.retry_after.min(MAX_BACKOFF)
                }
                Some(answer) => return Some(answer),
                None => {
                    gateway = (gateway + 1) % self.gateways.len();
                    (Duration::from_millis(10) * 2u32.pow(attempt.min(5))).min(MAX_BACKOFF)
                }
            };
            // Jitter, so retries of concurrent copies spread out.
            tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64())).await;
        }
        bump(&self.tally.gave_up);
        None
    }

    /// Places the order's own body, recording the final status.
    async fn place_order(
        &self,
        gateway: usize,
        index: usize,
        body: &str,
        log: &Mutex<OrderLog>,
    ) -> Option<Answer> {
        let answer = self.place(gateway, index, body, log).await;
        if let Some(answer) = &answer {
            lock(log).status = Some(answer.status);
        }
        answer
    }

    async fn order(&self, index: usize, plan: &Plan) -> OrderLog {
        let log = Mutex::new(OrderLog {
            id: plan.id.clone(),
            qty: plan.qty,
            cents: plan.cents,
            ..OrderLog::default()
        });
        let body = plan.body(0);
        let other = (plan.gateway + 1) % self.gateways.len();
        match plan.behaviour {
            Behaviour::Once => {
                self.place_order(plan.gateway, index, &body, &log).await;
            }
            Behaviour::Again => {
                if self
                    .place_order(plan.gateway, index, &body, &log)
                    .await
                    .is_some()
                {
                    self.place_order(other, index, &body, &log).await;
                }
            }
            Behaviour::BothGateways => {
                futures_util::future::join(
                    self.place_order(plan.gateway, index, &body, &log),
                    self.place_order(other, index, &body, &log),
                )
                .await;
            }
            Behaviour::Concurrent => {
                futures_util::future::join_all((0..COPIES).map(|copy| {
                    let gateway = (plan.gateway + copy) % self.gateways.len();
                    self.place_order(gateway, index, &body, &log)
                }))
                .await;
            }
            Behaviour::Impatient => {
                let after = self.lease.mul_f64(plan.impatience);
                futures_util::future::join(
                    self.place_order(plan.gateway, index, &body, &log),
                    async {
                        tokio::time::sleep(after).await;
                        self.place_order(other, index, &body, &log).await
                    },
                )
                .await;
            }
            Behaviour::ReusedKey => {
                // Only once the key is known to be claimed: a key no request
                // ever claimed is free for any body.
                if self
                    .place_order(plan.gateway, index, &body, &log)
                    .await
                    .is_some()
                {
                    self.reuse(other, index, plan, &log).await;
                }
            }
        }
        log.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the order's key with another body (more units, another price).
    async fn reuse(&self, gateway: usize, index: usize, plan: &Plan, log: &Mutex<OrderLog>) {
        let body = plan.body(1);
        let answer = self.place(gateway, index, &body, log).await;
        lock(log).reuse = answer.map_or(Reuse::Unanswered, |a| Reuse::Answered(a.status));
    }

    /// Switches one fault at one gateway on or off.
    async fn toggle_fault(&self, rng: &mut fastrand::Rng) {
        let gateway = &self.gateways[rng.usize(..self.gateways.len())];
        // Weighted toward insert and replace, the operations the guard uses.
        let op = [
            Op::Insert,
            Op::Insert,
            Op::Replace,
            Op::Replace,
            Op::Get,
            Op::Delete,
        ][rng.usize(..6)];
        let is_on = lock(&gateway.faults).on.contains_key(&op);
        let rule = if is_on && rng.f64() < 0.6 {
            FaultRule::default()
        } else {
            random_rule(rng, op, self.lease)
        };
        let turning_on = rule.kind != FaultKind::Off;
        let disrupts = disrupts(&rule, op, self.lease);
        if turning_on {
            // Marked before the rule can take effect, so no request misses it.
            let mut faults = lock(&gateway.faults);
            faults.on.insert(op, disrupts);
            if disrupts {
                faults.generation += 1;
            }
        }
        let body = json!({"faults": {op.as_str(): rule}});
        let applied = matches!(
            self.admin_json(gateway, "PUT", "/v1/faults", Some(&body))
                .await,
            Ok((200, _))
        );
        if applied {
            if turning_on {
                bump(&self.tally.faults_on);
                if rule.kind == FaultKind::Delay && is_spike(&rule, self.lease) {
                    bump(&self.tally.spikes_on);
                }
            } else {
                // Unmarked only once the rule is off.
                lock(&gateway.faults).on.remove(&op);
                bump(&self.tally.faults_off);
            }
        }
    }

    /// Switches every fault off at every gateway (retrying while one restarts).
    async fn faults_off(&self) -> anyhow::Result<()> {
        let off: serde_json::Map<String, Value> = Op::ALL
            .into_iter()
            .map(|op| (op.as_str().to_owned(), json!(FaultRule::default())))
            .collect();
        let body = json!({ "faults": off });
        for gateway in &self.gateways {
            let mut tries = 0;
            while !matches!(
                self.admin_json(gateway, "PUT", "/v1/faults", Some(&body))
                    .await,
                Ok((200, _))
            ) {
                tries += 1;
                if tries == 50 {
                    bail!(
                        "gateway {}: its faults could not be switched off",
                        gateway.index
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            lock(&gateway.faults).on.clear();
        }
        Ok(())
    }

    async fn totals(&self, gateway: &Gateway) -> Totals {
        let mut totals = Totals::default();
        if let Ok((200, faults)) = self.admin_json(gateway, "GET", "/v1/faults", None).await {
            totals.injected = faults["injected"].as_u64().unwrap_or(0);
        }
        if let Ok((200, stats)) = self.admin_json(gateway, "GET", "/v1/stats", None).await
            && let Some(outcomes) = stats["outcomes"].as_object()
        {
            for (name, n) in outcomes {
                totals
                    .outcomes
                    .insert(name.clone(), n.as_u64().unwrap_or(0));
            }
        }
        totals
    }

    /// Everything every gateway counted, killed processes included.
    async fn all_totals(&self) -> (Totals, Vec<u64>) {
        let mut sum = Totals::default();
        let mut injected = Vec::new();
        for gateway in &self.gateways {
            let mut totals = lock(&gateway.earlier).clone();
            totals.add(&self.totals(gateway).await);
            injected.push(totals.injected);
            sum.add(&totals);
        }
        (sum, injected)
    }

    /// `kill -9` one gateway, then start it again on the same ports.
    async fn crash(
        &self,
        gateway: &Gateway,
        started: Instant,
        down: Duration,
    ) -> anyhow::Result<()> {
        // Its counters die with it: read them first.
        let totals = self.totals(gateway).await;
        lock(&gateway.earlier).add(&totals);
        let before = gateway.orders_in_flight();
        let process = lock(&gateway.process).take();
        let pid = process.map(Process::kill);
        let after = gateway.orders_in_flight();
        let hit: HashSet<usize> = before.into_iter().chain(after).collect();
        let orders = hit.len();
        lock(&self.killed_in_flight).extend(hit);
        bump(&self.tally.kills);
        println!(
            "{:>6.1}s kill -9 gateway {} (pid {}), requests of {orders} orders in flight at it",
            started.elapsed().as_secs_f64(),
            gateway.index,
            pid.unwrap_or_default(),
        );
        tokio::time::sleep(down).await;
        let restarting = Instant::now();
        gateway.start()?;
        self.wait_ready(&format!("http://{}/v1/stats", gateway.admin))
            .await
            .with_context(|| format!("gateway {} did not come back", gateway.index))?;
        println!(
            "{:>6.1}s gateway {} restarted on {} after {:.1}s down ({:.1}s to start)",
            started.elapsed().as_secs_f64(),
            gateway.index,
            gateway.proxy,
            (down + restarting.elapsed()).as_secs_f64(),
            restarting.elapsed().as_secs_f64(),
        );
        Ok(())
    }

    /// `kill -STOP` one gateway for `paused` (longer than its lease, so its
    /// claims lapse and are taken over at the other gateway), then `kill
    /// -CONT`: its requests then go on as zombies, under claims they lost.
    async fn pause(
        &self,
        gateway: &Gateway,
        started: Instant,
        paused: Duration,
    ) -> anyhow::Result<()> {
        let pid = gateway
            .pid()
            .with_context(|| format!("gateway {} is not running", gateway.index))?;
        // Marked before the signal, so no request misses it.
        lock(&gateway.paused).begin();
        let stopped = signal(pid, "STOP").await;
        let orders = gateway.orders_in_flight().len();
        println!(
            "{:>6.1}s kill -STOP gateway {} (pid {pid}) for {:.1}s, past its {:.1}s lease; requests of {orders} orders in flight at it",
            started.elapsed().as_secs_f64(),
            gateway.index,
            paused.as_secs_f64(),
            self.lease.as_secs_f64(),
        );
        if stopped.is_ok() {
            tokio::time::sleep(paused).await;
        }
        let continued = signal(pid, "CONT").await;
        lock(&gateway.paused).holds = false;
        stopped.and(continued)?;
        bump(&self.tally.pauses);
        println!(
            "{:>6.1}s kill -CONT gateway {}",
            started.elapsed().as_secs_f64(),
            gateway.index
        );
        Ok(())
    }

    /// Polls `url` until it answers 200.
    async fn wait_ready(&self, url: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            let request = Request::get(url).body(Body::empty())?;
            if let Ok(Ok(answer)) =
                tokio::time::timeout(Duration::from_secs(2), self.send(request)).await
                && answer.status == 200
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{url} did not answer within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The key's record, read through the first gateway's admin API.
    async fn stored(&self, id: &str) -> Stored {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", self.authorization.clone());
        // The gateways run with the default client header (`authorization`),
        // so the store key is the scope the default config computes.
        let config = idem::server::Config::default();
        let scoped = idem::server::gate::scoped_key(&headers, &config, id);
        let path = format!("/v1/keys/{}", scoped.replace('/', "%2F"));
        let mut last_error = String::new();
        for _ in 0..5 {
            match self.admin_json(&self.gateways[0], "GET", &path, None).await {
                Ok((404, _)) => return Stored::Missing,
                Ok((200, key)) if key["state"] == "processing" => return Stored::Processing,
                Ok((200, key)) => {
                    let response = &key["response"];
                    let body = response["body_base64"]
                        .as_str()
                        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
                    return match (response["status"].as_u64(), body) {
                        (Some(status), Some(body)) => Stored::Done {
                            status: status as u16,
                            body,
                        },
                        _ => Stored::Unreadable(format!("no response in {key}")),
                    };
                }
                Ok((status, body)) => last_error = format!("{status} {body}"),
                Err(e) => last_error = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Stored::Unreadable(last_error)
    }
}

/// A fault to switch on: an error, added latency, a timeout or a lost reply,
/// on some of the calls; on `insert` and `replace`, one time in three, a
/// latency spike of 40–90 % of the lease instead (the slow claim of issue 16:
/// a lease stamped before a slow `insert` has little left when the upstream
/// is called). Other latencies stay far below the lease.
fn random_rule(rng: &mut fastrand::Rng, op: Op, lease: Duration) -> FaultRule {
    let probability = f64::from(rng.u32(5..=50)) / 100.0;
    if matches!(op, Op::Insert | Op::Replace) && rng.u32(0..3) == 0 {
        let latency = share_of(lease, rng.u32(SPIKE_PERCENT));
        return FaultRule::delay(latency).with_probability(probability);
    }
    match rng.u32(0..4) {
        0 => FaultRule::error("injected by idem soak").with_probability(probability),
        1 => FaultRule::timeout(Duration::from_millis(rng.u64(20..=200)))
            .with_probability(probability),
        2 => FaultRule::delay(Duration::from_millis(rng.u64(5..=100)))
            .with_probability((probability * 2.0).min(1.0)),
        _ => FaultRule::lost().with_probability(probability.min(0.3)),
    }
}

/// Whether a delay is one of [`random_rule`]'s latency spikes.
fn is_spike(rule: &FaultRule, lease: Duration) -> bool {
    Duration::from_millis(rule.latency_ms) >= share_of(lease, *SPIKE_PERCENT.start())
}

/// `percent` % of `lease`, to the millisecond below.
fn share_of(lease: Duration, percent: u32) -> Duration {
    let ms = lease.as_millis() * u128::from(percent) / 100;
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.store.starts_with("memory:") {
        bail!(
            "--store memory: is private to one process; the gateways need a shared store (redis://… or postgres://…)"
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
    println!(
        "idem soak: {} orders, seed {seed}, store {}, lease {:?}, {} kills",
        args.orders, args.store, args.lease, args.kills
    );
    println!(
        "  upstream timeout {:?}, ledger latency {:?} (slow orders {}–{} % of the lease more), {} pauses",
        soak.upstream_timeout,
        ledger_latency(&args),
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
        "latency spikes of {}–{} % of the lease on insert and replace; gateways stopped with SIGSTOP past their lease.",
        SPIKE_PERCENT.start(),
        SPIKE_PERCENT.end()
    );

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

    let report = check(&orders, &books, stock_at_start, &stored);
    print_figures(&Figures {
        tally: &soak.tally,
        totals: &totals,
        injected_by_gateway: &injected_by_gateway,
        books: &books,
        report: &report,
        orders_planned: args.orders,
        kills_planned: args.kills,
        pauses_planned: args.pauses,
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

/// The gateways' upstream timeout: below the lease, as `idem serve` requires.
fn upstream_timeout(lease: Duration) -> Duration {
    lease.mul_f64(0.75)
}

fn ledger_latency(args: &Args) -> Duration {
    args.ledger_latency.unwrap_or(args.lease / 10)
}

/// What happens to a gateway mid-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upset {
    /// `kill -9`, then a restart on the same ports.
    Kill,
    /// `kill -STOP` past the lease, then `kill -CONT`.
    Pause,
}

/// When (orders done) each upset comes and to which gateway, the last
/// first: kills at even steps through the orders, pauses halfway between
/// steps of their own, each alternating gateways. One runs at a time; the
/// clients go on throughout.
fn upsets(kills: usize, pauses: usize, orders: usize, seed: u64) -> Vec<(u64, Upset, usize)> {
    let kill_at = (1..=kills).map(|k| {
        let at = (orders * k / (kills + 1)) as u64;
        (at, Upset::Kill, (k + usize::from(seed % 2 == 1)) % 2)
    });
    let pause_at = (1..=pauses).map(|k| {
        let at = (orders * (2 * k - 1) / (2 * pauses)) as u64;
        (
            at,
            Upset::Pause,
            (k + usize::from(seed.is_multiple_of(2))) % 2,
        )
    });
    let mut all: Vec<_> = kill_at.chain(pause_at).collect();
    all.sort_by_key(|&(at, upset, _)| std::cmp::Reverse((at, upset == Upset::Pause)));
    all
}

/// The orders, decided up front from the seed; `run_id` keeps their ids apart from other runs'.
/// One order in four is slow: 40–60 % of the `lease` at the ledger, besides its latency.
fn plans(orders: usize, seed: u64, run_id: u32, lease: Duration) -> Vec<Plan> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..orders)
        .map(|i| Plan {
            id: format!("soak-{run_id:08x}-{i:05}"),
            qty: rng.i64(1..=3),
            cents: 500 + rng.i64(0..200) * 5,
            behaviour: Behaviour::pick(&mut rng),
            gateway: rng.usize(..2),
            work_ms: (rng.u32(0..4) == 0).then(|| {
                let work = share_of(lease, rng.u32(SLOW_ORDER_PERCENT));
                u64::try_from(work.as_millis()).unwrap_or(u64::MAX)
            }),
            impatience: 0.5 + 0.7 * rng.f64(),
        })
        .collect()
}

impl Soak {
    /// Starts the ledger and both gateways and waits until they answer.
    async fn start(args: &Args, stock_at_start: i64, run_id: u32) -> anyhow::Result<Soak> {
        let [ledger_port, proxy_0, admin_0, proxy_1, admin_1] = free_ports()?;
        let ledger = Process::spawn(&[
            "ledger".into(),
            "--listen".into(),
            format!("127.0.0.1:{ledger_port}"),
            "--stock".into(),
            stock_at_start.to_string(),
            "--latency".into(),
            format!("{}ms", ledger_latency(args).as_millis()),
        ])?;
        let upstream_timeout = upstream_timeout(args.lease);
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
                "--require-key",
                "true",
                "--lease",
                &format!("{}ms", args.lease.as_millis()),
                "--upstream-timeout",
                &format!("{}ms", upstream_timeout.as_millis()),
                "--retention",
                "10m",
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
            killed_in_flight: Mutex::default(),
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
        let mut upsets_left = upsets(args.kills, args.pauses, args.orders, seed);
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
    }
}

struct Figures<'a> {
    tally: &'a Tally,
    totals: &'a Totals,
    injected_by_gateway: &'a [u64],
    books: &'a Books,
    report: &'a Report,
    orders_planned: usize,
    kills_planned: usize,
    pauses_planned: usize,
    lease: Duration,
    orders: &'a [OrderLog],
    elapsed: Duration,
}

#[allow(clippy::too_many_lines)] // one line of the report after another
fn print_figures(f: &Figures) {
    let (t, r) = (f.tally, f.report);
    let answered_2xx = f.orders.iter().filter(|o| !o.bodies.is_empty()).count();
    let reused = f
        .orders
        .iter()
        .filter(|o| o.reuse != Reuse::NotSent)
        .count();
    let runs: u64 = f.books.executions.values().sum();
    let duplicates_prevented = get(&t.replayed) + get(&t.in_flight);
    let toggles = get(&t.faults_on) + get(&t.faults_off);
    let injected: u64 = f.injected_by_gateway.iter().sum();
    let conserved = !r.violations.iter().any(|v| v.starts_with("stock"));
    println!("figures after {:.1}s:", f.elapsed.as_secs_f64());
    println!(
        "  orders            {} of {} placed; {answered_2xx} answered 2xx; {reused} keys reused with another body",
        f.orders.len(),
        f.orders_planned
    );
    println!(
        "  requests          {} sent: 2xx executed {}, 2xx replayed {}, 409 in flight {}, 422 conflict {}, 503 store down {}, other 5xx {}, other {}; connection errors {}, client timeouts {}, gave up after {MAX_TRIES} tries {}",
        get(&t.sent),
        get(&t.executed),
        get(&t.replayed),
        get(&t.in_flight),
        get(&t.conflict),
        get(&t.unavailable),
        get(&t.upstream_failed),
        get(&t.other),
        get(&t.connection_errors),
        get(&t.timeouts),
        get(&t.gave_up),
    );
    let outcome = |name| f.totals.outcome(name);
    println!(
        "  gateways said     executed {}, replayed {}, in flight {}, conflict {}, unavailable {}, invalid {}",
        outcome("executed"),
        outcome("replayed"),
        outcome("in_flight"),
        outcome("conflict"),
        outcome("unavailable"),
        outcome("invalid"),
    );
    println!(
        "  faults            {toggles} toggles ({} on, {} off); {injected} store calls hit (by gateway: {:?})",
        get(&t.faults_on),
        get(&t.faults_off),
        f.injected_by_gateway
    );
    println!(
        "  crashes           {} of {} planned (kill -9 of a gateway mid-run, restarted on the same port)",
        get(&t.kills),
        f.kills_planned
    );
    let at_pause = f.orders.iter().filter(|o| o.at_pause).count();
    println!(
        "  pauses            {} of {} planned (kill -STOP of a gateway for 1.2–2 leases, then kill -CONT); {at_pause} orders had a request at a stopped gateway",
        get(&t.pauses),
        f.pauses_planned
    );
    println!(
        "  latency spikes    {} switched on (a delay of {}–{} % of the {:.1}s lease on insert or replace, on some of the calls)",
        get(&t.spikes_on),
        SPIKE_PERCENT.start(),
        SPIKE_PERCENT.end(),
        f.lease.as_secs_f64()
    );
    println!(
        "  duplicates        {duplicates_prevented} prevented ({} replays + {} 409s); {} reused keys refused with 422",
        get(&t.replayed),
        get(&t.in_flight),
        get(&t.conflict),
    );
    println!(
        "  ledger            {} orders, {runs} handler runs, {} reservations, {} charges, stock {} ({})",
        f.books.executions.len(),
        f.books.reservations.len(),
        f.books.charges.len(),
        f.books.stock,
        if conserved {
            "conserved"
        } else {
            "NOT conserved"
        }
    );
    println!(
        "  re-executions     {} orders ran more than once: {} in flight at a kill, {} under a store fault, {} after a slow or failed upstream call, {} at a stopped gateway",
        r.reexecuted,
        r.reexecuted_at_kill,
        r.reexecuted_under_fault,
        r.reexecuted_slow,
        r.reexecuted_paused
    );
    println!(
        "                    (a claim whose holder was killed, or whose response a store fault kept from being recorded,\n                     is taken over after its lease and runs again under a new fence; the ledger absorbs the repeat)"
    );
    println!(
        "  stored responses  {} match the ledger; {} keys left claimed (response never recorded)",
        r.stored_matching, r.left_processing
    );
    println!(
        "  2xx bodies        {} checked against their key's kept response (first answers and replays alike); any other body is a violation",
        r.answers_checked
    );
    println!(
        "  overlapping runs  {} pairs of runs of one key overlapped in time; allowed only as a takeover under a higher fence whose earlier run's response was refused",
        r.overlapping_runs
    );
    println!("  violations        {}", r.violations.len());
    for violation in r.violations.iter().take(20) {
        println!("    {violation}");
    }
    if r.violations.len() > 20 {
        println!("    … and {} more", r.violations.len() - 20);
    }
    println!(
        "soak: orders={} requests={} crashes={} fault_toggles={toggles} faults_injected={injected} duplicates_prevented={duplicates_prevented} reexecuted={} violations={} pauses={} spikes={} answers_checked={} overlapping_runs={}",
        f.orders.len(),
        get(&t.sent),
        get(&t.kills),
        r.reexecuted,
        r.violations.len(),
        get(&t.pauses),
        get(&t.spikes_on),
        r.answers_checked,
        r.overlapping_runs,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: &str) -> OrderLog {
        OrderLog {
            id: id.into(),
            qty: 1,
            cents: 700,
            bodies: vec![answer(id, 1)],
            status: Some(201),
            ..OrderLog::default()
        }
    }

    fn body(id: &str, cents: i64) -> Vec<u8> {
        body_of(id, cents, 1)
    }

    fn body_of(id: &str, cents: i64, execution: u64) -> Vec<u8> {
        json!({"order": id, "status": "paid", "cents": cents, "stock_left": 9, "execution": execution})
            .to_string()
            .into_bytes()
    }

    /// A first answer with the body of `execution` of order `id` (700 cents).
    fn answer(id: &str, execution: u64) -> Seen {
        Seen {
            body: body_of(id, 700, execution),
            ..Seen::default()
        }
    }

    /// Another run of `id` under `fence`, from `started_ms` to `ended_ms`.
    fn rerun(books: &mut Books, id: &str, fence: u64, started_ms: u64, ended_ms: u64) {
        let n = books.executions.get_mut(id).unwrap();
        *n += 1;
        books.fences.get_mut(id).unwrap().push(fence);
        books.runs.get_mut(id).unwrap().push(Run {
            fence: Some(fence),
            started_ms,
            ended_ms,
            execution: *n,
        });
    }

    /// The books after `order` ran once under fence 1 from a stock of 10.
    fn books_for(orders: &[&OrderLog]) -> Books {
        let mut books = Books {
            stock: 10,
            ..Books::default()
        };
        for o in orders {
            books.stock -= o.qty;
            books.reservations.insert(o.id.clone(), o.qty);
            books.charges.insert(o.id.clone(), o.cents);
            books.executions.insert(o.id.clone(), 1);
            books.fences.insert(o.id.clone(), vec![1]);
            books.runs.insert(
                o.id.clone(),
                vec![Run {
                    fence: Some(1),
                    started_ms: 1_000,
                    ended_ms: 1_100,
                    execution: 1,
                }],
            );
        }
        books
    }

    fn done(id: &str, cents: i64) -> Stored {
        Stored::Done {
            status: 201,
            body: body(id, cents),
        }
    }

    #[test]
    fn a_clean_run_has_no_violations() {
        let (a, b) = (order("a"), order("b"));
        let books = books_for(&[&a, &b]);
        let report = check(&[a, b], &books, 10, &[done("a", 700), done("b", 700)]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.stored_matching, 2);
    }

    /// Each case breaks one thing; the checker must name it.
    #[test]
    #[allow(clippy::too_many_lines)] // one case per kind of violation
    fn every_kind_of_violation_is_reported() {
        type Break = fn(&mut Vec<OrderLog>, &mut Books, &mut Vec<Stored>);
        let cases: &[(&str, Break, &str)] = &[
            (
                "a double charge",
                |_, books, _| {
                    books.stock -= 1;
                    *books.reservations.get_mut("a").unwrap() += 1;
                    *books.charges.get_mut("a").unwrap() += 700;
                    *books.executions.get_mut("a").unwrap() += 1;
                    books.fences.get_mut("a").unwrap().push(2);
                },
                "charged 1400 cents",
            ),
            (
                "stock taken without a reservation",
                |_, books, _| books.stock -= 1,
                "stock is not conserved",
            ),
            (
                "a 2xx with no charge",
                |_, books, _| {
                    books.stock += 1;
                    books.reservations.remove("a");
                    books.charges.remove("a");
                },
                "the ledger has no charge",
            ),
            (
                "another order's body",
                |orders, _, _| orders[0].bodies.push(answer("b", 1)),
                "got the body of order b",
            ),
            (
                "a body with other cents",
                |orders, _, _| {
                    orders[0].bodies.push(Seen {
                        body: body("a", 701),
                        ..Seen::default()
                    });
                },
                "a body with 701 cents",
            ),
            (
                "a stored response that differs",
                |_, _, stored| stored[0] = done("a", 1),
                "the stored response",
            ),
            (
                "a reused key that ran",
                |orders, _, _| orders[0].reuse = Reuse::Answered(201),
                "got 201, not 422",
            ),
            (
                "an order never answered",
                |orders, _, _| orders[0].status = None,
                "no client ever got a final answer",
            ),
            (
                "an unexplained re-run",
                |_, books, _| rerun(books, "a", 2, 5_000, 5_100),
                "no kill, store fault, pause or slow request",
            ),
            (
                "two runs under one fence",
                |orders, books, _| {
                    orders[0].at_kill = true;
                    rerun(books, "a", 1, 5_000, 5_100);
                },
                "two runs under one claim",
            ),
            (
                "a run with no times",
                |_, books, _| books.runs.get_mut("a").unwrap().clear(),
                "with their times recorded",
            ),
            (
                "two different 2xx bodies",
                |orders, books, _| {
                    orders[0].under_fault = true; // explains the re-run, not the body
                    rerun(books, "a", 2, 5_000, 5_100);
                    orders[0].bodies.push(answer("a", 2));
                },
                "two different 2xx bodies",
            ),
            (
                "a replay of a response the key did not keep",
                |orders, books, _| {
                    orders[0].under_fault = true;
                    rerun(books, "a", 2, 5_000, 5_100);
                    orders[0].bodies.push(Seen {
                        replayed: true,
                        ..answer("a", 2)
                    });
                },
                "a replay gave the body of execution Some(2)",
            ),
            (
                "overlapping runs, the later under a lower fence",
                |orders, books, _| {
                    orders[0].at_pause = true;
                    books.runs.get_mut("a").unwrap()[0].fence = Some(3);
                    books.fences.insert("a".into(), vec![3]);
                    rerun(books, "a", 2, 1_050, 1_150);
                },
                "the later has no higher fence",
            ),
            (
                "overlapping runs, the earlier's response kept",
                |orders, books, _| {
                    orders[0].at_pause = true;
                    rerun(books, "a", 2, 1_050, 1_150);
                },
                "the earlier's response was kept or replayed",
            ),
            (
                "a charge with no record",
                |_, _, stored| stored[0] = Stored::Missing,
                "no record of its key",
            ),
            (
                "an order no client sent",
                |_, books, _| {
                    books.executions.insert("z".into(), 1);
                },
                "which no client sent",
            ),
        ];
        for (what, break_it, expected) in cases {
            let mut orders = vec![order("a"), order("b")];
            let mut books = books_for(&[&orders[0], &orders[1]]);
            let mut stored = vec![done("a", 700), done("b", 700)];
            break_it(&mut orders, &mut books, &mut stored);
            let report = check(&orders, &books, 10, &stored);
            assert!(
                report.violations.iter().any(|v| v.contains(expected)),
                "{what}: expected a violation containing {expected:?}, got {:?}",
                report.violations
            );
        }
    }

    #[test]
    fn reruns_after_a_kill_a_fault_or_a_pause_are_counted_not_violations() {
        let (mut a, mut b, mut c) = (order("a"), order("b"), order("c"));
        a.at_kill = true;
        // Left claimed: its client got no 2xx (the gateway died under it).
        a.bodies.clear();
        b.under_fault = true;
        c.at_pause = true;
        let mut books = books_for(&[&a, &b, &c]);
        for id in ["a", "b", "c"] {
            rerun(&mut books, id, 3, 5_000, 5_100);
        }
        let stored = [Stored::Processing, done("b", 700), done("c", 700)];
        let report = check(&[a, b, c], &books, 10, &stored);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(
            (
                report.reexecuted,
                report.reexecuted_at_kill,
                report.reexecuted_under_fault,
                report.reexecuted_paused,
                report.left_processing,
            ),
            (3, 1, 1, 1, 1)
        );
    }

    /// Issue 16's slow claim, as the books and the clients saw it: a claim
    /// whose `insert` took 800 ms of a 2 s lease, an upstream call of 1.4 s
    /// still running when a retry took the lapsed claim over, the first
    /// run's completion refused, and each client answered with its own run.
    fn slow_claim(first_answer_under_fault: bool) -> Report {
        let mut a = order("a");
        a.slow = true; // the old check's only clue: a request slower than the upstream timeout
        a.under_fault = first_answer_under_fault;
        a.bodies.push(answer("a", 2));
        let mut books = books_for(&[&a]);
        books.runs.get_mut("a").unwrap()[0].ended_ms = 1_000 + 1_400;
        rerun(&mut books, "a", 2, 1_000 + 1_250, 1_000 + 2_650);
        check(&[a], &books, 10, &[done_of("a", 2)])
    }

    fn done_of(id: &str, execution: u64) -> Stored {
        Stored::Done {
            status: 201,
            body: body_of(id, 700, execution),
        }
    }

    #[test]
    fn the_slow_claim_of_issue_16_is_two_different_bodies() {
        let report = slow_claim(false);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(
            report.violations[0].contains("two different 2xx bodies"),
            "{:?}",
            report.violations
        );
        // The overlap itself was a takeover whose earlier completion was refused.
        assert_eq!(report.overlapping_runs, 1);
    }

    /// A gateway answers 2xx only once the response is recorded, so a first
    /// answer the key did not keep is a violation even when a store fault
    /// or a pause overlapped its request (the old check excused those).
    #[test]
    fn an_unkept_first_answer_is_a_violation_even_under_a_fault() {
        let report = slow_claim(true);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("a first answer gave the body of execution Some(1)")),
            "{:?}",
            report.violations
        );
        assert_eq!(report.answers_checked, 2);
    }

    #[test]
    fn runs_that_only_touch_do_not_overlap() {
        let mut a = order("a");
        a.under_fault = true;
        let mut books = books_for(&[&a]);
        rerun(&mut books, "a", 2, 1_100, 1_200);
        let report = check(&[a], &books, 10, &[done("a", 700)]);
        assert_eq!(report.overlapping_runs, 0);
    }

    #[test]
    fn upsets_alternate_gateways_and_come_in_order() {
        let mut upsets = upsets(2, 2, 1200, 7);
        upsets.reverse();
        assert_eq!(
            upsets,
            [
                (300, Upset::Pause, 1),
                (400, Upset::Kill, 0),
                (800, Upset::Kill, 1),
                (900, Upset::Pause, 0),
            ]
        );
    }
}
