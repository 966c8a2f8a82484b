//! The faults view: a rule edited key by key or typed whole, and sent to
//! the server at once.

use super::{NOW, assert_prompt_opened, ch, loaded, press, status, type_text};
use crossterm::event::KeyCode;
use idem_tui::api::{FaultEvent, FaultKind, FaultRule, Op};
use idem_tui::app::App;
use idem_tui::protocol::{Command, Update};
use idem_tui::views::Severity;

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
    assert_prompt_opened(&app, "500");
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
    assert_prompt_opened(&app, "off"); // the rule as the table shows it
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
    assert_prompt_opened(&app, "25%3*timeout(500)");
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
        by: None,
    }));
    assert_eq!(app.faults.current.faults.replace, rule);
    assert_eq!(app.activity.log.lines.len(), 1);
}
