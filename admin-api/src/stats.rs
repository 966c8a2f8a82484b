//! `GET /v1/stats`.

use crate::Outcome;
use serde::{Deserialize, Serialize};

/// `GET /v1/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub uptime_ms: u64,
    /// The store's name (`memory`, `sqlite`, `redis`, `postgres`).
    pub store: String,
    /// Guarded requests by what the gateway did, since it started.
    pub outcomes: Outcomes<u64>,
    /// The same over the last ten seconds, per second.
    pub rates_per_s: Outcomes<f64>,
    pub store_latency_us: Latency,
    pub pool: Pool,
    /// `None` when no purger runs (a store that purges itself).
    pub purge: Option<Purge>,
    /// Which gateway answers.
    pub gateway: GatewayInfo,
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

/// One counter per [`Outcome`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Outcomes<T> {
    pub executed: T,
    pub replayed: T,
    pub in_flight: T,
    pub conflict: T,
    pub unavailable: T,
    pub invalid: T,
}

impl<T> Outcomes<T> {
    pub fn get_mut(&mut self, outcome: Outcome) -> &mut T {
        match outcome {
            Outcome::Executed => &mut self.executed,
            Outcome::Replayed => &mut self.replayed,
            Outcome::InFlight => &mut self.in_flight,
            Outcome::Conflict => &mut self.conflict,
            Outcome::Unavailable => &mut self.unavailable,
            Outcome::Invalid => &mut self.invalid,
        }
    }
}

/// Store latency percentiles of the latest operations, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
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
pub struct Purge {
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
