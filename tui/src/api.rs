//! The Admin API v1 wire types, exactly as the server serializes them.
//!
//! Kept apart from the client so that the state (`app.rs`) and the tests can
//! build them without any I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A key's state as the store records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    Processing,
    Done,
}

/// One row of `GET /v1/keys`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub key: String,
    pub state: KeyState,
    pub fence: u64,
    pub version: u64,
    pub lease_until_ms: u64,
    pub lease_remaining_ms: u64,
    pub expires_at_ms: u64,
    pub expires_in_ms: u64,
    pub fingerprint: String,
    pub status: Option<u16>,
    pub replays: u64,
}

/// `GET /v1/keys`: one page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPage {
    pub now_ms: u64,
    pub keys: Vec<KeyInfo>,
    pub next: Option<String>,
    pub total: Option<u64>,
}

/// The stored response of a completed key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body_bytes: u64,
    pub body_preview: String,
    #[serde(default)]
    pub body_base64: String,
}

/// `GET /v1/keys/{key}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDetail {
    #[serde(flatten)]
    pub info: KeyInfo,
    pub response: Option<StoredResponse>,
}

/// The store operations a fault can hit, in the order the console lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Get,
    Insert,
    Replace,
    Delete,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Get, Op::Insert, Op::Replace, Op::Delete];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Insert => "insert",
            Op::Replace => "replace",
            Op::Delete => "delete",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a fault does to the operation it hits (`idem::store::FaultKind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    #[default]
    Off,
    Error,
    Timeout,
    Delay,
    Lost,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Off => "off",
            FaultKind::Error => "error",
            FaultKind::Timeout => "timeout",
            FaultKind::Delay => "delay",
            FaultKind::Lost => "lost",
        }
    }

    /// Whether `latency_ms` means anything for this kind.
    pub fn uses_latency(self) -> bool {
        matches!(self, FaultKind::Timeout | FaultKind::Delay)
    }
}

/// One operation's fault (`idem::store::FaultRule` serialized with serde).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultRule {
    pub kind: FaultKind,
    pub latency_ms: u64,
    pub probability: f64,
    pub count: Option<u64>,
    pub message: String,
}

impl Default for FaultRule {
    fn default() -> Self {
        FaultRule {
            kind: FaultKind::Off,
            latency_ms: 0,
            probability: 1.0,
            count: None,
            message: String::new(),
        }
    }
}

/// The server refuses latencies above a minute; the console stops there too.
pub const MAX_LATENCY_MS: u64 = 60_000;

/// `GET`/`PUT /v1/faults`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    pub faults: FaultSet,
    #[serde(default)]
    pub injected: u64,
}

/// The rule of every operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultSet {
    pub get: FaultRule,
    pub insert: FaultRule,
    pub replace: FaultRule,
    pub delete: FaultRule,
}

impl FaultSet {
    pub fn rule(&self, op: Op) -> &FaultRule {
        match op {
            Op::Get => &self.get,
            Op::Insert => &self.insert,
            Op::Replace => &self.replace,
            Op::Delete => &self.delete,
        }
    }

    pub fn rule_mut(&mut self, op: Op) -> &mut FaultRule {
        match op {
            Op::Get => &mut self.get,
            Op::Insert => &mut self.insert,
            Op::Replace => &mut self.replace,
            Op::Delete => &mut self.delete,
        }
    }
}

/// Counters per outcome (`outcomes` and `rates_per_s` of `GET /v1/stats`).
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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Pool {
    pub instantiated: u64,
    pub failed: u64,
    pub idle: u64,
    pub in_use: u64,
}

/// `GET /v1/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub uptime_ms: u64,
    pub store: String,
    pub outcomes: Outcomes<u64>,
    pub rates_per_s: Outcomes<f64>,
    pub store_latency_us: Latency,
    pub pool: Pool,
}

/// A guard decision's outcome, as the event stream names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Executed,
    Replayed,
    InFlight,
    Conflict,
    Unavailable,
    Invalid,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::Conflict => "conflict",
            Outcome::Unavailable => "unavailable",
            Outcome::Invalid => "invalid",
        }
    }
}

/// `event: decision`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub ts_ms: u64,
    pub key: String,
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub latency_us: u64,
    pub detail: Option<String>,
}

/// `event: fault`: one operation's rule changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    pub ts_ms: u64,
    pub op: Op,
    #[serde(flatten)]
    pub rule: FaultRule,
}

/// An `application/problem+json` body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
}
