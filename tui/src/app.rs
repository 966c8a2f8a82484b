//! The console's state and its transitions: [`App::update`] for what the
//! operator does, [`App::apply`] for what the server reports. No I/O: what
//! the console needs from the server comes back out as [`Command`]s.
//!
//! The state of each view lives with the view (`views::keys`, `faults`,
//! `activity`); `App` holds what is shared — the connection, the dialogs,
//! the status line — and routes to the view on screen.
//! `tests::update` drives it key by key, as the console's loop does.

use crate::action::{Action, Mode};
use crate::protocol::{Command, Update};
use crate::views::activity::{ActivityView, LogLine};
use crate::views::faults::FaultsView;
use crate::views::keys::KeysView;
use crate::views::{Confirm, Effects, Field, Input, KeyVerb, MAX_INPUT, Severity, View};

/// How long a status line stays, by severity: news goes after 5 s, an
/// error after 10 s (or when the next line replaces it).
pub const STATUS_MS: (u64, u64) = (5_000, 10_000);

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
    /// The server answers but refuses the token (or its absence).
    Unauthorized {
        status: u16,
        detail: String,
    },
}

/// The whole console.
#[allow(clippy::struct_excessive_bools)] // independent flags, each shown on screen
pub struct App {
    pub admin_url: String,
    /// Whether the console was given a token (the fix for a 401 differs).
    pub has_token: bool,
    pub view: View,
    pub connection: Connection,
    pub keys: KeysView,
    pub faults: FaultsView,
    pub activity: ActivityView,
    pub help: bool,
    pub confirm: Option<Confirm>,
    pub input: Option<Input>,
    /// The status line: what the console last said. It fades: see [`STATUS_MS`].
    pub status: Option<(String, Severity)>,
    /// When the status line was said (local clock).
    pub status_since_ms: u64,
    /// A line the embedding program puts at the top of the footer's status
    /// when nothing else is said (`idem demo`: "the run is over…").
    pub banner: Option<String>,
    pub should_quit: bool,
    /// Whether the server ever answered, to tell "connected" from "reconnected".
    pub was_connected: bool,
    /// The local clock (ms since the epoch), from the last tick.
    pub local_ms: u64,
}

impl App {
    pub fn new(admin_url: impl Into<String>, local_ms: u64) -> Self {
        App {
            admin_url: admin_url.into(),
            has_token: false,
            view: View::Keys,
            connection: Connection::Connecting,
            keys: KeysView::new(local_ms),
            faults: FaultsView::default(),
            activity: ActivityView::default(),
            help: false,
            confirm: None,
            input: None,
            status: None,
            status_since_ms: local_ms,
            banner: None,
            should_quit: false,
            was_connected: false,
            local_ms,
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

    /// Applies one action; returns what the client must do.
    pub fn update(&mut self, action: Action) -> Vec<Command> {
        match action {
            Action::Quit => self.should_quit = true,
            Action::ToggleHelp => self.help = !self.help,
            Action::ShowView(view) => self.view = view,
            Action::NextView | Action::PrevView => {
                let i = View::ALL.iter().position(|v| *v == self.view).unwrap_or(0);
                let n = View::ALL.len();
                let step = if action == Action::NextView { 1 } else { n - 1 };
                self.view = View::ALL[(i + step) % n];
            }
            Action::Confirm => {
                if let Some(Confirm { verb, key }) = self.confirm.take() {
                    return vec![match verb {
                        KeyVerb::Release => Command::Release(key),
                        KeyVerb::Expire => Command::Expire(key),
                        KeyVerb::Delete => Command::Delete(key),
                    }];
                }
            }
            Action::Cancel => {
                self.confirm = None;
                self.input = None;
            }
            Action::InputChar(c) => {
                if let Some(input) = &mut self.input
                    && input.text.chars().count() < MAX_INPUT
                {
                    input.text.push(c);
                }
            }
            Action::InputBackspace => {
                if let Some(input) = &mut self.input {
                    input.text.pop();
                }
            }
            Action::InputSubmit => {
                if let Some(Input { field, text, .. }) = self.input.take() {
                    let text = text.trim().to_owned();
                    let effects = match field {
                        Field::Search => self.keys.search(text),
                        _ => self.faults.submit(field, &text),
                    };
                    return self.take(effects);
                }
            }
            Action::Keys(action) => {
                let effects = self.keys.update(action);
                return self.take(effects);
            }
            Action::Faults(action) => {
                let effects = self.faults.update(action);
                return self.take(effects);
            }
            Action::Activity(action) => self.activity.update(action),
            Action::Tick { local_ms } => {
                self.local_ms = local_ms;
                self.keys.tick(local_ms);
                if let Some((_, severity)) = &self.status {
                    let lasts = match severity {
                        Severity::Info => STATUS_MS.0,
                        Severity::Error => STATUS_MS.1,
                    };
                    if local_ms.saturating_sub(self.status_since_ms) >= lasts {
                        self.status = None;
                    }
                }
            }
        }
        vec![]
    }

    /// Applies what a view asked for; returns its commands.
    fn take(&mut self, effects: Effects) -> Vec<Command> {
        let Effects {
            commands,
            status,
            confirm,
            input,
        } = effects;
        if let Some((text, severity)) = status {
            self.say(text, severity);
        }
        if confirm.is_some() {
            self.confirm = confirm;
        }
        if input.is_some() {
            self.input = input;
        }
        commands
    }

    /// Applies one report from the admin client.
    pub fn apply(&mut self, update: Update) -> Vec<Command> {
        match update {
            Update::Keys { query, page } => return self.keys.page(&query, page),
            Update::KeysUnavailable(why) => self.keys.unavailable = Some(why),
            Update::Detail(detail) => self.keys.detail(detail),
            Update::DetailGone(key) => self.keys.detail_gone(&key),
            Update::Faults(faults) => {
                self.faults.current = faults;
                self.faults.loaded = true;
            }
            Update::Stats(stats) => {
                self.keys.gateway.clone_from(&stats.gateway);
                self.activity.stats(stats);
            }
            Update::Decision(event) => {
                self.keys.decision(&event.key, event.outcome);
                self.activity.log.push(LogLine::Decision(event));
            }
            Update::Fault(event) => {
                self.faults
                    .current
                    .faults
                    .rule_mut(event.op)
                    .clone_from(&event.rule);
                self.activity.log.push(LogLine::Fault(event));
            }
            Update::Event(event) => self.activity.log.push(event),
            Update::History(history) => self.keys.history(history),
            Update::Connected => {
                let was_lost = !matches!(
                    self.connection,
                    Connection::Connecting | Connection::Connected
                );
                self.connection = Connection::Connected;
                if was_lost {
                    // "Re" only if it had been connected before: a server
                    // still starting when the console did was never lost.
                    let text = if self.was_connected {
                        "reconnected"
                    } else {
                        "connected"
                    };
                    self.say(text, Severity::Info);
                }
                self.was_connected = true;
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
            }
            Update::Unauthorized { status, detail } => {
                self.connection = Connection::Unauthorized { status, detail };
            }
            Update::Done(text) => self.say(text, Severity::Info),
            Update::Failed(text) => self.say(text, Severity::Error),
        }
        vec![]
    }

    /// Puts `text` on the status line from now (it fades: [`STATUS_MS`]).
    pub fn say(&mut self, text: impl Into<String>, severity: Severity) {
        self.status = Some((text.into(), severity));
        self.status_since_ms = self.local_ms;
    }

    /// What to tell an operator whose token the server refuses.
    pub fn token_fix(&self) -> &'static str {
        if self.has_token {
            "the admin API refuses this token: pass the right one with --token-file or IDEM_ADMIN_TOKEN"
        } else {
            "the admin API wants a token: pass --token-file FILE or IDEM_ADMIN_TOKEN (or --token T)"
        }
    }
}
