//! `from_key` + `App::update`: every binding, every action, no terminal.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use idem_tui::action::{Action, Mode, from_key};
use idem_tui::api::{
    DecisionEvent, FaultEvent, FaultKind, FaultRule, Faults, KeyDetail, KeyInfo, KeyPage, KeyState,
    Op, Outcome, Stats,
};
use idem_tui::app::{App, Connection};
use idem_tui::protocol::{Command, KeyQuery, Order, Sort, Update};
use idem_tui::views::activity::{ActivityAction, HISTORY, LOG_LINES};
use idem_tui::views::faults::FaultsAction;
use idem_tui::views::keys::{KeysAction, StateFilter};
use idem_tui::views::{KeyVerb, Severity, View};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

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

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

/// One key press, then a redraw, as the console's loop does.
fn press(app: &mut App, code: KeyCode) -> Vec<Command> {
    let commands = match from_key(app.mode(), app.view, key(code)) {
        Some(action) => app.update(action),
        None => vec![],
    };
    draw_at(app, 120, 40);
    commands
}

fn ch(app: &mut App, c: char) -> Vec<Command> {
    press(app, KeyCode::Char(c))
}

/// The status line's text; empty when there is none.
fn status(app: &App) -> &str {
    app.status.as_ref().map_or("", |(text, _)| text.as_str())
}

/// The prompt being typed, and the value it replaces.
fn prompt(app: &App) -> Option<(&str, &str)> {
    app.input
        .as_ref()
        .map(|i| (i.text.as_str(), i.was.as_str()))
}

fn type_text(app: &mut App, text: &str) {
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
        (KeyCode::Char('c'), A::Keys(K::Copy)),
        (KeyCode::Char('y'), A::Keys(K::Copy)),
    ];
    for (code, action) in keys {
        assert_eq!(
            from_key(app.mode(), app.view, key(*code)).as_ref(),
            Some(action),
            "keys view: {code:?}"
        );
    }
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
    for (code, action) in faults {
        assert_eq!(
            from_key(app.mode(), app.view, key(*code)).as_ref(),
            Some(action),
            "faults view: {code:?}"
        );
    }
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
fn the_decision_log_scrolls_and_pauses() {
    let mut app = loaded(1, None);
    app.update(Action::ShowView(View::Activity));
    for (code, action) in [
        (KeyCode::Char('c'), ActivityAction::ClearLog),
        (KeyCode::Char('k'), ActivityAction::ScrollUp),
        (KeyCode::Char('j'), ActivityAction::ScrollDown),
        (KeyCode::PageUp, ActivityAction::PageUp),
        (KeyCode::PageDown, ActivityAction::PageDown),
        (KeyCode::Char('g'), ActivityAction::Oldest),
        (KeyCode::Char('G'), ActivityAction::Follow),
        (KeyCode::Char('p'), ActivityAction::Pause),
        (KeyCode::Char(' '), ActivityAction::Pause),
    ] {
        assert_eq!(
            from_key(app.mode(), app.view, key(code)),
            Some(Action::Activity(action)),
            "activity view: {code:?}"
        );
    }
    let decide = |app: &mut App, i: u64| {
        app.apply(Update::Decision(DecisionEvent {
            ts_ms: i,
            key: format!("k-{i}"),
            outcome: Outcome::Executed,
            status: None,
            latency_us: 1,
            detail: None,
        }));
    };
    for i in 0..50 {
        decide(&mut app, i);
    }
    let log = |app: &App| {
        (
            app.activity.log.back,
            app.activity.log.paused,
            app.activity.log.unseen,
        )
    };
    assert_eq!(log(&app), (0, false, 0), "following the newest");
    ch(&mut app, 'k');
    ch(&mut app, 'k');
    decide(&mut app, 50);
    assert_eq!(
        log(&app),
        (3, false, 1),
        "scrolled back: new lines do not move the screen"
    );
    ch(&mut app, 'G');
    assert_eq!(log(&app), (0, false, 0), "G follows again");
    ch(&mut app, 'p');
    decide(&mut app, 51);
    decide(&mut app, 52);
    assert_eq!(log(&app), (2, true, 2), "paused");
    ch(&mut app, 'g');
    assert_eq!(app.activity.log.back, 52, "the oldest line");
    ch(&mut app, ' ');
    assert_eq!(log(&app), (0, false, 0), "unpaused: back to the newest");
    ch(&mut app, 'c');
    assert!(app.activity.log.lines.is_empty());
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
fn moving_stays_in_the_page_and_keeps_the_selection_on_screen() {
    let mut app = loaded(100, None);
    let rows = app.keys.page_rows.get();
    assert_eq!(
        rows, 34,
        "40 lines less header, summary, footer, borders and column header"
    );
    ch(&mut app, 'k');
    assert_eq!(app.keys.selected, 0);
    ch(&mut app, 'j');
    press(&mut app, KeyCode::Down);
    assert_eq!(app.keys.selected, 2);
    press(&mut app, KeyCode::Up);
    assert_eq!(app.keys.selected, 1);
    press(&mut app, KeyCode::PageDown);
    assert_eq!(app.keys.selected, 1 + rows);
    assert!(
        app.keys.offset.get() <= app.keys.selected
            && app.keys.selected < app.keys.offset.get() + rows
    );
    ch(&mut app, 'G');
    assert_eq!(app.keys.selected, 99);
    assert_eq!(app.keys.offset.get(), 100 - rows);
    press(&mut app, KeyCode::PageUp);
    assert_eq!(app.keys.selected, 99 - rows);
    ch(&mut app, 'g');
    assert_eq!((app.keys.selected, app.keys.offset.get()), (0, 0));
    press(&mut app, KeyCode::End);
    press(&mut app, KeyCode::Home);
    assert_eq!(app.keys.selected, 0);
}

#[test]
fn paging_past_the_page_asks_the_server_and_comes_back() {
    let mut app = loaded(100, Some("c100"));
    ch(&mut app, 'G');
    let commands = press(&mut app, KeyCode::PageDown);
    let Some(Command::Query(query)) = commands.first() else {
        panic!("{commands:?}")
    };
    assert_eq!(query.after.as_deref(), Some("c100"));
    assert_eq!(app.keys.previous, vec![None]);
    assert!(
        press(&mut app, KeyCode::PageDown).is_empty(),
        "no second turn before the page arrives"
    );
    assert!(press(&mut app, KeyCode::PageUp).is_empty());
    // The next page arrives.
    let mut second = page(100, None);
    for (i, k) in second.keys.iter_mut().enumerate() {
        k.key = format!("order-{:03}", 100 + i);
    }
    app.apply(Update::Keys {
        query: query.clone(),
        page: second,
    });
    assert_eq!(app.keys.selected_key().unwrap().key, "order-100");
    assert_eq!(app.keys.page_start(), 100);
    assert!(
        press(&mut app, KeyCode::PageDown).is_empty(),
        "no next page: stays here"
    );
    ch(&mut app, 'g');
    let commands = press(&mut app, KeyCode::PageUp);
    assert_eq!(commands, vec![Command::Query(KeyQuery::default())]);
    app.apply(Update::Keys {
        query: KeyQuery::default(),
        page: page(100, Some("c100")),
    });
    assert_eq!(
        app.keys.selected_key().unwrap().key,
        "order-099",
        "back on the row PgUp came from"
    );
}

#[test]
fn sort_order_and_filters_restart_from_the_first_page() {
    let mut app = loaded(100, Some("c100"));
    ch(&mut app, 'G');
    press(&mut app, KeyCode::PageDown);
    let sorts: Vec<Sort> = (0..4)
        .map(|_| match ch(&mut app, 's').first() {
            Some(Command::Query(q)) => {
                assert_eq!(q.after, None, "a new sort starts at the first page");
                q.sort
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        sorts,
        [Sort::Lease, Sort::Expires, Sort::Replays, Sort::Key]
    );
    assert!(matches!(ch(&mut app, 'o').first(), Some(Command::Query(q)) if q.order == Order::Desc));
    assert!(matches!(ch(&mut app, 'o').first(), Some(Command::Query(q)) if q.order == Order::Asc));
    let states: Vec<(Option<KeyState>, StateFilter)> = (0..4)
        .map(|_| match ch(&mut app, 'f').first() {
            Some(Command::Query(q)) => (q.state, app.keys.filter),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        states,
        [
            (Some(KeyState::Processing), StateFilter::Processing),
            (Some(KeyState::Processing), StateFilter::Lapsed),
            (Some(KeyState::Done), StateFilter::Done),
            (None, StateFilter::All),
        ]
    );
    assert_eq!(
        (app.keys.query.sort, app.keys.query.order),
        (Sort::Lease, Order::Asc),
        "lapsed leases come first"
    );

    ch(&mut app, '/');
    type_text(&mut app, "dx");
    press(&mut app, KeyCode::Backspace);
    type_text(&mut app, "er-0");
    assert_eq!(app.keys.query.search, "", "nothing applied while typing");
    let commands = press(&mut app, KeyCode::Enter);
    assert!(
        matches!(commands.first(), Some(Command::Query(q)) if q.search == "der-0"),
        "{commands:?}"
    );
    assert_eq!(app.mode(), Mode::Normal);

    ch(&mut app, '/');
    assert_eq!(
        prompt(&app),
        Some(("", "der-0")),
        "a new search starts empty; the prompt shows the one it replaces"
    );
    type_text(&mut app, "zzz");
    press(&mut app, KeyCode::Esc);
    assert_eq!(
        app.keys.query.search, "der-0",
        "Esc while typing keeps the old search"
    );

    ch(&mut app, 'f');
    let commands = press(&mut app, KeyCode::Esc);
    assert!(
        matches!(commands.first(), Some(Command::Query(q)) if q.search.is_empty() && q.state.is_none())
    );
    assert!(press(&mut app, KeyCode::Esc).is_empty(), "nothing to clear");
}

#[test]
fn a_late_page_for_an_old_query_is_dropped() {
    let mut app = loaded(10, None);
    let old = app.keys.query.clone();
    ch(&mut app, 'f');
    app.apply(Update::Keys {
        query: old,
        page: page(3, None),
    });
    assert_eq!(app.keys.rows.len(), 10);
    assert!(!app.keys.loaded);
}

#[test]
fn the_selection_follows_its_key_when_rows_move() {
    let mut app = loaded(10, None);
    ch(&mut app, 'j');
    ch(&mut app, 'j');
    assert_eq!(app.keys.selected_key().unwrap().key, "order-002");
    let mut moved = page(10, None);
    moved.keys.reverse();
    app.apply(Update::Keys {
        query: app.keys.query.clone(),
        page: moved,
    });
    assert_eq!(app.keys.selected_key().unwrap().key, "order-002");
    assert_eq!(app.keys.selected, 7);
}

#[test]
fn the_detail_pane_watches_the_selected_key() {
    let mut app = loaded(10, None);
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Command::Watch(Some("order-000".into()))]
    );
    assert!(app.keys.detail_open);
    assert_eq!(
        ch(&mut app, 'j'),
        vec![Command::Watch(Some("order-001".into()))]
    );
    // A detail for a key no longer selected is ignored.
    app.apply(Update::Detail(KeyDetail {
        info: row("order-000", KeyState::Processing, 0),
        response: None,
    }));
    assert!(app.keys.detail.is_none());
    app.apply(Update::Detail(KeyDetail {
        info: row("order-001", KeyState::Done, 1),
        response: None,
    }));
    assert_eq!(app.keys.detail.as_ref().unwrap().info.key, "order-001");
    app.apply(Update::DetailGone("order-001".into()));
    assert!(app.keys.detail.is_none());
    assert_eq!(press(&mut app, KeyCode::Enter), vec![Command::Watch(None)]);
    assert_eq!(app.keys.page_rows.get(), 34);
    // Esc closes the pane before it clears any filter.
    ch(&mut app, 'f');
    press(&mut app, KeyCode::Enter);
    assert_eq!(press(&mut app, KeyCode::Esc), vec![Command::Watch(None)]);
    assert!(!app.keys.detail_open);
    assert_eq!(
        app.keys.query.state,
        Some(KeyState::Processing),
        "the filter stays"
    );
    assert!(
        matches!(press(&mut app, KeyCode::Esc).first(), Some(Command::Query(q)) if q.state.is_none())
    );
}

#[test]
fn key_actions_wait_for_confirmation() {
    for (c, verb, command) in [
        ('r', KeyVerb::Release, Command::Release("order-000".into())),
        ('e', KeyVerb::Expire, Command::Expire("order-000".into())),
        ('d', KeyVerb::Delete, Command::Delete("order-000".into())),
    ] {
        let mut app = loaded(3, None);
        assert_eq!(ch(&mut app, c), vec![], "nothing is sent before the answer");
        assert_eq!(
            app.confirm.as_ref().map(|c| (c.verb, c.key.as_str())),
            Some((verb, "order-000"))
        );
        assert_eq!(ch(&mut app, 'x'), vec![], "other keys are ignored");
        assert_eq!(ch(&mut app, 'n'), vec![]);
        assert!(app.confirm.is_none());
        ch(&mut app, c);
        assert_eq!(ch(&mut app, 'y'), vec![command.clone()]);
        ch(&mut app, c);
        assert_eq!(press(&mut app, KeyCode::Enter), vec![command.clone()]);
        ch(&mut app, c);
        assert_eq!(press(&mut app, KeyCode::Esc), vec![]);
    }
    let mut app = loaded(3, None);
    ch(&mut app, 'j');
    assert_eq!(ch(&mut app, 'r'), vec![]);
    assert!(app.confirm.is_none(), "a done key has no lease to release");
    assert!(status(&app).contains("holds no lease"));
    let mut empty = loaded(0, None);
    ch(&mut empty, 'd');
    assert!(empty.confirm.is_none());
    assert!(status(&empty).contains("no key selected"));
}

fn faults_app() -> App {
    let mut app = loaded(1, None);
    ch(&mut app, '2');
    app
}

fn sent(commands: &[Command]) -> (Op, FaultRule) {
    match commands {
        [Command::SetFault(op, rule)] => (*op, rule.clone()),
        other => panic!("expected one SetFault, got {other:?}"),
    }
}

#[test]
fn fault_kinds_are_one_key_each_and_reach_the_server_at_once() {
    let mut app = faults_app();
    assert_eq!(
        app.faults.selected_op(),
        Op::Insert,
        "the view opens on the operation every claim goes through"
    );
    let (op, rule) = sent(&ch(&mut app, 'e'));
    assert_eq!(
        (op, rule.kind, rule.message.as_str()),
        (Op::Insert, FaultKind::Error, "injected by idem-tui")
    );
    assert_eq!(
        app.faults.current.faults.insert.kind,
        FaultKind::Error,
        "shown at once"
    );
    let (_, rule) = sent(&ch(&mut app, 't'));
    assert_eq!(
        (rule.kind, rule.latency_ms),
        (FaultKind::Timeout, 500),
        "a latency fault gets a latency"
    );
    assert_eq!(sent(&ch(&mut app, 'd')).1.kind, FaultKind::Delay);
    assert_eq!(sent(&ch(&mut app, 'l')).1.kind, FaultKind::Lost);
    assert_eq!(sent(&ch(&mut app, 'o')).1.kind, FaultKind::Off);
    assert_eq!(ch(&mut app, 'o'), vec![], "no change, nothing sent");
    let (op, rule) = sent(&ch(&mut app, ' '));
    assert_eq!((op, rule.kind), (Op::Insert, FaultKind::Error));
    assert_eq!(sent(&ch(&mut app, ' ')).1.kind, FaultKind::Off);
    for (c, op) in [
        ('g', Op::Get),
        ('j', Op::Insert),
        ('j', Op::Replace),
        ('j', Op::Delete),
        ('j', Op::Delete),
        ('k', Op::Replace),
    ] {
        ch(&mut app, c);
        assert_eq!(app.faults.selected_op(), op);
    }
    press(&mut app, KeyCode::End);
    assert_eq!(app.faults.selected_op(), Op::Delete);
}

#[test]
fn latency_probability_and_count_adjust_in_place_within_limits() {
    let mut app = faults_app();
    ch(&mut app, 'd');
    assert_eq!(sent(&ch(&mut app, '+')).1.latency_ms, 600);
    assert_eq!(sent(&ch(&mut app, '-')).1.latency_ms, 500);
    for _ in 0..5 {
        ch(&mut app, '-');
    }
    assert_eq!(app.faults.current.faults.insert.latency_ms, 0);
    assert_eq!(ch(&mut app, '-'), vec![], "latency stops at 0");
    assert_eq!(sent(&ch(&mut app, '[')).1.probability, 0.9);
    assert_eq!(sent(&ch(&mut app, ']')).1.probability, 1.0);
    assert_eq!(ch(&mut app, ']'), vec![], "probability stops at 100 %");
    for _ in 0..12 {
        ch(&mut app, '[');
    }
    assert_eq!(app.faults.current.faults.insert.probability, 0.0);
    assert_eq!(sent(&ch(&mut app, '>')).1.count, Some(1));
    assert_eq!(sent(&ch(&mut app, '>')).1.count, Some(2));
    assert_eq!(sent(&ch(&mut app, '<')).1.count, Some(1));
    assert_eq!(
        sent(&ch(&mut app, '<')).1.count,
        None,
        "below one is unlimited"
    );
}

#[test]
fn typed_fault_values_are_checked_before_sending() {
    let mut app = faults_app();
    ch(&mut app, 't');
    ch(&mut app, 'L');
    assert_eq!(
        prompt(&app),
        Some(("", "500")),
        "what is typed replaces the value; the prompt shows the old one"
    );
    type_text(&mut app, "1500");
    let (op, rule) = sent(&press(&mut app, KeyCode::Enter));
    assert_eq!((op, rule.latency_ms), (Op::Insert, 1500));

    ch(&mut app, 'L');
    type_text(&mut app, "150000");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert!(status(&app).contains("from 0 to 60000"), "{:?}", app.status);
    assert_eq!(app.faults.current.faults.insert.latency_ms, 1500);

    ch(&mut app, 'P');
    type_text(&mut app, "25%");
    assert_eq!(sent(&press(&mut app, KeyCode::Enter)).1.probability, 0.25);
    ch(&mut app, 'P');
    type_text(&mut app, "250");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![], "250 % is refused");
    assert!(status(&app).contains("percentage from 0 to 100"));

    ch(&mut app, 'C');
    type_text(&mut app, "3");
    assert_eq!(sent(&press(&mut app, KeyCode::Enter)).1.count, Some(3));
    ch(&mut app, 'C');
    assert_eq!(
        sent(&press(&mut app, KeyCode::Enter)).1.count,
        None,
        "empty is unlimited"
    );
    ch(&mut app, 'C');
    type_text(&mut app, "x");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);

    ch(&mut app, 'e');
    ch(&mut app, 'M');
    type_text(&mut app, "disk full");
    assert_eq!(
        sent(&press(&mut app, KeyCode::Enter)).1.message,
        "disk full"
    );
}

#[test]
fn a_whole_rule_is_typed_and_shown_in_the_gateways_text_form() {
    let mut app = faults_app();
    ch(&mut app, 'R');
    assert_eq!(
        prompt(&app).map(|(_, was)| was),
        Some("off"),
        "the prompt shows the rule as the table does"
    );
    type_text(&mut app, "25%3*timeout(500)");
    let (op, rule) = sent(&press(&mut app, KeyCode::Enter));
    assert_eq!(op, Op::Insert);
    assert_eq!(rule, "25%3*timeout(500)".parse().unwrap());
    assert!(
        status(&app).contains("insert: 25%3*timeout(500)"),
        "{:?}",
        app.status
    );

    ch(&mut app, 'R');
    assert_eq!(prompt(&app).map(|(_, was)| was), Some("25%3*timeout(500)"));
    type_text(&mut app, "25% 3× timeout 500ms");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![], "not the grammar");
    assert!(
        status(&app).contains("expected [P%][N*]"),
        "{:?}",
        app.status
    );
    assert_eq!(
        app.faults.current.faults.insert.to_string(),
        "25%3*timeout(500)"
    );
}

#[test]
fn keys_that_do_nothing_to_the_fault_say_why() {
    let mut app = faults_app();
    for c in ['[', ']', '<', '>', 'P', 'C'] {
        assert_eq!(ch(&mut app, c), vec![], "{c}: nothing sent");
        assert!(app.input.is_none(), "{c}: no prompt");
        let (text, severity) = app.status.clone().unwrap();
        assert!(
            text.contains("the fault is off; choose a kind first"),
            "{c}: {text}"
        );
        assert_eq!(severity, Severity::Error);
        app.status = None;
    }
    ch(&mut app, 'e');
    for c in ['+', '-', 'L'] {
        assert_eq!(ch(&mut app, c), vec![], "{c}: nothing sent");
        assert!(
            status(&app).contains("latency is for timeout and delay"),
            "{c}: {:?}",
            app.status
        );
    }
    ch(&mut app, 't');
    assert_eq!(ch(&mut app, 'M'), vec![]);
    assert!(status(&app).contains("the message is for error faults"));
    // A fault on an operation the guard never calls (delete, the last row)
    // is sent, with a warning.
    ch(&mut app, 'G');
    sent(&ch(&mut app, 'e'));
    assert!(
        status(&app).contains("the guard never calls it"),
        "{:?}",
        app.status
    );
}

#[test]
fn faults_are_not_edited_before_the_server_said_what_they_are() {
    let mut app = App::new("http://x", NOW);
    ch(&mut app, '2');
    assert_eq!(ch(&mut app, 'e'), vec![]);
    assert!(status(&app).contains("not loaded yet"));
}

#[test]
fn fault_events_update_the_table_and_the_log() {
    let mut app = faults_app();
    let rule = FaultRule {
        kind: FaultKind::Delay,
        latency_ms: 200,
        ..FaultRule::default()
    };
    app.apply(Update::Fault(FaultEvent {
        ts_ms: NOW,
        op: Op::Replace,
        rule: rule.clone(),
    }));
    assert_eq!(app.faults.current.faults.replace, rule);
    assert_eq!(app.activity.log.lines.len(), 1);
}

#[test]
fn history_and_log_stay_bounded() {
    let mut app = loaded(1, None);
    for i in 0..(LOG_LINES + 50) as u64 {
        let event = DecisionEvent {
            ts_ms: i,
            key: "k".into(),
            outcome: Outcome::Executed,
            status: None,
            latency_us: 1,
            detail: None,
        };
        app.apply(Update::Decision(event));
    }
    assert_eq!(app.activity.log.lines.len(), LOG_LINES);
    assert!(
        matches!(app.activity.log.lines.front(), Some(idem_tui::views::activity::LogLine::Decision(d)) if d.ts_ms == 50),
        "oldest dropped"
    );
    for _ in 0..HISTORY + 5 {
        app.apply(Update::Stats(Stats::default()));
    }
    assert_eq!(app.activity.rates.len(), HISTORY);
    assert_eq!(app.activity.p99_us.len(), HISTORY);
    ch(&mut app, '3');
    ch(&mut app, 'c');
    assert!(app.activity.log.lines.is_empty());
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
fn the_page_is_measured_where_it_is_drawn() {
    let mut app = loaded(100, None);
    assert_eq!(
        app.keys.page_rows.get(),
        34,
        "40 lines less header, summary, footer, borders and column header"
    );
    ch(&mut app, 'G');
    draw_at(&app, 80, 24);
    assert_eq!(
        app.keys.page_rows.get(),
        18,
        "a smaller terminal, a smaller page"
    );
    assert_eq!(
        app.keys.offset.get(),
        100 - 18,
        "the selection stays on screen"
    );
    ch(&mut app, 'g');
    draw_at(&app, 80, 24);
    press(&mut app, KeyCode::Enter);
    draw_at(&app, 80, 24);
    assert_eq!(app.keys.page_rows.get(), 8, "the detail pane takes half");
    draw_at(&app, 200, 60);
    assert!(app.keys.selected >= app.keys.offset.get());
}

#[test]
fn server_reports_show_in_the_status_line() {
    let mut app = loaded(1, None);
    app.apply(Update::Done("deleted order-000".into()));
    assert_eq!(status(&app), "deleted order-000");
    app.apply(Update::Failed("409: not processing".into()));
    assert_eq!(
        app.status.as_ref().unwrap(),
        &(
            "409: not processing".into(),
            idem_tui::views::Severity::Error
        )
    );
}

#[test]
fn the_first_commands_poll_the_default_query() {
    let app = App::new("http://x", NOW);
    assert_eq!(app.start(), vec![Command::Query(KeyQuery::default())]);
}

#[test]
fn the_last_decision_is_kept_for_keys_on_screen_only() {
    let mut app = loaded(10, None);
    let decide = |key: &str, outcome| {
        Update::Decision(DecisionEvent {
            ts_ms: NOW,
            key: key.into(),
            outcome,
            status: None,
            latency_us: 1,
            detail: None,
        })
    };
    app.apply(decide("order-003", Outcome::Executed));
    app.apply(decide("order-003", Outcome::Conflict));
    app.apply(decide("elsewhere", Outcome::Replayed));
    assert_eq!(
        app.keys.last_outcome.len(),
        1,
        "{:?}",
        app.keys.last_outcome
    );
    assert_eq!(app.keys.last_outcome["order-003"], Outcome::Conflict);
    // A new page forgets the keys that left the screen.
    let query = app.keys.query.clone();
    let mut other = page(2, None);
    other.keys[1].key = "zz".into();
    app.apply(Update::Keys { query, page: other });
    assert!(app.keys.last_outcome.is_empty());
}

#[test]
fn the_lapsed_filter_keeps_the_claims_whose_lease_ran_out() {
    let mut app = loaded(10, None);
    ch(&mut app, 'f');
    let commands = ch(&mut app, 'f');
    assert_eq!(app.keys.filter, StateFilter::Lapsed);
    let Some(Command::Query(query)) = commands.first() else {
        panic!("{commands:?}")
    };
    // The server answers with processing keys, lapsed first (sorted by lease).
    let mut lapsed = row("held-by-a-crashed-worker", KeyState::Processing, 0);
    lapsed.lease_until_ms = NOW - 1;
    lapsed.lease_remaining_ms = 0;
    let live = row("still-running", KeyState::Processing, 5);
    app.apply(Update::Keys {
        query: query.clone(),
        page: KeyPage {
            now_ms: NOW,
            keys: vec![lapsed, live],
            next: None,
            total: Some(2),
        },
    });
    let keys: Vec<&str> = app.keys.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["held-by-a-crashed-worker"]);
}

#[test]
fn the_selected_key_is_copied_as_the_client_sent_it() {
    let mut app = loaded(0, None);
    let query = app.keys.query.clone();
    app.apply(Update::Keys {
        query,
        page: KeyPage {
            now_ms: NOW,
            keys: vec![row("d747bee75cd0ee92/order-7", KeyState::Done, 0)],
            next: None,
            total: Some(1),
        },
    });
    assert_eq!(ch(&mut app, 'c'), vec![Command::Copy("order-7".into())]);
    assert!(status(&app).contains("copied \"order-7\""));
    assert_eq!(ch(&mut app, 'y'), vec![Command::Copy("order-7".into())]);
    let mut empty = loaded(0, None);
    assert_eq!(ch(&mut empty, 'c'), vec![]);
    assert!(status(&empty).contains("no key selected"));
}

#[test]
fn confirmations_warn_that_a_retry_runs_the_request_again() {
    for verb in [KeyVerb::Release, KeyVerb::Expire, KeyVerb::Delete] {
        assert!(
            verb.warning()
                .contains("the next retry runs the request again")
                || verb
                    .warning()
                    .contains("The next retry runs the request again"),
            "{verb:?}: {}",
            verb.warning()
        );
    }
}

#[test]
fn a_server_still_starting_is_connected_not_reconnected() {
    let mut app = App::new("http://x", NOW);
    app.apply(Update::Disconnected("Connection refused".into()));
    app.apply(Update::Connected);
    assert_eq!(status(&app), "connected");
}
