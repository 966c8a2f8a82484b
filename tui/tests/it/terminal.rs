//! The real `idem-tui` binary in a pseudo-terminal (tmux), driven by keys
//! as a person would, against the fake admin server.

use idem_admin_api::{KeyState, Verdict};
use idem_fake_admin::Fake;
use idem_harness::Tmux;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_idem-tui");

/// `idem-tui --admin URL` in a `width`×`height` pane.
fn console(name: &str, width: u16, height: u16, url: &str) -> Tmux {
    Tmux::start(
        &format!("tui-{name}"),
        width,
        height,
        &format!("{BIN} --admin {url}"),
    )
}

/// A fake server with `in_flight` keys `order-…` being processed and `paid`
/// keys `paid-…` done, and the console on it in a `width`×`height` pane.
async fn console_on_orders(
    name: &str,
    width: u16,
    height: u16,
    in_flight: usize,
    paid: usize,
) -> (Fake, Tmux) {
    let fake = Fake::with_keys(&[
        ("order", in_flight, KeyState::Processing),
        ("paid", paid, KeyState::Done),
    ])
    .await;
    let tmux = console(name, width, height, &fake.url);
    (fake, tmux)
}

async fn wait_for_request(fake: &Fake, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = fake.shared.requests().into_iter().find(|r| pred(r)) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the server never got {what}: {:?}",
            fake.shared.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn line_with<'a>(screen: &'a str, text: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(text))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one session at the console, top to bottom
async fn keys_appear_a_fault_is_flipped_from_the_keyboard_and_q_restores_the_terminal() {
    let (fake, tmux) = console_on_orders("main", 120, 40, 200, 50).await;

    let screen = tmux.wait_for("keys and a live connection", |s| {
        s.contains("order-00000") && s.contains("● connected")
    });
    assert!(
        line_with(&screen, "order-00000").contains("PROCESSING"),
        "{screen}"
    );
    assert!(
        screen.contains("1–100 of 250"),
        "the server pages: {screen}"
    );
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "1",
        "the console uses the alternate screen"
    );

    // The lease counts down on screen.
    let first = line_with(&screen, "order-00000").to_owned();
    let later = tmux.wait_for("the lease to count down", |s| {
        line_with(s, "order-00000") != first
    });
    assert!(
        line_with(&later, "order-00000").contains("PROCESSING"),
        "{later}"
    );

    // Flip the insert fault on with its key: a draft, shown and not sent;
    // Enter applies it: the PUT reaches the server and the change comes
    // back through the event stream.
    tmux.keys(&["2"]);
    tmux.wait_for_text("Store faults");
    tmux.keys(&["e"]);
    let screen = tmux.wait_for_text("not applied: Enter applies it");
    assert!(
        line_with(&screen, "│insert").contains("✎ error"),
        "{screen}"
    );
    assert!(
        !fake.shared.requests().iter().any(|r| r.starts_with("PUT")),
        "a draft is not sent: {:?}",
        fake.shared.requests()
    );
    tmux.keys(&["Enter"]);
    let put = wait_for_request(&fake, "PUT /v1/faults", |r| r.starts_with("PUT /v1/faults")).await;
    let body: serde_json::Value =
        serde_json::from_str(put.strip_prefix("PUT /v1/faults ").unwrap()).unwrap();
    assert_eq!(body["faults"]["insert"]["kind"], "error", "{put}");
    assert_eq!(
        body["faults"].as_object().unwrap().len(),
        1,
        "only insert is sent: {put}"
    );
    let screen = tmux.wait_for_text("insert → error");
    assert!(
        line_with(&screen, "│insert").contains("● error"),
        "{screen}"
    );
    assert!(screen.contains("faults: insert error"), "{screen}");

    // Decisions from the event stream show up in the log.
    let shared = fake.shared.clone();
    let emitter = tokio::spawn(async move {
        loop {
            shared.decision("order-00042", Verdict::Unavailable);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    tmux.wait_for("an unavailable decision", |s| {
        line_with(s, "UNAVAILABLE").contains("order-00042")
    });
    emitter.abort();

    // And off again with Space.
    tmux.keys(&["Space"]);
    wait_for_request(&fake, "the fault switched off", |r| {
        let body: serde_json::Value =
            serde_json::from_str(r.strip_prefix("PUT /v1/faults ").unwrap_or("{}")).unwrap();
        body["faults"]["insert"]["kind"] == "off"
    })
    .await;
    tmux.wait_for_text("insert → off");

    tmux.keys(&["q"]);
    let screen = tmux.wait_for("the exit code and the terminal modes", |s| {
        s.contains("exit=0") && s.contains("icanon")
    });
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "0",
        "left the alternate screen"
    );
    assert_eq!(
        tmux.display("#{cursor_flag}"),
        "1",
        "the cursor is visible again"
    );
    let modes = line_with(&screen, "icanon");
    assert!(
        modes.contains("icanon") && !modes.contains("-icanon"),
        "canonical mode restored: {screen}"
    );
    assert!(
        modes.split(' ').any(|m| m == "echo"),
        "echo restored: {screen}"
    );
    assert!(
        !screen.contains("order-00000"),
        "the console's screen is gone: {screen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_found_by_search_inspected_and_deleted_after_confirmation() {
    let (fake, tmux) = console_on_orders("detail", 100, 30, 30, 5).await;
    tmux.wait_for_text("order-00000");

    // Anywhere in the key, not only its start.
    tmux.keys(&["/", "a", "i", "d", "-", "Enter"]);
    let screen = tmux.wait_for("the search", |s| {
        s.contains("paid-00000") && !s.contains("order-00000")
    });
    assert!(screen.contains(r#"search "aid-""#), "{screen}");

    tmux.keys(&["j", "Enter"]);
    let screen = tmux.wait_for_text("content-type: application/json");
    assert!(
        screen.contains(r#"{"order":1}"#),
        "the body preview: {screen}"
    );
    assert!(screen.contains("201 · 15 body bytes"), "{screen}");

    tmux.keys(&["d"]);
    tmux.wait_for_text("Delete paid-00001?");
    tmux.keys(&["n"]);
    tmux.wait_for("the dialog to close", |s| !s.contains("Delete paid-00001?"));
    assert!(fake.shared.requests().is_empty(), "no is no");
    tmux.keys(&["d", "y"]);
    wait_for_request(&fake, "the delete", |r| r == "DELETE /v1/keys/paid-00001").await;
    tmux.wait_for("the key to disappear", |s| {
        s.contains("deleted paid-00001") && !s.contains("│paid-00001")
    });
    tmux.quit();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_server_shows_and_the_console_reconnects_by_itself() {
    let fake = Fake::with_keys(&[("order", 10, KeyState::Done)]).await;
    let addr = fake.addr;
    let tmux = console("reconnect", 120, 40, &fake.url);
    tmux.wait_for_text("order-00009");
    tmux.keys(&["j", "j"]);

    fake.stop().await;
    let screen = tmux.wait_for_text("connection lost");
    assert!(screen.contains("✗ disconnected"), "{screen}");
    assert!(
        screen.contains("order-00009"),
        "the last data stays: {screen}"
    );

    let back = Fake::start_on(&addr.to_string(), None).await;
    back.seed("order", 10, KeyState::Done);
    back.seed("new", 1, KeyState::Processing);
    let screen = tmux.wait_for("the reconnection", |s| {
        s.contains("● connected") && s.contains("new-00000")
    });
    assert!(!screen.contains("connection lost"), "{screen}");
    tmux.quit();
}

/// The token from a file (`--token-file`, or `IDEM_ADMIN_TOKEN_FILE`), so
/// that `ps` does not show it: one trailing newline dropped, sent as the
/// bearer token the server asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_comes_from_a_file_that_ps_does_not_show() {
    let fake = Fake::start_on("127.0.0.1:0", Some("9f86d081884c7d659a2feaa0c55ad015")).await;
    fake.seed("paid", 3, KeyState::Done);
    let file = std::env::temp_dir().join(idem_harness::unique("idem-tui-token"));
    std::fs::write(&file, "9f86d081884c7d659a2feaa0c55ad015\n").unwrap();
    for (name, command) in [
        (
            "token-file",
            format!(
                "env -u IDEM_ADMIN_TOKEN {BIN} --admin {} --token-file {}",
                fake.url,
                file.display()
            ),
        ),
        (
            "token-file-env",
            format!(
                "env -u IDEM_ADMIN_TOKEN IDEM_ADMIN_TOKEN_FILE={} {BIN} --admin {}",
                file.display(),
                fake.url
            ),
        ),
    ] {
        let tmux = Tmux::start(&format!("tui-{name}"), 100, 30, &command);
        tmux.wait_for("the keys, with the token from the file", |s| {
            s.contains("● connected") && s.contains("paid-00002")
        });
        tmux.quit();
    }
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_keys_are_paged_by_the_server() {
    let fake = Fake::with_keys(&[("k", 100_000, KeyState::Done)]).await;
    let tmux = console("scale", 120, 40, &fake.url);
    tmux.wait_for_text("1–100 of 100,000");
    // Shrinking to the smallest supported size re-lays the screen out.
    tmux.resize(80, 24);
    let screen = tmux.wait_for("the 80×24 layout", |s| {
        s.lines()
            .nth(22)
            .is_some_and(|l| l.starts_with('╰') && l.ends_with('╯'))
    });
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    assert!(
        line_with(&screen, "KEY▲").contains("REPLAYS"),
        "every column still there: {screen}"
    );
    // Past the end of the page, the next one comes from the server.
    tmux.keys(&["G", "PageDown"]);
    let screen = tmux.wait_for("the next page", |s| {
        s.contains("│k-00100") && !s.contains("loading")
    });
    assert!(screen.contains("101–200 of 100,000"), "{screen}");
    tmux.keys(&["PageUp"]);
    let screen = tmux.wait_for("the page before", |s| {
        s.contains("│k-00099") && !s.contains("loading")
    });
    assert!(
        screen.contains("1–100 of 100,000"),
        "back on the row PgUp came from: {screen}"
    );
    let queries = fake.shared.lock().keys_queries.clone();
    assert!(
        queries
            .iter()
            .filter(|q| *q != "stats")
            .all(|q| q.ends_with("limit=100")),
        "never more than a page: {:?}",
        &queries[..3]
    );
    assert!(queries.iter().any(|q| q.contains(r#"after=Some("o100")"#)));
    tmux.quit();
}

/// Runs `idem-tui` as `command` sets it up: it must fail, saying `says` on
/// stderr.
#[track_caller]
fn assert_refused(command: &mut Command, says: &str) {
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(says), "{err}");
}

#[test]
fn bad_arguments_are_refused_before_touching_the_terminal() {
    assert_refused(
        Command::new(BIN).args(["--admin", "127.0.0.1:9090"]),
        "write it as http://127.0.0.1:9090",
    );
    assert_refused(
        Command::new(BIN).env_remove("IDEM_ADMIN_URL"),
        "--admin <URL>",
    );
    assert_refused(
        Command::new(BIN)
            .args(["--admin", "http://127.0.0.1:1", "--token", "t"])
            .args(["--token-file", "/dev/null"]),
        "--token (or IDEM_ADMIN_TOKEN) and --token-file",
    );
    assert_refused(
        Command::new(BIN).args([
            "--admin",
            "http://127.0.0.1:1",
            "--token-file",
            "/no/such/file",
        ]),
        "--token-file /no/such/file",
    );
    // The env var is read, then the tty checked.
    assert_refused(
        Command::new(BIN).env("IDEM_ADMIN_URL", "http://127.0.0.1:1"),
        "not a terminal",
    );
}

/// The resident memory of the console (the pane's shell's child), in KiB.
fn console_rss_kib(tmux: &Tmux) -> u64 {
    let shell = tmux.display("#{pane_pid}");
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
    let pid = children
        .split_whitespace()
        .next()
        .expect("idem-tui is running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_while_paging_through_a_hundred_thousand_keys() {
    let fake = Fake::with_keys(&[("k", 100_000, KeyState::Processing)]).await;
    let tmux = console("memory", 80, 24, &fake.url);
    let emitter = {
        let shared = fake.shared.clone();
        tokio::spawn(async move {
            for i in 0u64.. {
                shared.decision(&format!("k-{:05}", i % 100_000), Verdict::Executed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tmux.wait_for_text("1–100 of 100,000");
    let mut baseline = 0;
    for page in 1..=20u32 {
        tmux.keys(&["G", "PageDown"]);
        let first = format!("│k-{:05}", page * 100);
        tmux.wait_for(&first, |s| s.contains(&first) && !s.contains("loading"));
        if page == 3 {
            baseline = console_rss_kib(&tmux);
        }
    }
    let after = console_rss_kib(&tmux);
    eprintln!("console RSS: {baseline} KiB after 3 pages, {after} KiB after 20");
    emitter.abort();
    assert!(
        after < baseline + 8 * 1024,
        "RSS grew from {baseline} KiB to {after} KiB over 17 pages and thousands of decisions"
    );
    tmux.quit();
}
