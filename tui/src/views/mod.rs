//! The console's three views, each with its state, its update, its key
//! table and its rendering: [`keys`], [`faults`], [`activity`]. A view never
//! does I/O: what it needs from the server or from the shell around it
//! (a confirmation, a typed value, a status line) comes back as [`Effects`].

pub mod activity;
pub mod faults;
pub mod history;
pub mod keys;

use crate::api::{MAX_LATENCY_MS, Op};
use crate::protocol::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Keys,
    Faults,
    Activity,
}

impl View {
    pub const ALL: [View; 3] = [View::Keys, View::Faults, View::Activity];

    pub fn title(self) -> &'static str {
        match self {
            View::Keys => "Keys",
            View::Faults => "Faults",
            View::Activity => "Activity",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Error,
}

/// An action on a key, waiting for `y`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirm {
    pub verb: KeyVerb,
    pub key: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyVerb {
    Release,
    Expire,
    Delete,
}

impl KeyVerb {
    pub fn question(self) -> &'static str {
        match self {
            KeyVerb::Release => "Release the lease of",
            KeyVerb::Expire => "Expire",
            KeyVerb::Delete => "Delete",
        }
    }

    /// What the operator must know before saying yes: each of these lets
    /// the client's next retry run the request again.
    pub fn warning(self) -> &'static str {
        match self {
            KeyVerb::Release => {
                "The next retry runs the request again, even if the first is still running."
            }
            KeyVerb::Expire | KeyVerb::Delete => {
                "Its stored response is gone: the next retry runs the request again."
            }
        }
    }
}

/// What a line of typed input is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Search,
    Latency(Op),
    Probability(Op),
    Count(Op),
    Message(Op),
    Rule(Op),
}

impl Field {
    pub fn prompt(self) -> String {
        match self {
            Field::Search => "search the client's key".into(),
            Field::Latency(op) => format!("{op} latency in ms (0 to {MAX_LATENCY_MS})"),
            Field::Probability(op) => format!("{op} probability in % (0 to 100)"),
            Field::Count(op) => format!("{op} count (empty or 0 = unlimited)"),
            Field::Message(op) => format!("{op} error message"),
            Field::Rule(op) => {
                format!("{op} rule: [P%][N*]error(msg)|timeout(ms)|delay(ms)|lost|off")
            }
        }
    }
}

/// A line being typed. It starts empty: what is typed replaces the value,
/// which the prompt shows (`was`) for reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub field: Field,
    pub text: String,
    pub was: String,
}

impl Input {
    pub fn new(field: Field, was: impl Into<String>) -> Input {
        Input {
            field,
            text: String::new(),
            was: was.into(),
        }
    }
}

/// Longest typed input; a search longer than any sane key is a typo.
pub const MAX_INPUT: usize = 256;

/// What a view's update asks of the console around it.
#[derive(Debug, Default, PartialEq)]
pub struct Effects {
    pub commands: Vec<Command>,
    pub status: Option<(String, Severity)>,
    pub confirm: Option<Confirm>,
    pub input: Option<Input>,
}

impl Effects {
    pub fn none() -> Effects {
        Effects::default()
    }

    pub fn commands(commands: Vec<Command>) -> Effects {
        Effects {
            commands,
            ..Effects::default()
        }
    }

    pub fn say(text: impl Into<String>, severity: Severity) -> Effects {
        Effects {
            status: Some((text.into(), severity)),
            ..Effects::default()
        }
    }

    pub fn ask(confirm: Confirm) -> Effects {
        Effects {
            confirm: Some(confirm),
            ..Effects::default()
        }
    }

    pub fn prompt(input: Input) -> Effects {
        Effects {
            input: Some(input),
            ..Effects::default()
        }
    }
}
