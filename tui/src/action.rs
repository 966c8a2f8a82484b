//! What the operator (or the server) asks the console to do.
//!
//! Key events become [`Action`]s here, in one table per mode, so every
//! binding is visible in one place and testable without a terminal; the
//! help overlay is generated from the same table ([`bindings`]).

use crate::api::{DecisionEvent, FaultEvent, FaultKind, Faults, KeyDetail, KeyPage, Stats};
use crate::app::{App, KeyQuery, Mode, View};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// Everything that changes the state. `App::update` is the only consumer.
// A page of keys makes `Server` the big variant; each action is built,
// moved once and dropped, so boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Quit,
    ToggleHelp,
    ShowView(View),
    NextView,
    PrevView,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    // Keys
    NextSort,
    ReverseOrder,
    NextStateFilter,
    StartPrefixFilter,
    ClearFilters,
    ToggleDetail,
    AskRelease,
    AskExpire,
    AskDelete,
    Confirm,
    Cancel,
    // Text input (prefix filter, fault fields)
    InputChar(char),
    InputBackspace,
    InputSubmit,
    // Faults
    SetKind(FaultKind),
    ToggleFault,
    LatencyUp,
    LatencyDown,
    ProbabilityUp,
    ProbabilityDown,
    CountUp,
    CountDown,
    EditLatency,
    EditProbability,
    EditCount,
    EditMessage,
    // Activity
    ClearLog,
    // Not from the keyboard
    Tick { local_ms: u64 },
    Resize { width: u16, height: u16 },
    Server(Update),
}

/// What the admin client reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A page of keys, with the query it answers (a late answer to an old
    /// query is dropped).
    Keys {
        query: KeyQuery,
        page: KeyPage,
    },
    Detail(KeyDetail),
    /// The watched key no longer exists.
    DetailGone(String),
    Faults(Faults),
    Stats(Stats),
    Decision(DecisionEvent),
    Fault(FaultEvent),
    Connected,
    Disconnected(String),
    /// An operator action went through.
    Done(String),
    /// An operator action was refused; the text names why.
    Failed(String),
}

/// One documented binding: shown in the help overlay and the footer.
pub struct Binding {
    pub keys: &'static str,
    pub what: &'static str,
}

const fn b(keys: &'static str, what: &'static str) -> Binding {
    Binding { keys, what }
}

/// The bindings of each part of the console, as the help overlay lists them.
pub fn bindings() -> [(&'static str, &'static [Binding]); 4] {
    // Each text fits the help overlay's half of an 80-column screen.
    const GLOBAL: &[Binding] = &[
        b("1 2 3 Tab", "keys, faults, activity"),
        b("?", "this help"),
        b("q  Ctrl-C", "quit"),
    ];
    const KEYS: &[Binding] = &[
        b("↑↓ j k", "move"),
        b("PgUp PgDn", "previous / next page"),
        b("g G Home End", "first / last row"),
        b("s / o", "sort column / order"),
        b("f", "state: all, proc., done"),
        b("/", "filter by key prefix"),
        b("Esc", "back (pane, filters)"),
        b("Enter", "detail pane"),
        b("r / e / d", "release, expire, delete"),
    ];
    const FAULTS: &[Binding] = &[
        b("↑↓ j k", "choose the operation"),
        b("o / e", "off / error"),
        b("t / d / l", "timeout / delay / lost"),
        b("Space", "fault on / off"),
        b("+ / -", "latency ±100 ms"),
        b("] / [", "probability ±10 %"),
        b("> / <", "count ±1 (0: unlimited)"),
        b("L / P", "type latency / prob."),
        b("C / M", "type count / message"),
    ];
    const ACTIVITY: &[Binding] = &[b("c", "clear the decision log")];
    [
        ("Everywhere", GLOBAL),
        ("Keys", KEYS),
        ("Faults", FAULTS),
        ("Activity", ACTIVITY),
    ]
}

/// Maps a key press to an action, given what is on screen.
pub fn from_key(app: &App, key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c' | 'q')) {
        return Some(Action::Quit);
    }
    match app.mode() {
        Mode::Input => Some(match key.code {
            KeyCode::Enter => Action::InputSubmit,
            KeyCode::Esc => Action::Cancel,
            KeyCode::Backspace => Action::InputBackspace,
            KeyCode::Char(c) if !ctrl => Action::InputChar(c),
            _ => return None,
        }),
        Mode::Confirm => match key.code {
            KeyCode::Char('y' | 'Y') | KeyCode::Enter => Some(Action::Confirm),
            KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => Some(Action::Cancel),
            _ => None,
        },
        Mode::Help => match key.code {
            KeyCode::Char('?') | KeyCode::Esc => Some(Action::ToggleHelp),
            KeyCode::Char('q') => Some(Action::Quit),
            _ => None,
        },
        Mode::Normal => global(key.code).or_else(|| match app.view {
            View::Keys => keys_view(key.code),
            View::Faults => faults_view(key.code),
            View::Activity => activity_view(key.code),
        }),
    }
}

fn global(code: KeyCode) -> Option<Action> {
    Some(match code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::ToggleHelp,
        KeyCode::Char('1') => Action::ShowView(View::Keys),
        KeyCode::Char('2') => Action::ShowView(View::Faults),
        KeyCode::Char('3') => Action::ShowView(View::Activity),
        KeyCode::Tab => Action::NextView,
        KeyCode::BackTab => Action::PrevView,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Home,
        KeyCode::End | KeyCode::Char('G') => Action::End,
        _ => return None,
    })
}

fn keys_view(code: KeyCode) -> Option<Action> {
    Some(match code {
        KeyCode::Char('s') => Action::NextSort,
        KeyCode::Char('o') => Action::ReverseOrder,
        KeyCode::Char('f') => Action::NextStateFilter,
        KeyCode::Char('/') => Action::StartPrefixFilter,
        KeyCode::Esc => Action::ClearFilters,
        KeyCode::Enter => Action::ToggleDetail,
        KeyCode::Char('r') => Action::AskRelease,
        KeyCode::Char('e') => Action::AskExpire,
        KeyCode::Char('d') | KeyCode::Delete => Action::AskDelete,
        _ => return None,
    })
}

fn faults_view(code: KeyCode) -> Option<Action> {
    Some(match code {
        KeyCode::Char('o') => Action::SetKind(FaultKind::Off),
        KeyCode::Char('e') => Action::SetKind(FaultKind::Error),
        KeyCode::Char('t') => Action::SetKind(FaultKind::Timeout),
        KeyCode::Char('d') => Action::SetKind(FaultKind::Delay),
        KeyCode::Char('l') => Action::SetKind(FaultKind::Lost),
        KeyCode::Char(' ') => Action::ToggleFault,
        KeyCode::Char('+' | '=') => Action::LatencyUp,
        KeyCode::Char('-' | '_') => Action::LatencyDown,
        KeyCode::Char(']') => Action::ProbabilityUp,
        KeyCode::Char('[') => Action::ProbabilityDown,
        KeyCode::Char('>' | '.') => Action::CountUp,
        KeyCode::Char('<' | ',') => Action::CountDown,
        KeyCode::Char('L') => Action::EditLatency,
        KeyCode::Char('P') => Action::EditProbability,
        KeyCode::Char('C') => Action::EditCount,
        KeyCode::Char('M') => Action::EditMessage,
        _ => return None,
    })
}

fn activity_view(code: KeyCode) -> Option<Action> {
    match code {
        KeyCode::Char('c') => Some(Action::ClearLog),
        _ => None,
    }
}
