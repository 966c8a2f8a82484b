//! `GET /v1/stats`.

use crate::Verdict;
use serde::{Deserialize, Serialize};

/// `GET /v1/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub uptime_ms: u64,
    /// The store's name (`memory`, `sqlite`, `redis`, `postgres`).
    pub store: String,
    /// Guarded requests by what the gateway did, since it started.
    pub outcomes: Verdicts<u64>,
    /// The same over the last ten seconds, per second.
    pub rates_per_s: Verdicts<f64>,
    pub store_latency_us: Percentiles,
    pub pool: Pool,
    /// `None` when no purger runs (a store that purges itself).
    pub purge: Option<PurgeStats>,
    /// The time the guard judges leases and retention by.
    pub clock: Clock,
    /// Whether the gateway has its store yet (it starts without it).
    pub store_connection: StoreConnection,
    /// Requests handled now, by class, against their limits.
    pub slots: Slots,
    /// Which gateway answers.
    pub gateway: GatewayInfo,
}

/// The guard's clock: the store's time authority (`wit/clock.wit`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Clock {
    /// What the time is taken from, e.g. "the Redis server's clock (TIME)".
    pub authority: String,
    /// Its time now, milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The bound on its error against the authority, once it knows it;
    /// `None` before its first reading (every guard call then answers 503).
    pub error_ms: Option<u64>,
    /// Why the time is not known yet, when it is not.
    pub unknown: Option<String>,
    /// How far this host's wall clock is ahead of it (negative: behind).
    /// Decisions never read the wall clock: this is for operators.
    pub wall_offset_ms: i64,
}

/// The gateway's link to its store. A gateway starts whatever its store's
/// state: until the store is opened it answers guarded requests 503 and
/// tries again with backoff; once opened, the store's driver reconnects by
/// itself and outages show as unavailable outcomes instead.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConnection {
    pub state: ConnectionState,
    /// When it entered this state, in Unix milliseconds.
    pub since_ms: u64,
    /// Attempts to open the store so far, the one that succeeded included.
    pub attempts: u64,
    /// Why the latest failed attempt failed (kept once connected: why it
    /// took more than one), `None` if none failed.
    pub last_error: Option<String>,
}

/// [`StoreConnection::state`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionState {
    /// The store is open: requests reach it.
    #[default]
    Connected,
    /// Not opened yet: guarded requests are answered 503 with `Retry-After`.
    Connecting,
}

/// The gateway's slots: guarded requests and those forwarded unguarded
/// each have their own, so neither class can take the other's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Slots {
    /// Keyed requests of a guarded method (`max-concurrent`).
    pub guarded: SlotUse,
    /// Requests forwarded without the guard: no key, or a method not
    /// guarded (`max-concurrent-unguarded`).
    pub unguarded: SlotUse,
}

/// One class of slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotUse {
    /// Requests holding a slot now.
    pub in_use: u64,
    pub limit: u64,
    /// Requests answered 503 since start because every slot was taken.
    pub refused: u64,
}

/// The gateway behind the admin API: what the console names it by.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayInfo {
    /// `idem serve --name`; without one, its proxy's address.
    pub name: String,
    /// Where its proxy listens (`ip:port`); `""` before it serves.
    pub listen: String,
    /// The `idem` version it runs.
    pub version: String,
}

/// One counter per [`Verdict`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Verdicts<T> {
    pub executed: T,
    pub replayed: T,
    pub in_flight: T,
    pub conflict: T,
    pub unavailable: T,
    pub invalid: T,
}

impl<T> Verdicts<T> {
    pub fn get_mut(&mut self, outcome: Verdict) -> &mut T {
        match outcome {
            Verdict::Executed => &mut self.executed,
            Verdict::Replayed => &mut self.replayed,
            Verdict::InFlight => &mut self.in_flight,
            Verdict::Conflict => &mut self.conflict,
            Verdict::Unavailable => &mut self.unavailable,
            Verdict::Invalid => &mut self.invalid,
        }
    }
}

/// Store latency percentiles of the latest operations, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// The guard component's instance pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Pool {
    pub instantiated: u64,
    pub failed: u64,
    pub idle: u64,
    pub in_use: u64,
}

/// What the purger of expired records has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PurgeStats {
    /// Purge periods run (each frees every record expired by its start).
    pub runs: u64,
    /// Records freed in all.
    pub purged: u64,
    /// Periods that stopped on a store error or timeout.
    pub errors: u64,
    /// Records freed by the latest period, and how long it took.
    pub last_purged: u64,
    pub last_took_us: u64,
    /// The latest error's text, if the latest period failed.
    pub last_error: Option<String>,
    /// The purge period.
    pub every_ms: u64,
}
