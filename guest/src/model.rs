//! The contract's values as plain Rust types, free of generated bindings, so
//! the decision logic runs and is tested natively. They mirror `wit/types.wit`
//! and `wit/guard.wit` one to one.

use alloc::string::String;
use alloc::vec::Vec;

/// A response as the guarded operation produced it, stored and replayed byte for byte.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The bytes counted against `Policy::max_response_bytes`.
    pub fn size_bytes(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
    }
}

/// What the guard needs of a response it stores or replays, and no more:
/// in the component the response stays on the host (the `response`
/// resource of `wit/types.wit`) and these are its methods; natively it is
/// the [`Response`] itself.
pub trait ResponseHandle {
    fn status(&self) -> u16;
    /// The bytes counted against `Policy::max_response_bytes`.
    fn size(&self) -> u64;
    /// Same status, headers in the same order, same body.
    fn same_as(&self, other: &Self) -> bool;
}

impl ResponseHandle for Response {
    fn status(&self) -> u16 {
        self.status
    }

    fn size(&self) -> u64 {
        self.size_bytes() as u64
    }

    fn same_as(&self, other: &Self) -> bool {
        self == other
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Processing,
    Done,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Processing => "processing",
            State::Done => "done",
        }
    }

    pub fn parse(text: &str) -> Option<State> {
        match text {
            "processing" => Some(State::Processing),
            "done" => Some(State::Done),
            _ => None,
        }
    }
}

/// A recovery point: the step a multi-step operation reached, and what it
/// needs to continue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub phase: String,
    pub data: Vec<u8>,
}

/// What a store keeps for one key. `R` is how the response is held: by
/// value in stores and natively, as a host handle inside the component
/// (where `wit/types.wit` carries it beside the record, not in it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<R = Response> {
    pub fingerprint: String,
    pub state: State,
    /// The holder id of the claim that wrote it; 0 in records of 0.1 hosts.
    pub holder: u64,
    pub lease_until_ms: u64,
    pub expires_at_ms: u64,
    pub response: Option<R>,
    pub checkpoint: Option<Checkpoint>,
}

impl<R> Record<R> {
    /// Whether the record is live at `now_ms`; an expired record is absent.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }

    /// The same record with its response held another way.
    pub fn try_map_response<T, E>(self, f: impl FnOnce(R) -> Result<T, E>) -> Result<Record<T>, E> {
        Ok(Record {
            fingerprint: self.fingerprint,
            state: self.state,
            holder: self.holder,
            lease_until_ms: self.lease_until_ms,
            expires_at_ms: self.expires_at_ms,
            response: self.response.map(f).transpose()?,
            checkpoint: self.checkpoint,
        })
    }
}

impl<R: ResponseHandle> Record<R> {
    /// Every field equal, the responses [`ResponseHandle::same_as`].
    pub fn same_as(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
            && self.state == other.state
            && self.holder == other.holder
            && self.lease_until_ms == other.lease_until_ms
            && self.expires_at_ms == other.expires_at_ms
            && self.checkpoint == other.checkpoint
            && match (&self.response, &other.response) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same_as(b),
                _ => false,
            }
    }
}

/// A record with the version its store gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<R = Response> {
    pub record: Record<R>,
    pub version: u64,
}

impl<R> Entry<R> {
    /// The same entry with its response held another way.
    pub fn try_map_response<T, E>(self, f: impl FnOnce(R) -> Result<T, E>) -> Result<Entry<T>, E> {
        Ok(Entry {
            record: self.record.try_map_response(f)?,
            version: self.version,
        })
    }
}

/// What `insert` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InsertOutcome<R = Response> {
    Inserted(u64),
    Existing(Entry<R>),
}

/// Why a store primitive failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreFailure {
    Unavailable(String),
    Corrupt(String),
}

/// Durations and limits for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub lease_ms: u64,
    pub retention_ms: u64,
    pub max_response_bytes: u32,
}

impl Default for Policy {
    /// A 30 s lease, a 24 h retention window, responses up to 1 MiB.
    fn default() -> Self {
        Policy {
            lease_ms: 30_000,
            retention_ms: 24 * 60 * 60 * 1000,
            max_response_bytes: 1 << 20,
        }
    }
}

/// The right to run the operation for a key, proven by its fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub key: String,
    pub fingerprint: String,
    pub fence: u64,
    pub holder: u64,
    pub lease_until_ms: u64,
    pub expires_at_ms: u64,
    /// The key's last recovery point (after a takeover or `checkpoint`).
    pub checkpoint: Option<Checkpoint>,
}

/// What a caller of `begin` must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<R = Response> {
    Proceed(Claim),
    Replay(R),
    InFlight { retry_after_ms: u64 },
    Conflict,
}

impl<R> Decision<R> {
    /// The same decision with its replay's response held another way.
    pub fn try_map_response<T, E>(
        self,
        f: impl FnOnce(R) -> Result<T, E>,
    ) -> Result<Decision<T>, E> {
        Ok(match self {
            Decision::Proceed(claim) => Decision::Proceed(claim),
            Decision::Replay(response) => Decision::Replay(f(response)?),
            Decision::InFlight { retry_after_ms } => Decision::InFlight { retry_after_ms },
            Decision::Conflict => Decision::Conflict,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardError {
    Unavailable(String),
    InvalidInput(String),
    StaleClaim(String),
}

impl core::fmt::Display for GuardError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GuardError::Unavailable(why) => write!(f, "idempotency store unavailable: {why}"),
            GuardError::InvalidInput(why) => write!(f, "invalid input: {why}"),
            GuardError::StaleClaim(why) => write!(f, "stale claim: {why}"),
        }
    }
}

impl core::error::Error for GuardError {}
