//! Whole frames on a `TestBackend`, fixed clock and data: text as insta
//! snapshots, and the colours that carry meaning checked on the buffer.

use super::update::{NOW, loaded, row};
use crate::action::Action;
use crate::api::{
    ConnectionState, DecisionEvent, FaultEvent, FaultKind, FaultRule, Faults, KeyDetail, KeyState,
    Op, Stats, StoreConnection, StoredResponse, Verdict, Verdicts,
};
use crate::app::App;
use crate::protocol::Update;
use crate::views::keys::KeysAction;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

fn draw(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| f.render_widget(app, f.area())).unwrap();
    terminal
}

/// Draws `app` on a `width`×`height` screen and checks the frame against
/// its snapshot `{name}_{width}x{height}`; the buffer, for the colours.
fn snapshot(app: &App, name: &str, width: u16, height: u16) -> Buffer {
    let terminal = draw(app, width, height);
    insta::assert_snapshot!(format!("{name}_{width}x{height}"), terminal.backend());
    terminal.backend().buffer().clone()
}

/// The screen's text, one string a row.
fn rows(buf: &Buffer) -> Vec<String> {
    (0..buf.area.height)
        .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect())
        .collect()
}

/// Where `text` starts on screen (first match, row by row).
fn find(buf: &Buffer, text: &str) -> Option<(u16, u16)> {
    let area = buf.area;
    for y in 0..area.height {
        let line: Vec<&str> = (0..area.width).map(|x| buf[(x, y)].symbol()).collect();
        let joined: String = line.concat();
        if let Some(byte) = joined.find(text) {
            // Convert the byte offset back to a cell column.
            let mut width = 0;
            let mut x = 0u16;
            for symbol in &line {
                if width >= byte {
                    break;
                }
                width += symbol.len();
                x += 1;
            }
            return Some((x, y));
        }
    }
    None
}

fn fg_at(buf: &Buffer, text: &str) -> Color {
    let (x, y) = find(buf, text).unwrap_or_else(|| panic!("{text:?} not on screen"));
    buf[(x, y)].fg
}

/// Each text is on screen, its first cell in its colour.
fn assert_colours(buf: &Buffer, colours: &[(&str, Color)]) {
    for (text, colour) in colours {
        assert_eq!(fg_at(buf, text), *colour, "the colour of {text:?}");
    }
}

fn stats() -> Stats {
    let mut stats = Stats {
        uptime_ms: 3_723_000,
        store: "sqlite".into(),
        ..Stats::default()
    };
    stats.rates_per_s = Verdicts {
        executed: 41.0,
        replayed: 12.5,
        in_flight: 3.0,
        conflict: 0.5,
        unavailable: 0.0,
        invalid: 0.0,
    };
    stats.store_latency_us.p50 = 85;
    stats.store_latency_us.p90 = 240;
    stats.store_latency_us.p99 = 1800;
    stats.store_latency_us.max = 12_000;
    stats.pool.in_use = 3;
    stats.pool.idle = 13;
    stats
}

fn decision(
    i: u64,
    key: &str,
    outcome: Verdict,
    status: Option<u16>,
    detail: Option<&str>,
) -> Update {
    Update::Decision(DecisionEvent {
        ts_ms: NOW - 5000 + i * 250,
        key: key.into(),
        outcome,
        status,
        latency_us: 300 + i * 700,
        detail: detail.map(Into::into),
        fence: None,
    })
}

/// The console as an operator sees it a minute into a demo.
fn busy() -> App {
    let mut app = loaded(60, Some("c60"));
    app.apply(Update::Stats(stats()));
    // Lapsed and expired keys, to see every state.
    let mut lapsed = row("order-lapsed", KeyState::Processing, 1);
    lapsed.lease_until_ms = NOW - 10;
    lapsed.lease_remaining_ms = 0;
    let mut expired = row("order-expired", KeyState::Done, 2);
    expired.expires_at_ms = NOW - 1;
    expired.expires_in_ms = 0;
    app.keys.rows.insert(1, lapsed);
    app.keys.rows.insert(2, expired);
    for (i, (key, outcome, status, detail)) in [
        ("order-000", Verdict::Executed, Some(201), None),
        (
            "order-000",
            Verdict::InFlight,
            None,
            Some("held by fence 1"),
        ),
        ("order-003", Verdict::Replayed, Some(201), None),
        (
            "order-004",
            Verdict::Conflict,
            None,
            Some("fingerprint differs"),
        ),
        (
            "order-005",
            Verdict::Unavailable,
            None,
            Some("store: insert failed: injected by idem-tui"),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        app.apply(decision(i as u64, key, outcome, status, detail));
    }
    app
}

#[test]
fn keys_view() {
    let buf = &snapshot(&busy(), "keys", 120, 40);
    assert_colours(
        buf,
        &[
            ("PROCESSING", Color::Yellow),
            ("DONE", Color::Green),
            ("LAPSED", Color::Red),
            ("EXPIRED", Color::DarkGray),
        ],
    );
    let (x, y) = find(buf, "order-000").unwrap();
    assert_eq!(
        buf[(x, y)].bg,
        Color::DarkGray,
        "the selected row stands out"
    );
    assert!(buf[(x, y)].modifier.contains(Modifier::BOLD));
    assert_eq!(fg_at(buf, "● connected"), Color::Green);
    // The last decision on a key, coloured by outcome.
    assert!(line_with(buf, "order-004").contains("CONFLICT"));
    assert_eq!(fg_at(buf, "CONFLICT"), Color::Magenta);
    assert!(line_with(buf, "order-005").contains("UNAVAILABLE"));
}

fn line_with(buf: &Buffer, text: &str) -> String {
    let (_, y) = find(buf, text).unwrap_or_else(|| panic!("{text:?} not on screen"));
    rows(buf).swap_remove(usize::from(y))
}

#[test]
fn keys_view_at_the_smallest_size() {
    let buf = &snapshot(&busy(), "keys", 80, 24);
    // The key keeps its room; fence and fingerprint wait in the detail pane.
    for column in ["KEY", "STATE", "LEASE", "EXPIRES", "STATUS", "REPLAYS"] {
        assert!(find(buf, column).is_some(), "{column} missing at 80×24");
    }
    assert!(find(buf, "FINGERPR").is_none());
}

/// Keys of three clients, one of them with keys longer than the column.
fn clients() -> App {
    let mut app = loaded(0, None);
    let keys = [
        "anon/order-1",
        "anon/order-2",
        "3f0a9c1b22e4d5a8/order-1",
        "3f0a9c1b22e4d5a8/order-2",
        "d747bee75cd0ee92/order-1",
        "d747bee75cd0ee92/2026-12-03T10:00:00Z-checkout-session-0001",
        "d747bee75cd0ee92/2026-12-03T10:00:00Z-checkout-session-0002",
        "d747bee7ffffffff/order-1",
    ];
    let page = crate::api::KeyPage {
        now_ms: NOW,
        keys: keys
            .iter()
            .enumerate()
            .map(|(i, k)| row(k, KeyState::Done, i as u64))
            .collect(),
        next: None,
        total: Some(keys.len() as u64),
    };
    let query = app.keys.query.clone();
    app.apply(Update::Keys { query, page });
    app
}

#[test]
fn every_key_is_told_apart_at_80_columns() {
    let screen = rows(&snapshot(&clients(), "clients", 80, 24));
    let rows: Vec<&String> = screen.iter().filter(|l| l.contains("DONE")).collect();
    assert_eq!(rows.len(), 8);
    for (i, a) in rows.iter().enumerate() {
        for b in &rows[i + 1..] {
            assert_ne!(
                a[..a.find("DONE").unwrap()],
                b[..b.find("DONE").unwrap()],
                "two keys look the same"
            );
        }
    }
    // The client's own key, tagged with its scope: the tag grows until the
    // two clients sharing `d747bee7` differ.
    assert!(
        screen.iter().any(|l| l.contains("anon      order-1")),
        "{screen:#?}"
    );
    assert!(
        screen.iter().any(|l| l.contains("d747bee75 order-1")),
        "{screen:#?}"
    );
    assert!(
        screen.iter().any(|l| l.contains("d747bee7f order-1")),
        "{screen:#?}"
    );
    // A key longer than its column is cut in the middle, marked, and both
    // ends stay.
    assert!(
        screen
            .iter()
            .any(|l| l.contains("2026-12-03…") && l.contains("ion-0002 ")),
        "{screen:#?}"
    );
}

#[test]
fn the_lease_bar_counts_down_with_the_clock() {
    let mut app = busy();
    let before = draw(&app, 120, 40);
    app.update(Action::Tick {
        local_ms: NOW + 1500,
    });
    let after = draw(&app, 120, 40);
    // order-003 holds a 4 s lease: 4.0s, then 2.5s.
    let line = |t: &Terminal<TestBackend>| line_with(t.backend().buffer(), "order-003");
    assert!(line(&before).contains("4.0s"), "{}", line(&before));
    assert!(line(&after).contains("2.5s"), "{}", line(&after));
}

#[test]
fn detail_pane() {
    let mut app = busy();
    app.update(Action::Keys(KeysAction::Down));
    app.update(Action::Keys(KeysAction::Down));
    app.update(Action::Keys(KeysAction::Down));
    app.update(Action::Keys(KeysAction::ToggleDetail));
    let mut info = app.keys.selected_key().unwrap().clone();
    info.replays = 2;
    app.apply(Update::Detail(KeyDetail {
        info,
        response: Some(StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-order".into(), "A-17".into()),
            ],
            body_bytes: 38,
            body_preview: "{\"order\":\"A-17\",\n \"charged\":1000}".into(),
            body_base64: String::new(),
        }),
    }));
    snapshot(&app, "detail", 120, 40);
}

#[test]
fn faults_panel() {
    let mut app = busy();
    let mut faults = Faults::default();
    faults.faults.insert = FaultRule {
        kind: FaultKind::Error,
        message: "injected by idem-tui".into(),
        ..FaultRule::default()
    };
    faults.faults.get = FaultRule {
        kind: FaultKind::Delay,
        latency_ms: 250,
        probability: 0.3,
        ..FaultRule::default()
    };
    faults.faults.replace = FaultRule {
        kind: FaultKind::Lost,
        count: Some(2),
        ..FaultRule::default()
    };
    faults.injected = 1234;
    app.apply(Update::Faults(faults.clone()));
    app.apply(Update::Fault(FaultEvent {
        ts_ms: NOW - 100,
        op: Op::Insert,
        rule: faults.faults.insert.clone(),
        by: None,
    }));
    app.apply(decision(
        30,
        "order-009",
        Verdict::Unavailable,
        None,
        Some("store: insert failed"),
    ));
    app.update(Action::ShowView(crate::views::View::Faults));
    let buf = &snapshot(&app, "faults", 120, 40);
    assert_colours(
        buf,
        &[
            ("● error", Color::Red),
            ("● delay", Color::Yellow),
            ("○ off", Color::DarkGray),
            ("UNAVAILABLE", Color::Red),
        ],
    );
    assert_eq!(
        fg_at(buf, "faults: get delay, insert error, replace lost"),
        Color::Red,
        "active faults are flagged in the summary"
    );
}

#[test]
fn activity_view() {
    let mut app = busy();
    for i in 0..80u32 {
        let mut s = stats();
        let wave = f64::from(i % 20);
        s.rates_per_s.executed = 10.0 + wave * 2.0;
        s.rates_per_s.replayed = wave;
        s.rates_per_s.unavailable = if (40..55).contains(&i) { 25.0 } else { 0.0 };
        s.store_latency_us.p99 = 500 + u64::from(i % 10) * 300;
        app.apply(Update::Stats(s));
    }
    app.update(Action::ShowView(crate::views::View::Activity));
    let buf = &snapshot(&app, "activity", 120, 40);
    assert_colours(
        buf,
        &[
            ("EXECUTED", Color::Green),
            ("REPLAYED", Color::Cyan),
            ("IN_FLIGHT", Color::Yellow),
            ("CONFLICT", Color::Magenta),
        ],
    );
}

#[test]
fn help_overlay() {
    let mut app = busy();
    app.update(Action::ToggleHelp);
    snapshot(&app, "help", 80, 24);
}

#[test]
fn confirmation_dialog() {
    let mut app = busy();
    app.update(Action::Keys(KeysAction::AskRelease));
    snapshot(&app, "confirm", 100, 30);
}

#[test]
fn disconnected() {
    let mut app = busy();
    app.apply(Update::Disconnected(
        "Connection refused (os error 111)".into(),
    ));
    app.update(Action::Tick {
        local_ms: NOW + 4000,
    });
    app.apply(Update::Disconnected(
        "Connection refused (os error 111)".into(),
    ));
    let buf = &snapshot(&app, "disconnected", 120, 40);
    let (x, y) = find(buf, "connection lost").unwrap();
    assert_eq!(buf[(x, y)].bg, Color::Red);
    assert_eq!(fg_at(buf, "✗ disconnected"), Color::Red);
    assert!(
        find(buf, "order-000").is_some(),
        "the last data stays on screen"
    );
}

#[test]
fn waiting_for_the_server_and_typing_a_prefix() {
    let mut app = App::new("http://127.0.0.1:9090", NOW);
    app.update(Action::Keys(KeysAction::Search));
    for c in "order-1".chars() {
        app.update(Action::InputChar(c));
    }
    snapshot(&app, "connecting", 80, 24);
}

#[test]
fn too_small_says_so() {
    let app = busy();
    let terminal = draw(&app, 60, 10);
    let buf = terminal.backend().buffer();
    assert!(find(buf, "needs at least 80×24").is_some());
    assert!(find(buf, "60×10").is_some());
}

#[test]
fn fingerprints_are_shortened_past_their_algorithm() {
    use crate::format::short_fingerprint;
    assert_eq!(short_fingerprint("sha256:9f86d081884c7d65"), "9f86d081");
    assert_eq!(short_fingerprint("9f86d081884c7d65"), "9f86d081");
    assert_eq!(short_fingerprint("abc"), "abc");
}

fn screen(terminal: &Terminal<TestBackend>) -> String {
    rows(terminal.backend().buffer()).join("\n") + "\n"
}

#[test]
fn a_refused_token_says_how_to_pass_one() {
    let mut app = busy();
    app.apply(Update::Unauthorized {
        status: 401,
        detail: "a bearer token is required".into(),
    });
    let terminal = draw(&app, 80, 24);
    let text = screen(&terminal);
    assert!(text.contains("✗ unauthorized"), "{text}");
    assert!(
        text.contains(
            "401: the admin API wants a token: pass --token-file FILE or IDEM_ADMIN_TOKEN"
        ),
        "{text}"
    );
    assert!(!text.contains("reconnecting"), "{text}");
    assert_eq!(
        fg_at(terminal.backend().buffer(), "✗ unauthorized"),
        Color::Red
    );
    app.has_token = true;
    let text = screen(&draw(&app, 80, 24));
    assert!(text.contains("refuses this token"), "{text}");
}

#[test]
fn the_banner_of_the_program_around_the_console_shows_above_the_view() {
    let mut app = busy();
    app.banner = Some("The run is over · q closes and shows the verdict".into());
    let terminal = draw(&app, 80, 24);
    let text = screen(&terminal);
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .contains("The run is over · q closes and shows the verdict"),
        "{text}"
    );
    assert_eq!(
        terminal.backend().buffer()[(2, 1)].bg,
        Color::Yellow,
        "it stands out"
    );
}

#[test]
fn active_faults_lead_the_summary_on_a_narrow_screen() {
    let mut app = busy();
    let mut faults = Faults::default();
    faults.faults.insert.kind = FaultKind::Error;
    app.apply(Update::Faults(faults));
    let text = screen(&draw(&app, 80, 24));
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .starts_with(" faults: insert error"),
        "{text}"
    );
}

#[test]
fn a_paused_log_says_so_and_counts_what_it_holds_back() {
    let mut app = busy();
    app.update(Action::ShowView(crate::views::View::Activity));
    app.update(Action::Activity(
        crate::views::activity::ActivityAction::Pause,
    ));
    app.apply(decision(9, "order-010", Verdict::Executed, Some(201), None));
    let text = screen(&draw(&app, 80, 24));
    assert!(text.contains("paused, 1 new · G follows"), "{text}");
    assert!(
        !text.contains("order-010"),
        "held back while paused: {text}"
    );
}

#[test]
fn the_detail_pane_shows_the_whole_key_and_dated_times_and_scrolls() {
    let mut app = clients();
    for _ in 0..6 {
        app.update(Action::Keys(KeysAction::Down));
    }
    app.update(Action::Keys(KeysAction::ToggleDetail));
    let text = screen(&draw(&app, 80, 24));
    assert!(
        text.contains("2026-12-03T10:00:00Z-checkout-session-0002"),
        "the key in full: {text}"
    );
    assert!(text.contains("client      d747bee75cd0ee92"), "{text}");
    assert!(
        text.contains("(at 2025-12-02 "),
        "a date with the time: {text}"
    );
    app.update(Action::Keys(KeysAction::DetailScrollDown));
    app.update(Action::Keys(KeysAction::DetailScrollDown));
    let text = screen(&draw(&app, 80, 24));
    assert!(
        !text.contains("│key "),
        "scrolled past the first lines: {text}"
    );
    assert!(text.contains("↓2 · J K scroll"), "{text}");
}

#[test]
fn a_gateway_without_its_store_says_so_in_red_until_it_connects() {
    let mut app = busy();
    let mut down = stats();
    down.store = "redis".into();
    down.store_connection = StoreConnection {
        state: ConnectionState::Connecting,
        since_ms: NOW - 12_000,
        attempts: 7,
        last_error: Some(
            "redis store at \"redis://127.0.0.1:6390\" could not be opened: Connection refused"
                .into(),
        ),
    };
    app.apply(Update::Stats(down.clone()));
    let terminal = draw(&app, 120, 40);
    let buf = terminal.backend().buffer();
    let line = rows(buf)[1].clone();
    assert!(
        line.contains("store redis not connected (12.0s, 7 attempts): guarded requests get 503 — redis store at"),
        "{line}"
    );
    let (x, y) = find(buf, "store redis not connected").unwrap();
    assert_eq!(buf[(x, y)].bg, Color::Red, "an alarm, as a lost console is");

    // Connected: the usual line, the store's name in it.
    down.store_connection.state = ConnectionState::Connected;
    app.apply(Update::Stats(down));
    let text = screen(&draw(&app, 120, 40));
    assert!(!text.contains("not connected"), "{text}");
    assert!(text.contains("store redis · up"), "{text}");
}

#[test]
fn keys_the_store_cannot_list_keep_the_last_page_and_say_why() {
    let mut app = busy();
    app.apply(Update::KeysUnavailable(
        "the store failed: redis store unavailable: Connection refused".into(),
    ));
    let text = screen(&draw(&app, 120, 40));
    assert!(
        text.contains("last page shown; the store failed: redis store unavailable"),
        "{text}"
    );
    assert!(text.contains("order-000"), "the rows stay: {text}");
    assert!(
        !text.contains("disconnected") && !text.contains("connection lost"),
        "the admin API answers: {text}"
    );
}

/// A key's history at the smallest size: the scripted sequence, newest
/// last, a 503's reason whole under it.
#[test]
fn history_of_a_key() {
    use crate::api::{AdminAction, AdminEvent, Event, KeyHistory, StoreErrorEvent};
    let mut app = loaded(3, None);
    let key = app.keys.rows[0].key.clone();
    app.update(Action::Keys(KeysAction::History));
    let at = |i: u64| NOW - 60_000 + i * 1_000;
    let decided =
        |i: u64, outcome: Verdict, status: u16, fence: Option<u64>, detail: Option<&str>| {
            Event::Decision(DecisionEvent {
                ts_ms: at(i),
                key: key.clone(),
                outcome,
                status: Some(status),
                latency_us: 1_200,
                detail: detail.map(Into::into),
                fence,
            })
        };
    let admin = |i: u64, action: AdminAction| {
        Event::Admin(AdminEvent {
            ts_ms: at(i),
            action,
            key: key.clone(),
            by: "127.0.0.1:41234".into(),
            fence: 1,
            version: 2,
        })
    };
    let lost =
        "memory store unavailable: reply to insert lost (injected; the operation was applied)";
    app.apply(Update::History(KeyHistory {
        key: key.clone(),
        events: vec![
            decided(0, Verdict::Executed, 201, Some(1), None),
            decided(1, Verdict::Replayed, 201, None, None),
            decided(2, Verdict::Conflict, 422, None, None),
            admin(3, AdminAction::Expire),
            Event::Fault(FaultEvent {
                ts_ms: at(4),
                op: Op::Insert,
                rule: "1*lost".parse().unwrap(),
                by: Some("127.0.0.1:41240".into()),
            }),
            Event::StoreError(StoreErrorEvent {
                ts_ms: at(5),
                key: key.clone(),
                op: Op::Insert,
                error: lost.into(),
            }),
            decided(
                5,
                Verdict::Unavailable,
                503,
                None,
                Some(&format!(
                    "the store failed: insert failed for key {key:?}: {lost}"
                )),
            ),
            admin(6, AdminAction::Release),
            decided(7, Verdict::Executed, 201, Some(5), None),
        ],
        kept: 10_000,
        since_ms: Some(at(0)),
    }));
    let buf = snapshot(&app, "history", 80, 24);
    assert_colours(
        &buf,
        &[
            ("NEW KEY", Color::Green),
            ("CONFLICT", Color::Magenta),
            ("UNAVAILABLE", Color::Red),
            ("RELEASE", Color::LightBlue),
        ],
    );
    let text = rows(&buf).join("\n");
    assert!(
        text.contains("(injected; the operation was applied)"),
        "the reason whole:\n{text}"
    );
}
