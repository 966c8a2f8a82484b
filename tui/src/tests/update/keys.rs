//! The keys view: moving, paging, sorting, filtering, the detail pane and
//! the key actions.

use super::{NOW, assert_prompt_opened, ch, draw_at, loaded, page, press, row, status, type_text};
use crate::action::{Action, Mode};
use crate::api::{DecisionEvent, Event, KeyDetail, KeyHistory, KeyPage, KeyState, Verdict};
use crate::protocol::{Command, KeyQuery, Order, Sort, Update};
use crate::views::KeyVerb;
use crate::views::keys::StateFilter;
use crossterm::event::KeyCode;

#[test]
fn the_view_alone_asks_what_to_search_for() {
    use crate::views::keys::{KeysAction, KeysView};
    let mut keys = KeysView::default();
    let effects = keys.update(KeysAction::Search);
    assert!(effects.input.is_some(), "`/` asks what to search for");
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
    assert_prompt_opened(&app, "der-0"); // the search it replaces
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
            fence: None,
        })
    };
    app.apply(decide("order-003", Verdict::Executed));
    app.apply(decide("order-003", Verdict::Conflict));
    app.apply(decide("elsewhere", Verdict::Replayed));
    assert_eq!(
        app.keys.last_outcome.len(),
        1,
        "{:?}",
        app.keys.last_outcome
    );
    assert_eq!(app.keys.last_outcome["order-003"], Verdict::Conflict);
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
fn y_copies_the_store_key_the_admin_api_needs_and_c_the_clients() {
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
    assert_eq!(
        ch(&mut app, 'y'),
        vec![Command::Copy("d747bee75cd0ee92/order-7".into())]
    );
    assert!(
        status(&app).contains("/v1/keys/d747bee75cd0ee92%2Forder-7"),
        "says how the admin API names it: {:?}",
        app.status
    );
    assert_eq!(ch(&mut app, 'c'), vec![Command::Copy("order-7".into())]);
    assert!(status(&app).contains("copied the client's key \"order-7\""));
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
fn h_opens_the_selected_keys_history_polled_until_closed() {
    let mut app = loaded(3, None);
    let key = app.keys.rows[1].key.clone();
    ch(&mut app, 'j');
    assert_eq!(ch(&mut app, 'h'), vec![Command::History(Some(key.clone()))]);
    let pane = app.keys.history.as_ref().expect("open");
    assert_eq!(
        (pane.key.as_str(), pane.history.is_none()),
        (key.as_str(), true)
    );
    // Another key's history (a late answer) is not shown.
    app.apply(Update::History(KeyHistory {
        key: "other".into(),
        ..KeyHistory::default()
    }));
    assert!(app.keys.history.as_ref().unwrap().history.is_none());
    let history = KeyHistory {
        key: key.clone(),
        events: vec![Event::Decision(DecisionEvent {
            ts_ms: NOW,
            key: key.clone(),
            outcome: Verdict::Executed,
            status: Some(201),
            latency_us: 900,
            detail: None,
            fence: Some(1),
        })],
        kept: 10_000,
        since_ms: Some(NOW),
    };
    app.apply(Update::History(history.clone()));
    assert_eq!(app.keys.history.as_ref().unwrap().history, Some(history));
    assert!(super::screen(&app, 80, 24).contains("NEW KEY"));
    // Moves scroll it; other keys say how to close it; y still copies its key.
    assert_eq!(ch(&mut app, 'k'), vec![]);
    assert_eq!(app.keys.history.as_ref().unwrap().back, 1);
    ch(&mut app, 's');
    assert!(status(&app).contains("h or Esc closes it"));
    assert_eq!(ch(&mut app, 'y'), vec![Command::Copy(key.clone())]);
    assert_eq!(press(&mut app, KeyCode::Esc), vec![Command::History(None)]);
    assert!(app.keys.history.is_none());
    ch(&mut app, 'h');
    assert_eq!(
        ch(&mut app, 'h'),
        vec![Command::History(None)],
        "h closes it too"
    );
}

#[test]
fn status_lines_fade() {
    let mut app = loaded(1, None);
    ch(&mut app, 'y');
    assert!(status(&app).contains("copied"));
    app.update(Action::Tick {
        local_ms: NOW + 4_900,
    });
    assert!(status(&app).contains("copied"), "still there after 4.9 s");
    app.update(Action::Tick {
        local_ms: NOW + 5_000,
    });
    assert_eq!(status(&app), "", "news fades after 5 s");
    app.apply(Update::Failed("403: no".into()));
    app.update(Action::Tick {
        local_ms: NOW + 14_900,
    });
    assert_eq!(status(&app), "403: no", "an error stays 10 s");
    app.update(Action::Tick {
        local_ms: NOW + 15_000,
    });
    assert_eq!(status(&app), "");
}

#[test]
fn the_detail_pane_says_which_gateway_holds_a_processing_key() {
    let mut app = loaded(0, None);
    let mut stats = crate::api::Stats::default();
    stats.gateway.name = "gw-1".into();
    stats.gateway.listen = "127.0.0.1:8080".into();
    app.apply(Update::Stats(stats));
    let mut here = row("order-here", KeyState::Processing, 0);
    here.holder = "00000000000000ab".into();
    here.held_here = true;
    let mut away = row("order-away", KeyState::Processing, 1);
    away.holder = "00000000000000cd".into();
    let query = app.keys.query.clone();
    app.apply(Update::Keys {
        query,
        page: KeyPage {
            now_ms: NOW,
            keys: vec![here, away],
            next: None,
            total: Some(2),
        },
    });
    press(&mut app, KeyCode::Enter);
    let screen = super::screen(&app, 120, 40);
    assert!(
        screen.contains(
            "holder      0x00000000000000ab · held by this gateway (gw-1 · 127.0.0.1:8080)"
        ),
        "{screen}"
    );
    ch(&mut app, 'j');
    let screen = super::screen(&app, 120, 40);
    assert!(
        screen.contains("0x00000000000000cd · another host's, or no one's (not run here)"),
        "{screen}"
    );
}
