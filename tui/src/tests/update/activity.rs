//! The activity view: the decision log and the history behind the charts.

use super::{assert_keymap, ch, loaded, press};
use crate::action::Action;
use crate::api::{AdminAction, AdminEvent, DecisionEvent, Event, Stats, Verdict};
use crate::app::App;
use crate::protocol::Update;
use crate::views::View;
use crate::views::activity::{ActivityAction, HISTORY, LOG_LINES};
use crossterm::event::KeyCode;

/// A loaded console on the activity view, where each of `bindings`' keys
/// does its action.
fn activity_view(bindings: &[(KeyCode, ActivityAction)]) -> App {
    let mut app = loaded(1, None);
    app.update(Action::ShowView(View::Activity));
    let bindings: Vec<(KeyCode, Action)> = bindings
        .iter()
        .map(|&(code, action)| (code, Action::Activity(action)))
        .collect();
    assert_keymap(&app, &bindings);
    app
}

#[test]
fn the_decision_log_scrolls_and_pauses() {
    let mut app = activity_view(&[
        (KeyCode::Char('c'), ActivityAction::ClearLog),
        (KeyCode::Char('k'), ActivityAction::ScrollUp),
        (KeyCode::Char('j'), ActivityAction::ScrollDown),
        (KeyCode::PageUp, ActivityAction::PageUp),
        (KeyCode::PageDown, ActivityAction::PageDown),
        (KeyCode::Char('g'), ActivityAction::Oldest),
        (KeyCode::Char('G'), ActivityAction::Follow),
        (KeyCode::Char('p'), ActivityAction::Pause),
        (KeyCode::Char(' '), ActivityAction::Pause),
    ]);
    let decide = |app: &mut App, i: u64| {
        app.apply(Update::Decision(DecisionEvent {
            ts_ms: i,
            key: format!("k-{i}"),
            outcome: Verdict::Executed,
            status: None,
            latency_us: 1,
            detail: None,
            fence: None,
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
fn history_and_log_stay_bounded() {
    let mut app = loaded(1, None);
    for i in 0..(LOG_LINES + 50) as u64 {
        let event = DecisionEvent {
            ts_ms: i,
            key: "k".into(),
            outcome: Verdict::Executed,
            status: None,
            latency_us: 1,
            detail: None,
            fence: None,
        };
        app.apply(Update::Decision(event));
    }
    assert_eq!(app.activity.log.lines.len(), LOG_LINES);
    assert!(
        matches!(app.activity.log.lines.front(), Some(crate::views::activity::LogLine::Decision(d)) if d.ts_ms == 50),
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

fn decided(i: u64, outcome: Verdict, detail: Option<&str>) -> Update {
    Update::Decision(DecisionEvent {
        ts_ms: i,
        key: format!("anon/k-{i}"),
        outcome,
        status: Some(503),
        latency_us: 1,
        detail: detail.map(Into::into),
        fence: None,
    })
}

#[test]
fn the_log_shows_one_kind_of_line_and_opens_its_bottom_line_in_full() {
    let mut app = activity_view(&[
        (KeyCode::Char('f'), ActivityAction::NextFilter),
        (KeyCode::Enter, ActivityAction::Expand),
        (KeyCode::Esc, ActivityAction::Collapse),
    ]);
    let reason = "store unavailable: the store failed: insert failed for key \"anon/k-3\": memory store unavailable: injected on insert";
    app.apply(decided(1, Verdict::Executed, None));
    app.apply(decided(2, Verdict::Replayed, None));
    app.apply(decided(3, Verdict::Unavailable, Some(reason)));
    app.apply(decided(4, Verdict::Executed, None));
    app.apply(Update::Event(Event::Admin(AdminEvent {
        ts_ms: 5,
        action: AdminAction::Release,
        key: "anon/k-3".into(),
        by: "127.0.0.1:5555".into(),
        fence: 1,
        version: 1,
    })));
    let keys = |app: &App| -> Vec<String> {
        app.activity
            .log
            .shown()
            .iter()
            .map(|l| l.key().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(keys(&app).len(), 5);
    // f: executed, replayed, in flight, conflict, unavailable.
    ch(&mut app, 'f');
    assert_eq!(keys(&app), ["anon/k-1", "anon/k-4"], "only executions");
    for _ in 0..4 {
        ch(&mut app, 'f');
    }
    assert_eq!(
        keys(&app),
        ["anon/k-3"],
        "only refusals for want of the store"
    );
    // Enter opens the bottom line in full: the whole reason, word for word.
    press(&mut app, KeyCode::Enter);
    assert!(app.activity.log.expanded);
    let screen = super::screen(&app, 80, 24);
    let shown: String = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        shown.contains("reason store unavailable: the store failed: insert failed for key")
            && shown.contains("injected on insert"),
        "{screen}"
    );
    // New lines do not move the open one.
    app.apply(decided(6, Verdict::Unavailable, Some("later")));
    assert_eq!(
        app.activity.log.selected().and_then(|l| l.key()),
        Some("anon/k-3")
    );
    press(&mut app, KeyCode::Esc);
    assert!(!app.activity.log.expanded);
    ch(&mut app, 'f');
    ch(&mut app, 'f');
    assert_eq!(keys(&app), ["anon/k-3"], "operators' actions");
    ch(&mut app, 'f');
    ch(&mut app, 'f');
    assert_eq!(keys(&app).len(), 6, "all again");
}

#[test]
fn a_reason_cut_short_ends_at_a_word() {
    let mut app = loaded(1, None);
    app.update(Action::ShowView(View::Activity));
    app.apply(decided(
        1,
        Verdict::Unavailable,
        Some("store unavailable: insert failed for key anon/order-1 because the connection was refused"),
    ));
    let screen = super::screen(&app, 120, 40);
    let line = screen
        .lines()
        .find(|l| l.contains("UNAVAILABLE"))
        .unwrap()
        .trim_end_matches(['│', ' ']);
    let cut = line.rsplit("  ").next().unwrap();
    assert!(cut.ends_with('…'), "{line}");
    let kept = cut.trim_end_matches('…');
    assert!(
        "store unavailable: insert failed for key anon/order-1 because the connection was refused"
            .split(' ')
            .any(|w| kept.ends_with(w)),
        "cut after a whole word: {kept:?}"
    );
}
