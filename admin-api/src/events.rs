//! `GET /v1/events`: server-sent events, one JSON object each.

use crate::{FaultRule, Op};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// While no event comes, the stream sends an SSE comment at least this
/// often, so that a client can tell a quiet stream from a dead one.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// What the gateway did with one guarded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Forwarded: the upstream ran it.
    Executed,
    /// Answered from the store.
    Replayed,
    /// Refused: the key's first request was still running.
    InFlight,
    /// Refused: the key was used for another request.
    Conflict,
    /// Refused: the store (or the guard) failed, or the gateway was overloaded.
    Unavailable,
    /// Refused: the key or the request was malformed.
    Invalid,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::Conflict,
        Outcome::Unavailable,
        Outcome::Invalid,
    ];

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

/// `event: decision`: one guarded request decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub ts_ms: u64,
    pub key: String,
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub latency_us: u64,
    pub detail: Option<String>,
}

/// `event: fault`: one operation's rule changed through the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    pub ts_ms: u64,
    pub op: Op,
    #[serde(flatten)]
    pub rule: FaultRule,
}

/// One event of the stream: its SSE `event:` name and its `data:` JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Decision(DecisionEvent),
    Fault(FaultEvent),
}

impl Event {
    /// The `event:` field.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Decision(_) => "decision",
            Event::Fault(_) => "fault",
        }
    }

    /// The `data:` field: one line of JSON.
    pub fn data(&self) -> String {
        match self {
            Event::Decision(d) => serde_json::to_string(d),
            Event::Fault(f) => serde_json::to_string(f),
        }
        .unwrap_or_default()
    }

    /// The event an SSE `event:`/`data:` pair carries; `None` for an event
    /// this version does not know (a newer server may send more) or data
    /// that does not decode.
    pub fn decode(name: &str, data: &str) -> Option<Event> {
        match name {
            "decision" => serde_json::from_str(data).ok().map(Event::Decision),
            "fault" => serde_json::from_str(data).ok().map(Event::Fault),
            _ => None,
        }
    }
}
