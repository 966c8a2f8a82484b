//! The keys view: one page of keys from the server, where the operator is
//! in it, the detail pane, and the operator's actions on a key.
//! `KeysView::update` takes the view's own actions and says what else must
//! happen as `Effects` (`tests::update::keys::the_view_alone_asks_what_to_search_for`).

mod render;

use super::history::HistoryPane;
use super::{Confirm, Effects, Field, Input, KeyVerb, Severity};
use crate::api::{GatewayInfo, KeyDetail, KeyHistory, KeyInfo, KeyPage, KeyState, Verdict};
use crate::keymap::{Binding, also, bind};
use crate::protocol::{Command, KeyQuery, Order, Sort};
use crate::theme::lapsed;
use crossterm::event::KeyCode;
use std::cell::Cell;
use std::collections::HashMap;

/// The keys view's own actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeysAction {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    NextSort,
    ReverseOrder,
    NextStateFilter,
    Search,
    Back,
    ToggleDetail,
    DetailScrollUp,
    DetailScrollDown,
    /// Copies the store key, which the admin API names the key by.
    Copy,
    /// Copies the key the client sent.
    CopyClientKey,
    History,
    AskRelease,
    AskExpire,
    AskDelete,
}

use KeyCode as K;
use KeysAction as A;

/// The keys view's key table; the help overlay lists it as written.
#[rustfmt::skip] // a table: one binding a line
pub const BINDINGS: &[Binding<KeysAction>] = &[
    bind(&[K::Up, K::Char('k')], A::Up, "↑↓ j k", "move"),
    also(&[K::Down, K::Char('j')], A::Down),
    bind(&[K::PageUp], A::PageUp, "PgUp PgDn", "previous / next page"),
    also(&[K::PageDown], A::PageDown),
    bind(&[K::Home, K::Char('g')], A::Home, "g G Home End", "first / last row"),
    also(&[K::End, K::Char('G')], A::End),
    bind(&[K::Char('s')], A::NextSort, "s / o", "sort column / order"),
    also(&[K::Char('o')], A::ReverseOrder),
    bind(&[K::Char('f')], A::NextStateFilter, "f", "state filter, 4 kinds"),
    bind(&[K::Char('/')], A::Search, "/", "search the client's key"),
    bind(&[K::Esc], A::Back, "Esc", "back (pane, filters)"),
    bind(&[K::Enter], A::ToggleDetail, "Enter", "detail pane (full key)"),
    bind(&[K::Char('h')], A::History, "h", "the key's history"),
    bind(&[K::Char('K')], A::DetailScrollUp, "J K", "scroll detail, history"),
    also(&[K::Char('J')], A::DetailScrollDown),
    bind(&[K::Char('y')], A::Copy, "y / c", "copy store / client key"),
    also(&[K::Char('c')], A::CopyClientKey),
    bind(&[K::Char('r')], A::AskRelease, "r / e / d", "release, expire, delete"),
    also(&[K::Char('e')], A::AskExpire),
    also(&[K::Char('d'), K::Delete], A::AskDelete),
];

/// The footer's reminder of the most used keys.
pub const HINTS: &str =
    "↑↓ move · / search · Enter detail · h history · r e d act · ? help · q quit ";

/// Which keys the table shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateFilter {
    #[default]
    All,
    Processing,
    /// Processing keys whose lease ran out: the next request takes them over.
    Lapsed,
    Done,
}

impl StateFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            StateFilter::All => "all",
            StateFilter::Processing => "processing",
            StateFilter::Lapsed => "lapsed",
            StateFilter::Done => "done",
        }
    }

    /// What the server is asked for; lapsed keys are the processing ones
    /// whose lease ran out, sorted by lease so they come first.
    fn server_state(self) -> Option<KeyState> {
        match self {
            StateFilter::All => None,
            StateFilter::Processing | StateFilter::Lapsed => Some(KeyState::Processing),
            StateFilter::Done => Some(KeyState::Done),
        }
    }
}

/// A store key as the gateway writes it, `scope/key`: the client's scope
/// (`anon`, or 16 hex digits of a hash of its credentials) and the key the
/// client sent. A key without a `/` (a library's own store) has no scope.
pub fn split_key(store_key: &str) -> (&str, &str) {
    store_key.split_once('/').unwrap_or(("", store_key))
}

/// The keys table: one page from the server and where the operator is in it.
#[derive(Clone, Debug, Default)]
pub struct KeysView {
    pub query: KeyQuery,
    pub filter: StateFilter,
    /// The `after` cursors of the pages before this one, for PgUp.
    pub previous: Vec<Option<String>>,
    pub rows: Vec<KeyInfo>,
    pub next: Option<String>,
    pub total: Option<u64>,
    pub selected: usize,
    /// First row on screen. The render keeps it, since only the render
    /// knows how many rows fit (as ratatui's `TableState` does).
    pub offset: Cell<usize>,
    /// How many rows the table showed when last drawn: one PgDn.
    pub page_rows: Cell<usize>,
    /// The longest lease seen, for the countdown bar's full length.
    pub lease_scale_ms: u64,
    pub loaded: bool,
    /// Why the store could not list the keys at the last poll (the rows are
    /// the last page it gave); cleared by the next page.
    pub unavailable: Option<String>,
    pub detail_open: bool,
    pub detail: Option<KeyDetail>,
    /// Lines of the detail pane scrolled past.
    pub detail_scroll: u16,
    /// The latest decision on each key of the page on screen (and only
    /// those, so it is bounded by the page size).
    pub last_outcome: HashMap<String, Verdict>,
    /// The local clock (ms since the epoch), from the last tick.
    pub local_ms: u64,
    /// The server's clock minus ours, from the last page of keys.
    pub clock_offset_ms: i64,
    /// The selected key's history, while it is open (it takes the view).
    pub history: Option<HistoryPane>,
    /// The gateway behind the admin API, to say a claim is its own.
    pub gateway: GatewayInfo,
}

impl KeysView {
    pub fn new(local_ms: u64) -> KeysView {
        KeysView {
            local_ms,
            page_rows: Cell::new(1),
            ..KeysView::default()
        }
    }

    pub fn selected_key(&self) -> Option<&KeyInfo> {
        self.rows.get(self.selected)
    }

    /// Index of the first row of this page among all matching keys.
    pub fn page_start(&self) -> usize {
        self.previous.len() * self.query.limit as usize
    }

    /// The server's time now, as far as the console can tell.
    pub fn now_ms(&self) -> u64 {
        self.local_ms.saturating_add_signed(self.clock_offset_ms)
    }

    pub fn update(&mut self, action: KeysAction) -> Effects {
        if let Some(pane) = &mut self.history {
            // The history takes the view: moves scroll it, Esc and h close it.
            let page = self.page_rows.get().max(1).cast_signed();
            match action {
                A::Up | A::DetailScrollUp => pane.scroll(1),
                A::Down | A::DetailScrollDown => pane.scroll(-1),
                A::PageUp => pane.scroll(page),
                A::PageDown => pane.scroll(-page),
                A::Home => pane.scroll(isize::MAX / 2),
                A::End => pane.back = 0,
                A::Back | A::History => {
                    self.history = None;
                    return Effects::commands(vec![Command::History(None)]);
                }
                A::Copy | A::CopyClientKey | A::AskRelease | A::AskExpire | A::AskDelete => {
                    return self.on_key(action);
                }
                _ => {
                    return Effects::say(
                        "the history is open: h or Esc closes it",
                        Severity::Error,
                    );
                }
            }
            return Effects::none();
        }
        self.on_key(action)
    }

    fn on_key(&mut self, action: KeysAction) -> Effects {
        match action {
            A::Up | A::Down | A::PageUp | A::PageDown | A::Home | A::End => self.navigate(action),
            A::NextSort => {
                let i = Sort::ALL
                    .iter()
                    .position(|s| *s == self.query.sort)
                    .unwrap_or(0);
                self.query.sort = Sort::ALL[(i + 1) % Sort::ALL.len()];
                self.requery()
            }
            A::ReverseOrder => {
                self.query.order = match self.query.order {
                    Order::Asc => Order::Desc,
                    Order::Desc => Order::Asc,
                };
                self.requery()
            }
            A::NextStateFilter => {
                self.filter = match self.filter {
                    StateFilter::All => StateFilter::Processing,
                    StateFilter::Processing => StateFilter::Lapsed,
                    StateFilter::Lapsed => StateFilter::Done,
                    StateFilter::Done => StateFilter::All,
                };
                self.query.state = self.filter.server_state();
                if self.filter == StateFilter::Lapsed {
                    // Lapsed leases end first: they lead the first page.
                    self.query.sort = Sort::Lease;
                    self.query.order = Order::Asc;
                }
                self.requery()
            }
            A::Search => Effects::prompt(Input::new(Field::Search, self.query.search.clone())),
            A::Back => {
                // Esc backs out one step: the detail pane first, then the filters.
                if self.detail_open {
                    self.detail_open = false;
                    return Effects::commands(vec![Command::Watch(None)]);
                }
                if self.filter == StateFilter::All
                    && self.query.search.is_empty()
                    && self.query.prefix.is_empty()
                {
                    return Effects::none();
                }
                self.filter = StateFilter::All;
                self.query.state = None;
                self.query.search.clear();
                self.query.prefix.clear();
                self.requery()
            }
            A::ToggleDetail => {
                self.detail_open = !self.detail_open;
                self.detail_scroll = 0;
                Effects::commands(self.watch())
            }
            A::DetailScrollUp => {
                self.detail_scroll = self.detail_scroll.saturating_sub(1);
                Effects::none()
            }
            A::DetailScrollDown => {
                if self.detail_open {
                    self.detail_scroll = self.detail_scroll.saturating_add(1);
                    Effects::none()
                } else {
                    Effects::say(
                        "J K scroll the detail pane: open it with Enter",
                        Severity::Error,
                    )
                }
            }
            A::Copy => self.copy(true),
            A::CopyClientKey => self.copy(false),
            A::History => match self.selected_key() {
                Some(row) => {
                    let key = row.key.clone();
                    self.history = Some(HistoryPane::new(key.clone()));
                    Effects::commands(vec![Command::History(Some(key))])
                }
                None => Effects::say("no key selected", Severity::Error),
            },
            A::AskRelease => self.ask(KeyVerb::Release),
            A::AskExpire => self.ask(KeyVerb::Expire),
            A::AskDelete => self.ask(KeyVerb::Delete),
        }
    }

    /// Copies the selected row's store key (`store`), which the admin API
    /// names it by (`/v1/keys/` + the key, its `/` as `%2F`), or the key its
    /// client sent.
    fn copy(&self, store: bool) -> Effects {
        let key = match &self.history {
            Some(pane) => pane.key.as_str(),
            None => match self.selected_key() {
                Some(row) => row.key.as_str(),
                None => return Effects::say("no key selected", Severity::Error),
            },
        };
        let (text, said) = if store {
            (
                key.to_owned(),
                format!(
                    "copied the store key {key:?} (admin API: /v1/keys/{})",
                    key.replace('%', "%25").replace('/', "%2F")
                ),
            )
        } else {
            let (_, client) = split_key(key);
            (
                client.to_owned(),
                format!("copied the client's key {client:?}"),
            )
        };
        let mut effects = Effects::commands(vec![Command::Copy(text)]);
        effects.status = Some((said, Severity::Info));
        effects
    }

    /// A key's history arrived from the server.
    pub fn history(&mut self, history: KeyHistory) {
        if let Some(pane) = &mut self.history
            && pane.key == history.key
        {
            pane.history = Some(history);
        }
    }

    fn ask(&self, verb: KeyVerb) -> Effects {
        match self.selected_key() {
            Some(row) if verb == KeyVerb::Release && row.state != KeyState::Processing => {
                Effects::say(
                    format!("{} holds no lease: it is done", row.key),
                    Severity::Error,
                )
            }
            Some(row) => Effects::ask(Confirm {
                verb,
                key: row.key.clone(),
            }),
            None => Effects::say("no key selected", Severity::Error),
        }
    }

    /// The operator typed a search (empty: no search).
    pub fn search(&mut self, text: String) -> Effects {
        self.query.search = text;
        self.requery()
    }

    pub fn tick(&mut self, local_ms: u64) {
        self.local_ms = local_ms;
    }

    /// The query changed: back to its first page.
    fn requery(&mut self) -> Effects {
        self.query.after = None;
        self.previous.clear();
        self.selected = 0;
        self.offset.set(0);
        self.loaded = false;
        let mut commands = vec![Command::Query(self.query.clone())];
        commands.extend(self.watch());
        Effects::commands(commands)
    }

    /// After a move: if the detail pane shows another key now, watch it.
    fn rewatch(&mut self, before: Option<&str>) -> Vec<Command> {
        let now = self.selected_key().map(|k| k.key.as_str());
        if self.detail_open && now != before {
            self.detail_scroll = 0;
            self.watch()
        } else {
            vec![]
        }
    }

    /// Which key's detail the client should poll.
    fn watch(&self) -> Vec<Command> {
        let key = if self.detail_open {
            self.selected_key().map(|k| k.key.clone())
        } else {
            None
        };
        vec![Command::Watch(key)]
    }

    fn navigate(&mut self, action: KeysAction) -> Effects {
        let before = self.selected_key().map(|k| k.key.clone());
        let last = self.rows.len().saturating_sub(1);
        let page = self.page_rows.get().max(1);
        let selected = self.selected.min(last);
        match action {
            A::Up => self.selected = selected.saturating_sub(1),
            A::Down => self.selected = selected.saturating_add(1).min(last),
            A::Home => self.selected = 0,
            A::End => self.selected = last,
            A::PageDown => {
                if selected >= last && self.next.is_some() {
                    return Effects::commands(self.turn_page(true));
                }
                self.selected = selected.saturating_add(page).min(last);
            }
            A::PageUp => {
                if selected == 0 && !self.previous.is_empty() {
                    return Effects::commands(self.turn_page(false));
                }
                self.selected = selected.saturating_sub(page);
            }
            _ => {}
        }
        Effects::commands(self.rewatch(before.as_deref()))
    }

    /// Asks the server for the next or the previous page.
    fn turn_page(&mut self, forward: bool) -> Vec<Command> {
        // Until the page asked for arrives, `next` belongs to the old one.
        if !self.loaded {
            return vec![];
        }
        if forward {
            let Some(next) = self.next.clone() else {
                return vec![];
            };
            self.previous.push(self.query.after.take());
            self.query.after = Some(next);
            self.selected = 0;
        } else {
            let Some(after) = self.previous.pop() else {
                return vec![];
            };
            self.query.after = after;
            // Land on the last row of the page before, where PgUp came from.
            self.selected = usize::MAX;
        }
        self.offset.set(0);
        self.loaded = false;
        vec![Command::Query(self.query.clone())]
    }

    /// A page arrived from the server.
    pub fn page(&mut self, query: &KeyQuery, page: KeyPage) -> Vec<Command> {
        if *query != self.query {
            return vec![];
        }
        self.unavailable = None;
        let before = self.selected_key().map(|k| k.key.clone());
        self.clock_offset_ms = page.now_ms.cast_signed() - self.local_ms.cast_signed();
        self.lease_scale_ms = page
            .keys
            .iter()
            .filter(|k| k.state == KeyState::Processing)
            .map(|k| k.lease_remaining_ms)
            .fold(self.lease_scale_ms, u64::max);
        self.rows = page.keys;
        if self.filter == StateFilter::Lapsed {
            let now = page.now_ms;
            self.rows.retain(|k| lapsed(k, now));
        }
        let rows = &self.rows;
        self.last_outcome
            .retain(|key, _| rows.iter().any(|r| &r.key == key));
        self.next = page.next;
        self.total = page.total;
        self.loaded = true;
        // Stay on the same key when rows move under it.
        if let Some(key) = &before
            && let Some(i) = self.rows.iter().position(|k| &k.key == key)
        {
            self.selected = i;
        }
        self.selected = self.selected.min(self.rows.len().saturating_sub(1));
        self.rewatch(before.as_deref())
    }

    pub fn detail(&mut self, detail: KeyDetail) {
        if self.detail_open
            && self
                .selected_key()
                .is_some_and(|k| k.key == detail.info.key)
        {
            self.detail = Some(detail);
        }
    }

    pub fn detail_gone(&mut self, key: &str) {
        if self.detail.as_ref().is_some_and(|d| d.info.key == key) {
            self.detail = None;
        }
    }

    pub fn decision(&mut self, key: &str, outcome: Verdict) {
        if self.rows.iter().any(|r| r.key == key) {
            self.last_outcome.insert(key.to_owned(), outcome);
        }
    }
}
