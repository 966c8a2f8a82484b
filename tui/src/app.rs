//! The console's state and its one transition, [`App::update`]. No I/O:
//! the admin client reports through [`Update`]s, and what the console needs
//! from the server comes back out of `update` as [`Command`]s.
//!
//! ```
//! use idem_tui::action::Action;
//! use idem_tui::app::{App, View};
//! let mut app = App::new("http://127.0.0.1:9090", 0, (120, 40));
//! app.update(Action::ShowView(View::Faults));
//! assert_eq!(app.view, View::Faults);
//! ```

use crate::action::{Action, Update};
use crate::api::{
    DecisionEvent, FaultEvent, FaultKind, FaultRule, Faults, KeyDetail, KeyInfo, KeyState,
    MAX_LATENCY_MS, Op, Outcome, Outcomes, Stats,
};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// Rows per page asked of the server: a screenful or two. The server pages
/// through the rest, so the console holds one page whatever the store holds.
pub const PAGE_SIZE: u32 = 100;
/// Samples of the rates kept for the sparklines (one per stats poll).
pub const HISTORY: usize = 240;
/// Lines of the decision log kept.
pub const LOG_LINES: usize = 1000;

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

/// Which key table the keyboard speaks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Help,
    Confirm,
    Input,
}

/// The columns the server can sort 100,000 keys by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sort {
    Key,
    Lease,
    Expires,
    Replays,
}

impl Sort {
    pub const ALL: [Sort; 4] = [Sort::Key, Sort::Lease, Sort::Expires, Sort::Replays];

    pub fn as_str(self) -> &'static str {
        match self {
            Sort::Key => "key",
            Sort::Lease => "lease",
            Sort::Expires => "expires",
            Sort::Replays => "replays",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    Asc,
    Desc,
}

impl Order {
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Asc => "asc",
            Order::Desc => "desc",
        }
    }
}

/// What the keys table shows: `GET /v1/keys` parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyQuery {
    pub state: Option<KeyState>,
    pub prefix: String,
    pub sort: Sort,
    pub order: Order,
    pub after: Option<String>,
    pub limit: u32,
}

impl Default for KeyQuery {
    fn default() -> Self {
        KeyQuery {
            state: None,
            prefix: String::new(),
            sort: Sort::Key,
            order: Order::Asc,
            after: None,
            limit: PAGE_SIZE,
        }
    }
}

/// What the console asks of the admin client.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Poll this query from now on (and at once).
    Query(KeyQuery),
    /// Poll this key's detail from now on (`None`: stop).
    Watch(Option<String>),
    Release(String),
    Expire(String),
    Delete(String),
    SetFault(Op, FaultRule),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    Connecting,
    Connected,
    /// Lost at `since_ms` (local clock); the client keeps retrying.
    Lost {
        error: String,
        since_ms: u64,
        attempts: u32,
    },
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
}

/// What a line of typed input is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Prefix,
    Latency(Op),
    Probability(Op),
    Count(Op),
    Message(Op),
}

impl Field {
    pub fn prompt(self) -> String {
        match self {
            Field::Prefix => "key prefix".into(),
            Field::Latency(op) => format!("{op} latency in ms (0 to {MAX_LATENCY_MS})"),
            Field::Probability(op) => format!("{op} probability in % (0 to 100)"),
            Field::Count(op) => format!("{op} count (empty or 0 = unlimited)"),
            Field::Message(op) => format!("{op} error message"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub field: Field,
    pub text: String,
}

/// Longest typed input; a prefix longer than any sane key is a typo.
pub const MAX_INPUT: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Error,
}

/// One line of the decision log.
#[derive(Clone, Debug, PartialEq)]
pub enum LogLine {
    Decision(DecisionEvent),
    Fault(FaultEvent),
}

/// The keys table: one page from the server and where the operator is in it.
#[derive(Clone, Debug, Default)]
pub struct Keys {
    pub query: KeyQuery,
    /// The `after` cursors of the pages before this one, for PgUp.
    pub previous: Vec<Option<String>>,
    pub rows: Vec<KeyInfo>,
    pub next: Option<String>,
    pub total: Option<u64>,
    pub selected: usize,
    /// First row on screen.
    pub offset: usize,
    /// The longest lease seen, for the countdown bar's full length.
    pub lease_scale_ms: u64,
    pub loaded: bool,
}

impl Keys {
    pub fn selected_key(&self) -> Option<&KeyInfo> {
        self.rows.get(self.selected)
    }

    /// Index of the first row of this page among all matching keys.
    pub fn page_start(&self) -> usize {
        self.previous.len() * self.query.limit as usize
    }
}

/// The whole console.
#[allow(clippy::struct_excessive_bools)] // independent flags, each shown on screen
pub struct App {
    pub admin_url: String,
    pub view: View,
    pub connection: Connection,
    pub keys: Keys,
    pub detail_open: bool,
    pub detail: Option<KeyDetail>,
    pub faults: Faults,
    pub faults_loaded: bool,
    pub fault_selected: usize,
    pub stats: Option<Stats>,
    pub rates: VecDeque<Outcomes<f64>>,
    pub p99_us: VecDeque<u64>,
    pub log: VecDeque<LogLine>,
    /// The latest decision on each key of the page on screen (and only
    /// those, so it is bounded by the page size).
    pub last_outcome: HashMap<String, Outcome>,
    pub help: bool,
    pub confirm: Option<Confirm>,
    pub input: Option<Input>,
    pub status: Option<(String, Severity)>,
    pub should_quit: bool,
    /// The local clock (ms since the epoch), from the last tick.
    pub local_ms: u64,
    /// The server's clock minus ours, from the last page of keys.
    pub clock_offset_ms: i64,
    pub width: u16,
    pub height: u16,
}

impl App {
    pub fn new(admin_url: impl Into<String>, local_ms: u64, (width, height): (u16, u16)) -> Self {
        App {
            admin_url: admin_url.into(),
            view: View::Keys,
            connection: Connection::Connecting,
            keys: Keys::default(),
            detail_open: false,
            detail: None,
            faults: Faults::default(),
            faults_loaded: false,
            fault_selected: 0,
            stats: None,
            rates: VecDeque::with_capacity(HISTORY),
            p99_us: VecDeque::with_capacity(HISTORY),
            log: VecDeque::with_capacity(LOG_LINES),
            last_outcome: HashMap::new(),
            help: false,
            confirm: None,
            input: None,
            status: None,
            should_quit: false,
            local_ms,
            clock_offset_ms: 0,
            width,
            height,
        }
    }

    /// The commands a fresh console sends: what to poll.
    pub fn start(&self) -> Vec<Command> {
        vec![Command::Query(self.keys.query.clone())]
    }

    pub fn mode(&self) -> Mode {
        if self.input.is_some() {
            Mode::Input
        } else if self.confirm.is_some() {
            Mode::Confirm
        } else if self.help {
            Mode::Help
        } else {
            Mode::Normal
        }
    }

    /// The server's time now, as far as the console can tell.
    pub fn now_ms(&self) -> u64 {
        self.local_ms.saturating_add_signed(self.clock_offset_ms)
    }

    pub fn selected_op(&self) -> Op {
        Op::ALL[self.fault_selected.min(Op::ALL.len() - 1)]
    }

    /// Rows of the keys table on screen. `ui.rs` lays the screen out as:
    /// header, summary, body, footer; the table's block takes its borders
    /// and the column header; the detail pane takes the lower half.
    pub fn visible_rows(&self) -> usize {
        let body = usize::from(self.height).saturating_sub(3);
        let table = if self.detail_open { body / 2 } else { body };
        table.saturating_sub(3).max(1)
    }

    /// Applies one action; returns what the client must do.
    #[allow(clippy::too_many_lines)] // one arm per action: the console's behaviour in one table
    pub fn update(&mut self, action: Action) -> Vec<Command> {
        match action {
            Action::Quit => {
                self.should_quit = true;
                vec![]
            }
            Action::ToggleHelp => {
                self.help = !self.help;
                vec![]
            }
            Action::ShowView(view) => {
                self.view = view;
                vec![]
            }
            Action::NextView | Action::PrevView => {
                let i = View::ALL.iter().position(|v| *v == self.view).unwrap_or(0);
                let n = View::ALL.len();
                let i = if action == Action::NextView {
                    (i + 1) % n
                } else {
                    (i + n - 1) % n
                };
                self.view = View::ALL[i];
                vec![]
            }
            Action::Up
            | Action::Down
            | Action::PageUp
            | Action::PageDown
            | Action::Home
            | Action::End => self.navigate(&action),
            Action::NextSort => {
                let i = Sort::ALL
                    .iter()
                    .position(|s| *s == self.keys.query.sort)
                    .unwrap_or(0);
                self.keys.query.sort = Sort::ALL[(i + 1) % Sort::ALL.len()];
                self.requery()
            }
            Action::ReverseOrder => {
                self.keys.query.order = match self.keys.query.order {
                    Order::Asc => Order::Desc,
                    Order::Desc => Order::Asc,
                };
                self.requery()
            }
            Action::NextStateFilter => {
                self.keys.query.state = match self.keys.query.state {
                    None => Some(KeyState::Processing),
                    Some(KeyState::Processing) => Some(KeyState::Done),
                    Some(KeyState::Done) => None,
                };
                self.requery()
            }
            Action::StartPrefixFilter => {
                self.input = Some(Input {
                    field: Field::Prefix,
                    text: self.keys.query.prefix.clone(),
                });
                vec![]
            }
            Action::ClearFilters => {
                // Esc backs out one step: the detail pane first, then the filters.
                if self.detail_open {
                    self.detail_open = false;
                    return vec![Command::Watch(None)];
                }
                if self.keys.query.state.is_none() && self.keys.query.prefix.is_empty() {
                    return vec![];
                }
                self.keys.query.state = None;
                self.keys.query.prefix.clear();
                self.requery()
            }
            Action::ToggleDetail => {
                self.detail_open = !self.detail_open;
                self.keep_selection_visible();
                self.watch()
            }
            Action::AskRelease | Action::AskExpire | Action::AskDelete => {
                let verb = match action {
                    Action::AskRelease => KeyVerb::Release,
                    Action::AskExpire => KeyVerb::Expire,
                    _ => KeyVerb::Delete,
                };
                match self.keys.selected_key() {
                    Some(row) if verb == KeyVerb::Release && row.state != KeyState::Processing => {
                        self.say(
                            format!("{} holds no lease: it is done", row.key),
                            Severity::Error,
                        );
                    }
                    Some(row) => {
                        self.confirm = Some(Confirm {
                            verb,
                            key: row.key.clone(),
                        });
                    }
                    None => self.say("no key selected", Severity::Error),
                }
                vec![]
            }
            Action::Confirm => match self.confirm.take() {
                Some(Confirm { verb, key }) => vec![match verb {
                    KeyVerb::Release => Command::Release(key),
                    KeyVerb::Expire => Command::Expire(key),
                    KeyVerb::Delete => Command::Delete(key),
                }],
                None => vec![],
            },
            Action::Cancel => {
                self.confirm = None;
                self.input = None;
                vec![]
            }
            Action::InputChar(c) => {
                if let Some(input) = &mut self.input
                    && input.text.chars().count() < MAX_INPUT
                {
                    input.text.push(c);
                }
                vec![]
            }
            Action::InputBackspace => {
                if let Some(input) = &mut self.input {
                    input.text.pop();
                }
                vec![]
            }
            Action::InputSubmit => self.submit(),
            Action::SetKind(kind) => self.edit_fault(|rule| {
                rule.kind = kind;
                if kind.uses_latency() && rule.latency_ms == 0 {
                    rule.latency_ms = 500;
                }
                if kind == FaultKind::Error && rule.message.is_empty() {
                    rule.message = "injected by idem-tui".into();
                }
                Ok(())
            }),
            Action::ToggleFault => self.edit_fault(|rule| {
                rule.kind = if rule.kind == FaultKind::Off {
                    FaultKind::Error
                } else {
                    FaultKind::Off
                };
                if rule.kind == FaultKind::Error && rule.message.is_empty() {
                    rule.message = "injected by idem-tui".into();
                }
                Ok(())
            }),
            Action::LatencyUp => self.edit_fault(|r| {
                r.latency_ms = (r.latency_ms + 100).min(MAX_LATENCY_MS);
                Ok(())
            }),
            Action::LatencyDown => self.edit_fault(|r| {
                r.latency_ms = r.latency_ms.saturating_sub(100);
                Ok(())
            }),
            Action::ProbabilityUp => self.edit_fault(|r| {
                r.probability = (((r.probability * 10.0).round() + 1.0) / 10.0).min(1.0);
                Ok(())
            }),
            Action::ProbabilityDown => self.edit_fault(|r| {
                r.probability = (((r.probability * 10.0).round() - 1.0) / 10.0).max(0.0);
                Ok(())
            }),
            Action::CountUp => self.edit_fault(|r| {
                r.count = Some(r.count.map_or(1, |n| n + 1));
                Ok(())
            }),
            Action::CountDown => self.edit_fault(|r| {
                r.count = match r.count {
                    None | Some(0 | 1) => None,
                    Some(n) => Some(n - 1),
                };
                Ok(())
            }),
            Action::EditLatency
            | Action::EditProbability
            | Action::EditCount
            | Action::EditMessage => {
                let op = self.selected_op();
                let rule = self.faults.faults.rule(op);
                let (field, text) = match action {
                    Action::EditLatency => (Field::Latency(op), rule.latency_ms.to_string()),
                    Action::EditProbability => {
                        (Field::Probability(op), format_percent(rule.probability))
                    }
                    Action::EditCount => (
                        Field::Count(op),
                        rule.count.map(|n| n.to_string()).unwrap_or_default(),
                    ),
                    _ => (Field::Message(op), rule.message.clone()),
                };
                self.input = Some(Input { field, text });
                vec![]
            }
            Action::ClearLog => {
                self.log.clear();
                vec![]
            }
            Action::Tick { local_ms } => {
                self.local_ms = local_ms;
                vec![]
            }
            Action::Resize { width, height } => {
                self.width = width;
                self.height = height;
                self.keep_selection_visible();
                vec![]
            }
            Action::Server(update) => self.apply(update),
        }
    }

    fn say(&mut self, text: impl Into<String>, severity: Severity) {
        self.status = Some((text.into(), severity));
    }

    /// The query changed: back to its first page.
    fn requery(&mut self) -> Vec<Command> {
        self.keys.query.after = None;
        self.keys.previous.clear();
        self.keys.selected = 0;
        self.keys.offset = 0;
        self.keys.loaded = false;
        let mut commands = vec![Command::Query(self.keys.query.clone())];
        commands.extend(self.watch());
        commands
    }

    /// After a move: if the detail pane shows another key now, watch it.
    fn rewatch(&self, before: Option<&str>) -> Vec<Command> {
        let now = self.keys.selected_key().map(|k| k.key.as_str());
        if self.detail_open && now != before {
            self.watch()
        } else {
            vec![]
        }
    }

    /// Which key's detail the client should poll.
    fn watch(&self) -> Vec<Command> {
        let key = if self.detail_open {
            self.keys.selected_key().map(|k| k.key.clone())
        } else {
            None
        };
        vec![Command::Watch(key)]
    }

    fn navigate(&mut self, action: &Action) -> Vec<Command> {
        match self.view {
            View::Keys => self.navigate_keys(action),
            View::Faults => {
                let last = Op::ALL.len() - 1;
                self.fault_selected = match action {
                    Action::Up => self.fault_selected.saturating_sub(1),
                    Action::Down => (self.fault_selected + 1).min(last),
                    Action::Home | Action::PageUp => 0,
                    _ => last,
                };
                vec![]
            }
            View::Activity => vec![],
        }
    }

    fn navigate_keys(&mut self, action: &Action) -> Vec<Command> {
        let before = self.keys.selected_key().map(|k| k.key.clone());
        let len = self.keys.rows.len();
        let last = len.saturating_sub(1);
        let page = self.visible_rows();
        let selected = self.keys.selected.min(last);
        match action {
            Action::Up => self.keys.selected = selected.saturating_sub(1),
            Action::Down => self.keys.selected = selected.saturating_add(1).min(last),
            Action::Home => self.keys.selected = 0,
            Action::End => self.keys.selected = last,
            Action::PageDown => {
                if selected >= last && self.keys.next.is_some() {
                    return self.turn_page(true);
                }
                self.keys.selected = selected.saturating_add(page).min(last);
            }
            Action::PageUp => {
                if selected == 0 && !self.keys.previous.is_empty() {
                    return self.turn_page(false);
                }
                self.keys.selected = selected.saturating_sub(page);
            }
            _ => {}
        }
        self.keep_selection_visible();
        self.rewatch(before.as_deref())
    }

    /// Asks the server for the next or the previous page.
    fn turn_page(&mut self, forward: bool) -> Vec<Command> {
        // Until the page asked for arrives, `next` belongs to the old one.
        if !self.keys.loaded {
            return vec![];
        }
        if forward {
            let Some(next) = self.keys.next.clone() else {
                return vec![];
            };
            self.keys.previous.push(self.keys.query.after.take());
            self.keys.query.after = Some(next);
            self.keys.selected = 0;
        } else {
            let Some(after) = self.keys.previous.pop() else {
                return vec![];
            };
            self.keys.query.after = after;
            // Land on the last row of the page before, where PgUp came from.
            self.keys.selected = usize::MAX;
        }
        self.keys.offset = 0;
        self.keys.loaded = false;
        vec![Command::Query(self.keys.query.clone())]
    }

    fn keep_selection_visible(&mut self) {
        let rows = self.visible_rows();
        let keys = &mut self.keys;
        keys.selected = keys.selected.min(keys.rows.len().saturating_sub(1));
        if keys.selected < keys.offset {
            keys.offset = keys.selected;
        } else if keys.selected >= keys.offset + rows {
            keys.offset = keys.selected + 1 - rows;
        }
        keys.offset = keys.offset.min(keys.rows.len().saturating_sub(rows));
    }

    /// Changes the selected operation's rule and sends it at once. The
    /// table shows the change right away; the server's answer (or its
    /// refusal) has the last word.
    fn edit_fault(
        &mut self,
        change: impl FnOnce(&mut FaultRule) -> Result<(), String>,
    ) -> Vec<Command> {
        if !self.faults_loaded {
            self.say(
                "faults not loaded yet: waiting for the server",
                Severity::Error,
            );
            return vec![];
        }
        let op = self.selected_op();
        let mut rule = self.faults.faults.rule(op).clone();
        if let Err(e) = change(&mut rule) {
            self.say(e, Severity::Error);
            return vec![];
        }
        if &rule == self.faults.faults.rule(op) {
            return vec![];
        }
        self.faults.faults.rule_mut(op).clone_from(&rule);
        self.say(
            format!("{op}: {} — sending", describe_rule(&rule)),
            Severity::Info,
        );
        vec![Command::SetFault(op, rule)]
    }

    fn submit(&mut self) -> Vec<Command> {
        let Some(Input { field, text }) = self.input.take() else {
            return vec![];
        };
        let text = text.trim().to_owned();
        match field {
            Field::Prefix => {
                self.keys.query.prefix = text;
                self.requery()
            }
            Field::Latency(op) => {
                self.fault_selected = op_index(op);
                match text.parse::<u64>() {
                    Ok(ms) if ms <= MAX_LATENCY_MS => self.edit_fault(|r| {
                        r.latency_ms = ms;
                        Ok(())
                    }),
                    _ => self.refuse(format!(
                        "latency {text:?} is not a whole number of ms from 0 to {MAX_LATENCY_MS}"
                    )),
                }
            }
            Field::Probability(op) => {
                self.fault_selected = op_index(op);
                match text.trim_end_matches('%').trim().parse::<f64>() {
                    Ok(p) if (0.0..=100.0).contains(&p) => self.edit_fault(|r| {
                        r.probability = p / 100.0;
                        Ok(())
                    }),
                    _ => self.refuse(format!(
                        "probability {text:?} is not a percentage from 0 to 100"
                    )),
                }
            }
            Field::Count(op) => {
                self.fault_selected = op_index(op);
                let count = if text.is_empty() {
                    Ok(0)
                } else {
                    text.parse::<u64>()
                };
                match count {
                    Ok(n) => self.edit_fault(|r| {
                        r.count = (n > 0).then_some(n);
                        Ok(())
                    }),
                    Err(_) => self.refuse(format!(
                        "count {text:?} is not a whole number (0 = unlimited)"
                    )),
                }
            }
            Field::Message(op) => {
                self.fault_selected = op_index(op);
                self.edit_fault(|r| {
                    r.message = text;
                    Ok(())
                })
            }
        }
    }

    fn refuse(&mut self, why: String) -> Vec<Command> {
        self.say(why, Severity::Error);
        vec![]
    }

    #[allow(clippy::too_many_lines)] // one arm per update
    fn apply(&mut self, update: Update) -> Vec<Command> {
        match update {
            Update::Keys { query, page } => {
                if query != self.keys.query {
                    return vec![];
                }
                let before = self.keys.selected_key().map(|k| k.key.clone());
                self.clock_offset_ms = page.now_ms.cast_signed() - self.local_ms.cast_signed();
                let keys = &mut self.keys;
                keys.lease_scale_ms = page
                    .keys
                    .iter()
                    .filter(|k| k.state == KeyState::Processing)
                    .map(|k| k.lease_remaining_ms)
                    .fold(keys.lease_scale_ms, u64::max);
                keys.rows = page.keys;
                let rows = &keys.rows;
                self.last_outcome
                    .retain(|key, _| rows.iter().any(|r| &r.key == key));
                keys.next = page.next;
                keys.total = page.total;
                keys.loaded = true;
                // Stay on the same key when rows move under it.
                if let Some(key) = &before
                    && let Some(i) = keys.rows.iter().position(|k| &k.key == key)
                {
                    keys.selected = i;
                }
                self.keep_selection_visible();
                self.rewatch(before.as_deref())
            }
            Update::Detail(detail) => {
                if self.detail_open
                    && self
                        .keys
                        .selected_key()
                        .is_some_and(|k| k.key == detail.info.key)
                {
                    self.detail = Some(detail);
                }
                vec![]
            }
            Update::DetailGone(key) => {
                if self.detail.as_ref().is_some_and(|d| d.info.key == key) {
                    self.detail = None;
                }
                vec![]
            }
            Update::Faults(faults) => {
                self.faults = faults;
                self.faults_loaded = true;
                vec![]
            }
            Update::Stats(stats) => {
                push_bounded(&mut self.rates, stats.rates_per_s, HISTORY);
                push_bounded(&mut self.p99_us, stats.store_latency_us.p99, HISTORY);
                self.stats = Some(stats);
                vec![]
            }
            Update::Decision(event) => {
                if self.keys.rows.iter().any(|r| r.key == event.key) {
                    self.last_outcome.insert(event.key.clone(), event.outcome);
                }
                push_bounded(&mut self.log, LogLine::Decision(event), LOG_LINES);
                vec![]
            }
            Update::Fault(event) => {
                self.faults
                    .faults
                    .rule_mut(event.op)
                    .clone_from(&event.rule);
                push_bounded(&mut self.log, LogLine::Fault(event), LOG_LINES);
                vec![]
            }
            Update::Connected => {
                let was_lost = matches!(self.connection, Connection::Lost { .. });
                self.connection = Connection::Connected;
                if was_lost {
                    self.say("reconnected", Severity::Info);
                }
                vec![]
            }
            Update::Disconnected(error) => {
                self.connection =
                    match std::mem::replace(&mut self.connection, Connection::Connecting) {
                        Connection::Lost {
                            since_ms, attempts, ..
                        } => Connection::Lost {
                            error,
                            since_ms,
                            attempts: attempts + 1,
                        },
                        _ => Connection::Lost {
                            error,
                            since_ms: self.local_ms,
                            attempts: 1,
                        },
                    };
                vec![]
            }
            Update::Done(text) => {
                self.say(text, Severity::Info);
                vec![]
            }
            Update::Failed(text) => {
                self.say(text, Severity::Error);
                vec![]
            }
        }
    }
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).unwrap_or(0)
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, cap: usize) {
    if queue.len() == cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// `0.25` → `"25"`; whole percentages without decimals.
pub fn format_percent(p: f64) -> String {
    let pct = p * 100.0;
    if (pct - pct.round()).abs() < 1e-9 {
        format!("{pct:.0}")
    } else {
        format!("{pct:.1}")
    }
}

/// A rule in the seed's fault grammar, e.g. `25% 3× timeout 500ms`.
pub fn describe_rule(rule: &FaultRule) -> String {
    if rule.kind == FaultKind::Off {
        return "off".into();
    }
    let mut text = String::new();
    if rule.probability < 1.0 {
        let _ = write!(text, "{}% ", format_percent(rule.probability));
    }
    if let Some(n) = rule.count {
        let _ = write!(text, "{n}× ");
    }
    text.push_str(rule.kind.as_str());
    if rule.kind.uses_latency() {
        let _ = write!(text, " {}ms", rule.latency_ms);
    }
    if rule.kind == FaultKind::Error && !rule.message.is_empty() {
        let _ = write!(text, " ({})", rule.message);
    }
    text
}
