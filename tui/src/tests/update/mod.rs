//! `from_key` + `App::update`: every binding, every action, no terminal.
//! The app-wide keys and server reports here, each view's own in the file
//! named after it (as in `tui/src/views/`), over the helpers below.

mod activity;
mod faults;
mod keys;

use crate::action::{Action, Mode, from_key};
use crate::api::{FaultKind, Faults, KeyInfo, KeyPage, KeyState};
use crate::app::{App, Connection};
use crate::protocol::{Command, KeyQuery, Update};
use crate::views::View;
use crate::views::faults::FaultsAction;
use crate::views::keys::KeysAction;
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

#[test]
fn a_fresh_app_shows_the_view_asked_for() {
    let mut app = App::new("http://127.0.0.1:9090", 0);
    app.update(Action::ShowView(View::Faults));
    assert_eq!(app.view, View::Faults);
}

pub const NOW: u64 = 1_764_669_600_000; // 2025-12-02 10:00:00 UTC

pub fn row(key: &str, state: KeyState, i: u64) -> KeyInfo {
    let processing = state == KeyState::Processing;
    KeyInfo {
        key: key.into(),
        state,
        fence: i + 1,
        version: i + 1,
        lease_until_ms: if processing { NOW + 1000 * (i + 1) } else { 0 },
        lease_remaining_ms: if processing { 1000 * (i + 1) } else { 0 },
        expires_at_ms: NOW + 3_600_000 - 30_000 * i,
        expires_in_ms: 3_600_000 - 30_000 * i,
        fingerprint: format!("{:016x}", (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        status: (!processing).then_some(201),
        replays: i % 4,
        holder: String::new(),
        held_here: false,
    }
}

pub fn page(n: usize, next: Option<&str>) -> KeyPage {
    KeyPage {
        now_ms: NOW,
        keys: (0..n as u64)
            .map(|i| {
                row(
                    &format!("order-{i:03}"),
                    if i % 3 == 0 {
                        KeyState::Processing
                    } else {
                        KeyState::Done
                    },
                    i,
                )
            })
            .collect(),
        next: next.map(Into::into),
        total: Some(n as u64 + if next.is_some() { 1000 } else { 0 }),
    }
}

/// Draws the console on a `width`×`height` screen, as the terminal would
/// between key presses: the views measure what fits as they draw.
pub fn draw_at(app: &App, width: u16, height: u16) -> Buffer {
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    app.render(area, &mut buf);
    buf
}

/// The screen's text at `width`×`height`, one line a row.
pub fn screen(app: &App, width: u16, height: u16) -> String {
    let buf = draw_at(app, width, height);
    (0..height)
        .map(|y| (0..width).map(|x| buf[(x, y)].symbol()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A console that has loaded `n` keys (and faults), at a fixed clock,
/// drawn once on a 120×40 screen.
pub fn loaded(n: usize, next: Option<&str>) -> App {
    let mut app = App::new("http://127.0.0.1:9090", NOW);
    app.apply(Update::Connected);
    let query = app.keys.query.clone();
    app.apply(Update::Keys {
        query,
        page: page(n, next),
    });
    app.apply(Update::Faults(Faults::default()));
    draw_at(&app, 120, 40);
    app
}

pub fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

/// Each key, pressed in `app`'s view and mode, maps to its action.
pub fn assert_keymap(app: &App, bindings: &[(KeyCode, Action)]) {
    for (code, action) in bindings {
        assert_eq!(
            from_key(app.mode(), app.view, key(*code)).as_ref(),
            Some(action),
            "{:?} view: {code:?}",
            app.view
        );
    }
}

/// One key press, then a redraw, as the console's loop does.
pub fn press(app: &mut App, code: KeyCode) -> Vec<Command> {
    let commands = match from_key(app.mode(), app.view, key(code)) {
        Some(action) => app.update(action),
        None => vec![],
    };
    draw_at(app, 120, 40);
    commands
}

pub fn ch(app: &mut App, c: char) -> Vec<Command> {
    press(app, KeyCode::Char(c))
}

/// The status line's text; empty when there is none.
pub fn status(app: &App) -> &str {
    app.status.as_ref().map_or("", |(text, _)| text.as_str())
}

/// A prompt is open, empty (what is typed replaces the value, not edits
/// it) and showing `was`, the value it replaces.
#[track_caller]
pub fn assert_prompt_opened(app: &App, was: &str) {
    let prompt = app
        .input
        .as_ref()
        .map(|i| (i.text.as_str(), i.was.as_str()));
    assert_eq!(prompt, Some(("", was)), "the prompt as it opens");
}

pub fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        ch(app, c);
    }
}

#[test]
#[allow(clippy::too_many_lines)] // one row per binding, one table per view
fn every_binding_maps_to_its_action() {
    use Action as A;
    use FaultsAction as F;
    use KeysAction as K;
    let app = loaded(10, None);
    let keys: &[(KeyCode, Action)] = &[
        (KeyCode::Char('q'), A::Quit),
        (KeyCode::Char('?'), A::ToggleHelp),
        (KeyCode::Char('1'), A::ShowView(View::Keys)),
        (KeyCode::Char('2'), A::ShowView(View::Faults)),
        (KeyCode::Char('3'), A::ShowView(View::Activity)),
        (KeyCode::Tab, A::NextView),
        (KeyCode::BackTab, A::PrevView),
        (KeyCode::Up, A::Keys(K::Up)),
        (KeyCode::Char('k'), A::Keys(K::Up)),
        (KeyCode::Down, A::Keys(K::Down)),
        (KeyCode::Char('j'), A::Keys(K::Down)),
        (KeyCode::PageUp, A::Keys(K::PageUp)),
        (KeyCode::PageDown, A::Keys(K::PageDown)),
        (KeyCode::Home, A::Keys(K::Home)),
        (KeyCode::Char('g'), A::Keys(K::Home)),
        (KeyCode::End, A::Keys(K::End)),
        (KeyCode::Char('G'), A::Keys(K::End)),
        (KeyCode::Char('s'), A::Keys(K::NextSort)),
        (KeyCode::Char('o'), A::Keys(K::ReverseOrder)),
        (KeyCode::Char('f'), A::Keys(K::NextStateFilter)),
        (KeyCode::Char('/'), A::Keys(K::Search)),
        (KeyCode::Esc, A::Keys(K::Back)),
        (KeyCode::Enter, A::Keys(K::ToggleDetail)),
        (KeyCode::Char('r'), A::Keys(K::AskRelease)),
        (KeyCode::Char('e'), A::Keys(K::AskExpire)),
        (KeyCode::Char('d'), A::Keys(K::AskDelete)),
        (KeyCode::Delete, A::Keys(K::AskDelete)),
        (KeyCode::Char('K'), A::Keys(K::DetailScrollUp)),
        (KeyCode::Char('J'), A::Keys(K::DetailScrollDown)),
        (KeyCode::Char('c'), A::Keys(K::CopyClientKey)),
        (KeyCode::Char('y'), A::Keys(K::Copy)),
        (KeyCode::Char('h'), A::Keys(K::History)),
    ];
    assert_keymap(&app, keys);
    let mut app = loaded(10, None);
    app.update(Action::ShowView(View::Faults));
    let faults: &[(KeyCode, Action)] = &[
        (KeyCode::Char('o'), A::Faults(F::SetKind(FaultKind::Off))),
        (KeyCode::Char('e'), A::Faults(F::SetKind(FaultKind::Error))),
        (
            KeyCode::Char('t'),
            A::Faults(F::SetKind(FaultKind::Timeout)),
        ),
        (KeyCode::Char('d'), A::Faults(F::SetKind(FaultKind::Delay))),
        (KeyCode::Char('l'), A::Faults(F::SetKind(FaultKind::Lost))),
        (KeyCode::Char(' '), A::Faults(F::Toggle)),
        (KeyCode::Char('+'), A::Faults(F::LatencyUp)),
        (KeyCode::Char('='), A::Faults(F::LatencyUp)),
        (KeyCode::Char('-'), A::Faults(F::LatencyDown)),
        (KeyCode::Char(']'), A::Faults(F::ProbabilityUp)),
        (KeyCode::Char('['), A::Faults(F::ProbabilityDown)),
        (KeyCode::Char('>'), A::Faults(F::CountUp)),
        (KeyCode::Char('<'), A::Faults(F::CountDown)),
        (KeyCode::Char('L'), A::Faults(F::EditLatency)),
        (KeyCode::Char('R'), A::Faults(F::EditRule)),
        (KeyCode::Char('P'), A::Faults(F::EditProbability)),
        (KeyCode::Char('C'), A::Faults(F::EditCount)),
        (KeyCode::Char('M'), A::Faults(F::EditMessage)),
        (KeyCode::Char('j'), A::Faults(F::Down)),
        (KeyCode::Char('q'), A::Quit),
    ];
    assert_keymap(&app, faults);
    app.update(Action::ShowView(View::Activity));
    assert_eq!(
        from_key(app.mode(), app.view, key(KeyCode::Char('e'))),
        None,
        "no key actions outside the keys view"
    );

    // Ctrl-C quits in every mode, even while typing.
    let mut typing = loaded(1, None);
    ch(&mut typing, '/');
    assert_eq!(typing.mode(), Mode::Input);
    assert_eq!(
        from_key(
            typing.mode(),
            typing.view,
            KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)
        ),
        Some(A::Quit)
    );
    assert_eq!(
        from_key(typing.mode(), typing.view, key(KeyCode::Char('q'))),
        Some(A::InputChar('q')),
        "q is a letter while typing"
    );
    // Key releases (kitty protocol) are not presses.
    let release = KeyEvent {
        kind: KeyEventKind::Release,
        ..key(KeyCode::Char('q'))
    };
    assert_eq!(from_key(app.mode(), app.view, release), None);
}

#[test]
fn q_quits_and_help_toggles_and_swallows_other_keys() {
    let mut app = loaded(5, None);
    ch(&mut app, '?');
    assert_eq!(app.mode(), Mode::Help);
    assert_eq!(ch(&mut app, 'd'), vec![]);
    assert!(app.confirm.is_none(), "keys under the overlay do nothing");
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.mode(), Mode::Normal);
    ch(&mut app, '?');
    ch(&mut app, '?');
    assert!(!app.help);
    ch(&mut app, 'q');
    assert!(app.should_quit);
}

#[test]
fn views_cycle_both_ways() {
    let mut app = loaded(1, None);
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.view, View::Faults);
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.view, View::Keys);
    press(&mut app, KeyCode::BackTab);
    assert_eq!(app.view, View::Activity);
    ch(&mut app, '1');
    assert_eq!(app.view, View::Keys);
}

#[test]
fn the_connection_is_lost_counted_and_found_without_losing_the_view() {
    let mut app = loaded(10, None);
    ch(&mut app, 'j');
    app.update(Action::Tick {
        local_ms: NOW + 5000,
    });
    app.apply(Update::Disconnected("Connection refused".into()));
    app.update(Action::Tick {
        local_ms: NOW + 6000,
    });
    app.apply(Update::Disconnected("Connection refused".into()));
    assert_eq!(
        app.connection,
        Connection::Lost {
            error: "Connection refused".into(),
            since_ms: NOW + 5000,
            attempts: 2
        }
    );
    assert_eq!(app.keys.rows.len(), 10, "the last data stays");
    assert_eq!(app.keys.selected, 1);
    app.apply(Update::Connected);
    assert_eq!(app.connection, Connection::Connected);
    assert_eq!(status(&app), "reconnected");
}

#[test]
fn the_clock_follows_the_server_between_polls() {
    let mut app = App::new("http://x", 5_000);
    let query = app.keys.query.clone();
    app.apply(Update::Keys {
        query,
        page: page(1, None),
    });
    assert_eq!(
        app.keys.now_ms(),
        NOW,
        "the server's clock, whatever ours says"
    );
    app.update(Action::Tick { local_ms: 5_750 });
    assert_eq!(app.keys.now_ms(), NOW + 750);
}

#[test]
fn server_reports_show_in_the_status_line() {
    let mut app = loaded(1, None);
    app.apply(Update::Done("deleted order-000".into()));
    assert_eq!(status(&app), "deleted order-000");
    app.apply(Update::Failed("409: not processing".into()));
    assert_eq!(
        app.status.as_ref().unwrap(),
        &("409: not processing".into(), crate::views::Severity::Error)
    );
}

#[test]
fn the_first_commands_poll_the_default_query() {
    let app = App::new("http://x", NOW);
    assert_eq!(app.start(), vec![Command::Query(KeyQuery::default())]);
}

#[test]
fn a_server_still_starting_is_connected_not_reconnected() {
    let mut app = App::new("http://x", NOW);
    app.apply(Update::Disconnected("Connection refused".into()));
    app.apply(Update::Connected);
    assert_eq!(status(&app), "connected");
}
