//! The faults view: a rule edited key by key into a draft that `Enter`
//! applies, or typed whole; off at once.

use super::{NOW, assert_prompt_opened, ch, loaded, press, status, type_text};
use crate::api::{FaultEvent, FaultKind, FaultRule, Op};
use crate::app::App;
use crate::protocol::{Command, Update};
use crate::views::Severity;
use crossterm::event::KeyCode;

#[test]
fn the_cursor_starts_on_insert() {
    use crate::views::faults::FaultsView;
    assert_eq!(
        FaultsView::default().selected_op(),
        Op::Insert,
        "the one the guard claims with"
    );
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

/// The selected operation's draft: its rule, not sent yet.
fn drafted(app: &App) -> FaultRule {
    match &app.faults.draft {
        Some((op, rule)) if *op == app.faults.selected_op() => rule.clone(),
        other => panic!(
            "expected a draft of {}, got {other:?}",
            app.faults.selected_op()
        ),
    }
}

/// `Enter`: the draft goes to the server.
fn apply(app: &mut App) -> (Op, FaultRule) {
    let sent = sent(&press(app, KeyCode::Enter));
    assert_eq!(app.faults.draft, None, "applied, no draft left");
    sent
}

#[test]
fn fault_kinds_are_one_key_each_and_go_live_only_when_applied() {
    let mut app = faults_app();
    assert_eq!(
        app.faults.selected_op(),
        Op::Insert,
        "the view opens on the operation every claim goes through"
    );
    assert_eq!(
        ch(&mut app, 'e'),
        vec![],
        "a key press makes a draft, sends nothing"
    );
    let rule = drafted(&app);
    assert_eq!(
        (rule.kind, rule.message.as_str()),
        (FaultKind::Error, "injected by idem-tui")
    );
    assert_eq!(
        app.faults.current.faults.insert.kind,
        FaultKind::Off,
        "not in force"
    );
    assert_eq!(
        app.faults.shown(Op::Insert).kind,
        FaultKind::Error,
        "the table shows the draft"
    );
    assert!(
        status(&app).contains("Enter applies it"),
        "{:?}",
        app.status
    );
    let (op, rule) = apply(&mut app);
    assert_eq!((op, rule.kind), (Op::Insert, FaultKind::Error));
    assert_eq!(
        app.faults.current.faults.insert.kind,
        FaultKind::Error,
        "shown at once"
    );

    assert_eq!(ch(&mut app, 't'), vec![]);
    assert_eq!(
        (drafted(&app).kind, drafted(&app).latency_ms),
        (FaultKind::Timeout, 500),
        "a latency fault gets a latency"
    );
    ch(&mut app, 'd');
    assert_eq!(drafted(&app).kind, FaultKind::Delay);
    ch(&mut app, 'l');
    assert_eq!(apply(&mut app).1.kind, FaultKind::Lost);
    // Off applies at once: taking a fault away is always safe.
    assert_eq!(sent(&ch(&mut app, 'o')).1.kind, FaultKind::Off);
    assert_eq!(ch(&mut app, 'o'), vec![], "no change, nothing sent");
    assert_eq!(
        ch(&mut app, ' '),
        vec![],
        "Space on an off fault drafts an error"
    );
    assert_eq!(apply(&mut app).1.kind, FaultKind::Error);
    assert_eq!(
        sent(&ch(&mut app, ' ')).1.kind,
        FaultKind::Off,
        "and off at once"
    );

    // Esc discards a draft; so does moving to another operation.
    ch(&mut app, 'e');
    assert_eq!(press(&mut app, KeyCode::Esc), vec![]);
    assert_eq!(app.faults.draft, None);
    assert_eq!(app.faults.current.faults.insert.kind, FaultKind::Off);
    ch(&mut app, 'e');
    ch(&mut app, 'j');
    assert_eq!(app.faults.draft, None);
    assert!(
        status(&app).contains("discarded (not applied)"),
        "{:?}",
        app.status
    );
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert!(
        status(&app).contains("no draft to apply"),
        "{:?}",
        app.status
    );
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

/// The console once sent each key press: a fault with a count went live
/// unlimited on `e`, and hit calls before `>` `>` made it 2.
#[test]
fn a_counted_fault_goes_live_whole_with_its_count() {
    let mut app = faults_app();
    for c in ['e', '>', '>'] {
        assert_eq!(ch(&mut app, c), vec![], "{c}: nothing sent yet");
    }
    let (op, rule) = apply(&mut app);
    assert_eq!(
        (op, rule.kind, rule.count),
        (Op::Insert, FaultKind::Error, Some(2))
    );
}

#[test]
fn latency_probability_and_count_adjust_the_draft_within_limits() {
    let mut app = faults_app();
    ch(&mut app, 'd');
    ch(&mut app, '+');
    assert_eq!(drafted(&app).latency_ms, 600);
    ch(&mut app, '-');
    assert_eq!(drafted(&app).latency_ms, 500);
    for _ in 0..5 {
        ch(&mut app, '-');
    }
    assert_eq!(drafted(&app).latency_ms, 0);
    assert_eq!(ch(&mut app, '-'), vec![]);
    assert_eq!(drafted(&app).latency_ms, 0, "latency stops at 0");
    ch(&mut app, '[');
    assert_eq!(drafted(&app).probability, 0.9);
    ch(&mut app, ']');
    ch(&mut app, ']');
    assert_eq!(drafted(&app).probability, 1.0, "probability stops at 100 %");
    for _ in 0..12 {
        ch(&mut app, '[');
    }
    assert_eq!(drafted(&app).probability, 0.0);
    ch(&mut app, '>');
    ch(&mut app, '>');
    assert_eq!(drafted(&app).count, Some(2));
    ch(&mut app, '<');
    ch(&mut app, '<');
    assert_eq!(drafted(&app).count, None, "below one is unlimited");
    let (_, rule) = apply(&mut app);
    assert_eq!(
        (rule.kind, rule.latency_ms, rule.probability, rule.count),
        (FaultKind::Delay, 0, 0.0, None)
    );
}

#[test]
fn typed_fault_values_are_checked_into_the_draft() {
    let mut app = faults_app();
    ch(&mut app, 't');
    ch(&mut app, 'L');
    assert_prompt_opened(&app, "500");
    type_text(&mut app, "1500");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![], "into the draft");
    assert_eq!(drafted(&app).latency_ms, 1500);

    ch(&mut app, 'L');
    type_text(&mut app, "150000");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert!(status(&app).contains("from 0 to 60000"), "{:?}", app.status);
    assert_eq!(drafted(&app).latency_ms, 1500);

    ch(&mut app, 'P');
    type_text(&mut app, "25%");
    press(&mut app, KeyCode::Enter);
    assert_eq!(drafted(&app).probability, 0.25);
    ch(&mut app, 'P');
    type_text(&mut app, "250");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![], "250 % is refused");
    assert!(status(&app).contains("percentage from 0 to 100"));

    ch(&mut app, 'C');
    type_text(&mut app, "3");
    press(&mut app, KeyCode::Enter);
    assert_eq!(drafted(&app).count, Some(3));
    ch(&mut app, 'C');
    type_text(&mut app, "x");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    let (op, rule) = apply(&mut app);
    assert_eq!(
        (op, rule.to_string()),
        (Op::Insert, "25%3*timeout(1500)".to_owned())
    );

    ch(&mut app, 'e');
    ch(&mut app, 'M');
    type_text(&mut app, "disk full");
    press(&mut app, KeyCode::Enter);
    assert_eq!(apply(&mut app).1.message, "disk full");
}

#[test]
fn a_whole_rule_is_typed_and_applied_on_its_enter() {
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
    ch(&mut app, 'e');
    apply(&mut app);
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
