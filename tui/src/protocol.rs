//! What the console and its admin client tell each other: the client
//! reports [`Update`]s, the state answers with [`Command`]s. Neither side
//! imports the other; both import this.

use crate::api::{
    DecisionEvent, Event, FaultEvent, FaultRule, Faults, KeyDetail, KeyHistory, KeyPage, Op, Stats,
};
pub use crate::api::{KeyQuery, Order, Sort};

/// What the console asks of the admin client.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Poll this query from now on (and at once).
    Query(KeyQuery),
    /// Poll this key's detail from now on (`None`: stop).
    Watch(Option<String>),
    /// Poll this key's history from now on (`None`: stop).
    History(Option<String>),
    Release(String),
    Expire(String),
    Delete(String),
    SetFault(Op, FaultRule),
    /// Put this text on the terminal's clipboard (OSC 52). The shell around
    /// the state does it; the admin client ignores it.
    Copy(String),
}

/// What the admin client reports.
// A page of keys makes `Keys` the big variant; each update is built, moved
// once and dropped, so boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A page of keys, with the query it answers (a late answer to an old
    /// query is dropped).
    Keys {
        query: KeyQuery,
        page: KeyPage,
    },
    /// The admin API answers, but its store could not list the keys (503):
    /// why. The last page stays on screen.
    KeysUnavailable(String),
    Detail(KeyDetail),
    /// The watched key no longer exists.
    DetailGone(String),
    Faults(Faults),
    Stats(Stats),
    Decision(DecisionEvent),
    Fault(FaultEvent),
    /// Any other event of the stream: an operator's action, a renewal, a
    /// store error.
    Event(Event),
    /// The history of the key whose history is open.
    History(KeyHistory),
    Connected,
    /// The server cannot be reached (or answers garbage); the client retries.
    Disconnected(String),
    /// The server answers, but refuses the console's credentials (401/403):
    /// retrying will not help until the operator passes the right token.
    Unauthorized {
        status: u16,
        detail: String,
    },
    /// An operator action went through.
    Done(String),
    /// An operator action was refused; the text names why.
    Failed(String),
}
