//! The activity view: the decision log and the history behind the charts.

use super::{ch, key, loaded};
use crossterm::event::KeyCode;
use idem_tui::action::{Action, from_key};
use idem_tui::api::{DecisionEvent, Outcome, Stats};
use idem_tui::app::App;
use idem_tui::protocol::Update;
use idem_tui::views::View;
use idem_tui::views::activity::{ActivityAction, HISTORY, LOG_LINES};

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
            outcome: Outcome::Executed,
            status: None,
            latency_us: 1,
            detail: None,
            fence: None,
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
