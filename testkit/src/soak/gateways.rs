//! The processes: the ledger and the two gateways (the product's own
//! `idem serve`, run by this binary), their ports, signals and counters.

use super::chaos::{FaultState, Spell};
use super::check::Stored;
use super::clock::WallClock;
use super::{Soak, lock};
use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{HeaderMap, Request};
use base64::Engine as _;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An `idem ARGS…` child process, killed when dropped: this executable
/// running the product's command line (`idem-testkit idem ARGS…`).
pub(super) struct Process(pub(super) std::process::Child);

impl Process {
    /// `idem ARGS…`, its wall clock `clock` when given.
    pub(super) fn spawn(args: &[String], clock: Option<&WallClock>) -> anyhow::Result<Process> {
        let exe = std::env::current_exe().context("find the idem-testkit executable")?;
        let mut command = Command::new(exe);
        command
            .arg("idem")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // The children take their settings from these flags only.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("IDEM_") {
                command.env_remove(name);
            }
        }
        if let Some(clock) = clock {
            clock.apply(&mut command);
        }
        let child = command
            .spawn()
            .with_context(|| format!("start idem {}", args.join(" ")))?;
        Ok(Process(child))
    }

    /// SIGKILL: no drain, no clean close.
    pub(super) fn kill(mut self) -> u32 {
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
pub(super) async fn signal(pid: u32, name: &'static str) -> anyhow::Result<()> {
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
pub(super) fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
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
pub(super) struct Totals {
    pub(super) injected: u64,
    pub(super) outcomes: BTreeMap<String, u64>,
    /// Requests answered 503 for want of a slot: guarded, unguarded.
    pub(super) guarded_refused: u64,
    pub(super) unguarded_refused: u64,
}

impl Totals {
    pub(super) fn add(&mut self, other: &Totals) {
        self.injected += other.injected;
        self.guarded_refused += other.guarded_refused;
        self.unguarded_refused += other.unguarded_refused;
        for (name, n) in &other.outcomes {
            *self.outcomes.entry(name.clone()).or_default() += n;
        }
    }

    pub(super) fn outcome(&self, name: &str) -> u64 {
        self.outcomes.get(name).copied().unwrap_or(0)
    }
}

/// One gateway: its addresses stay, its process comes and goes.
pub(super) struct Gateway {
    pub(super) index: usize,
    pub(super) proxy: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) args: Vec<String>,
    pub(super) process: Mutex<Option<Process>>,
    pub(super) faults: Mutex<FaultState>,
    /// Stopped with SIGSTOP.
    pub(super) paused: Mutex<Spell>,
    /// Order index → requests of it now at this gateway.
    pub(super) in_flight: Mutex<HashMap<usize, u32>>,
    /// Counters of the processes killed so far.
    pub(super) earlier: Mutex<Totals>,
    /// Its wall clock, skewed and stepped (`--skew`, `--clock-steps`).
    pub(super) clock: Option<WallClock>,
}

impl Gateway {
    pub(super) fn start(&self) -> anyhow::Result<()> {
        *lock(&self.process) = Some(Process::spawn(&self.args, self.clock.as_ref())?);
        *lock(&self.faults) = FaultState::default();
        Ok(())
    }

    /// Whether a disruptive fault is on, and how many have gone on, as a request starts.
    pub(super) fn fault_mark(&self) -> Spell {
        let faults = lock(&self.faults);
        Spell {
            holds: faults.disruptive(),
            begun: faults.generation,
        }
    }

    /// Whether a disruptive fault was on at any time since `mark`.
    pub(super) fn disrupted_since(&self, mark: Spell) -> bool {
        self.fault_mark().since(mark)
    }

    pub(super) fn pid(&self) -> Option<u32> {
        lock(&self.process).as_ref().map(|p| p.0.id())
    }

    pub(super) fn enter(&self, order: usize) {
        *lock(&self.in_flight).entry(order).or_default() += 1;
    }

    pub(super) fn leave(&self, order: usize) {
        let mut in_flight = lock(&self.in_flight);
        if let Some(n) = in_flight.get_mut(&order) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&order);
            }
        }
    }

    pub(super) fn orders_in_flight(&self) -> Vec<usize> {
        lock(&self.in_flight).keys().copied().collect()
    }
}

impl Soak {
    pub(super) async fn totals(&self, gateway: &Gateway) -> Totals {
        let mut totals = Totals::default();
        if let Ok((200, faults)) = self.admin_json(gateway, "GET", "/v1/faults", None).await {
            totals.injected = faults["injected"].as_u64().unwrap_or(0);
        }
        if let Ok((200, stats)) = self.admin_json(gateway, "GET", "/v1/stats", None).await {
            for (name, n) in stats["outcomes"].as_object().into_iter().flatten() {
                totals
                    .outcomes
                    .insert(name.clone(), n.as_u64().unwrap_or(0));
            }
            let refused = |class: &str| stats["slots"][class]["refused"].as_u64().unwrap_or(0);
            totals.guarded_refused = refused("guarded");
            totals.unguarded_refused = refused("unguarded");
        }
        totals
    }

    /// Everything every gateway counted, killed processes included.
    pub(super) async fn all_totals(&self) -> (Totals, Vec<u64>) {
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

    /// Polls `url` until it answers 200.
    pub(super) async fn wait_ready(&self, url: &str) -> anyhow::Result<()> {
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
    pub(super) async fn stored(&self, id: &str) -> Stored {
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
