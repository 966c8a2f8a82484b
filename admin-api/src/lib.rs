//! The admin API v1's contract: every request and response body of
//! `/v1/keys` (and a key's history), `/v1/faults`, `/v1/stats` and `/v1/events` as a serde type,
//! and the fault rules' one text form. The gateway (`idem::server::admin`)
//! serializes them, the console (`idem-tui`) and its test fake decode and
//! send them, so the three cannot drift apart. No I/O and no engine: the
//! console builds it without wasmtime, the gateway without ratatui.
//!
//! ```
//! use idem_admin_api::{Faults, Op};
//! let faults: Faults = serde_json::from_str(
//!     r#"{"faults":{"insert":{"kind":"timeout","latency_ms":500,"probability":0.25,"count":3,"message":""}},"injected":7}"#,
//! ).unwrap();
//! assert_eq!(faults.faults.rule(Op::Insert).to_string(), "25%3*timeout(500)");
//! ```

mod events;
mod fault_rule;
mod faults;
mod keys;
mod stats;

pub use events::{
    AdminAction, AdminEvent, DecisionEvent, Event, FaultEvent, KEEP_ALIVE, KeyHistory,
    RenewalEvent, StoreErrorEvent, Verdict,
};
pub use fault_rule::{FaultKind, FaultRule, MAX_LATENCY_MS, Op, ParseFaultError};
pub use faults::{FaultSet, Faults, SetFaults};
pub use keys::{
    DEFAULT_LIMIT, KeyDetail, KeyInfo, KeyListParams, KeyPage, KeyQuery, KeyState, MAX_LIMIT,
    Order, Sort, StoredResponse,
};
pub use stats::{
    Clock, ConnectionState, GatewayInfo, Percentiles, Pool, PurgeStats, SlotUse, Slots, Stats,
    StoreConnection, Verdicts,
};

use serde::{Deserialize, Serialize};

/// The bearer token a token file holds (`idem serve --admin-token-file`,
/// `idem-tui --token-file`): its text less one trailing newline (`\n` or
/// `\r\n`), as `echo TOKEN > FILE` and editors leave it. Nothing else is
/// trimmed, so a token keeps every byte it was given.
///
/// ```
/// assert_eq!(idem_admin_api::token_from_file("s3cret-s3cret-s3\n"), "s3cret-s3cret-s3");
/// assert_eq!(idem_admin_api::token_from_file("a b\r\n\n"), "a b\r\n");
/// ```
pub fn token_from_file(text: &str) -> &str {
    text.strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(text)
}

/// An `application/problem+json` body (RFC 9457): what every refusal of
/// the admin API carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Problem {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
}

impl Problem {
    /// A problem with `status`'s reason phrase (`title`) as its title.
    pub fn new(status: u16, title: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: "about:blank".into(),
            title: title.into(),
            status,
            detail: detail.into(),
        }
    }
}
