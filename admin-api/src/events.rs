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
pub enum Verdict {
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

impl Verdict {
    pub const ALL: [Verdict; 6] = [
        Verdict::Executed,
        Verdict::Replayed,
        Verdict::InFlight,
        Verdict::Conflict,
        Verdict::Unavailable,
        Verdict::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Executed => "executed",
            Verdict::Replayed => "replayed",
            Verdict::InFlight => "in_flight",
            Verdict::Conflict => "conflict",
            Verdict::Unavailable => "unavailable",
            Verdict::Invalid => "invalid",
        }
    }
}

/// `event: decision`: one guarded request decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub ts_ms: u64,
    /// The store key: the client's scope, `/`, the key it sent.
    pub key: String,
    pub outcome: Verdict,
    pub status: Option<u16>,
    pub latency_us: u64,
    /// Why, in full, for every outcome but a plain execution or replay: the
    /// reason of a 503, what became of an unstored response.
    pub detail: Option<String>,
    /// The fence of the claim the request ran under, when it claimed the
    /// key (an execution, or a refusal after the claim); a fence above 1
    /// means the key had a claim before this one (taken over after its
    /// lease ran out or was released, or claimed again after it expired).
    #[serde(default)]
    pub fence: Option<u64>,
}

/// `event: fault`: one operation's rule changed through the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    pub ts_ms: u64,
    pub op: Op,
    #[serde(flatten)]
    pub rule: FaultRule,
    /// Who changed it: the admin client's address (`ip:port`); `None` for
    /// a change made in process (`idem demo`'s script).
    #[serde(default)]
    pub by: Option<String>,
}

/// What an operator did to a key through the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminAction {
    /// `POST /v1/keys/{key}/release`: the lease ends now.
    Release,
    /// `POST /v1/keys/{key}/expire`: the record (and its response) ends now.
    Expire,
    /// `DELETE /v1/keys/{key}`.
    Delete,
}

impl AdminAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::Release => "release",
            AdminAction::Expire => "expire",
            AdminAction::Delete => "delete",
        }
    }
}

/// `event: admin`: an operator changed a key through the admin API (the
/// audit trail; fault changes are `fault` events, with their `by`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminEvent {
    pub ts_ms: u64,
    pub action: AdminAction,
    /// The store key.
    pub key: String,
    /// The admin client's address (`ip:port`).
    pub by: String,
    /// The record's fence and version before the change.
    pub fence: u64,
    pub version: u64,
}

/// `event: renewal`: a claim this gateway runs had its lease extended
/// while its request was still running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewalEvent {
    pub ts_ms: u64,
    pub key: String,
}

/// `event: store_error`: a store call for a key failed (an injected fault
/// among them: its error says `injected`). The request it served fails
/// closed; its `decision` says how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreErrorEvent {
    pub ts_ms: u64,
    pub key: String,
    pub op: Op,
    pub error: String,
}

/// One event of the stream: its SSE `event:` name and its `data:` JSON. In
/// a key's history (`GET /v1/keys/{key}/history`) each is one object, the
/// name in its `event` field beside the data's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Decision(DecisionEvent),
    Fault(FaultEvent),
    Admin(AdminEvent),
    Renewal(RenewalEvent),
    StoreError(StoreErrorEvent),
}

impl Event {
    /// The `event:` field.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Decision(_) => "decision",
            Event::Fault(_) => "fault",
            Event::Admin(_) => "admin",
            Event::Renewal(_) => "renewal",
            Event::StoreError(_) => "store_error",
        }
    }

    /// When it happened, in ms since the epoch.
    pub fn ts_ms(&self) -> u64 {
        match self {
            Event::Decision(e) => e.ts_ms,
            Event::Fault(e) => e.ts_ms,
            Event::Admin(e) => e.ts_ms,
            Event::Renewal(e) => e.ts_ms,
            Event::StoreError(e) => e.ts_ms,
        }
    }

    /// The store key it is about; `None` for a fault change, which is
    /// about every key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Event::Decision(e) => Some(&e.key),
            Event::Fault(_) => None,
            Event::Admin(e) => Some(&e.key),
            Event::Renewal(e) => Some(&e.key),
            Event::StoreError(e) => Some(&e.key),
        }
    }

    /// The `data:` field: one line of JSON.
    pub fn data(&self) -> String {
        match self {
            Event::Decision(d) => serde_json::to_string(d),
            Event::Fault(f) => serde_json::to_string(f),
            Event::Admin(a) => serde_json::to_string(a),
            Event::Renewal(r) => serde_json::to_string(r),
            Event::StoreError(e) => serde_json::to_string(e),
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
            "admin" => serde_json::from_str(data).ok().map(Event::Admin),
            "renewal" => serde_json::from_str(data).ok().map(Event::Renewal),
            "store_error" => serde_json::from_str(data).ok().map(Event::StoreError),
            _ => None,
        }
    }
}

/// `GET /v1/keys/{key}/history`: what the gateway saw happen to one key,
/// oldest first, from the events it keeps (the newest
/// [`KeyHistory::kept`] of all keys): its decisions, renewals, store
/// errors and admin actions, and the fault changes made between its first
/// and its last event.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeyHistory {
    pub key: String,
    pub events: Vec<Event>,
    /// How many events (of all keys) the gateway keeps; older ones are gone.
    pub kept: u64,
    /// When the oldest event still kept happened (`None`: none kept yet):
    /// the key's history before it is unknown.
    pub since_ms: Option<u64>,
}
