//! The operator console end to end, as a person uses it: the real `idem`
//! binary serving (`idem ledger` behind `idem serve`) with traffic from two
//! clients, and `idem tui` in an 80×24 tmux pane driven by keys. Every key
//! is told apart; `/` finds a key by what the client sent; the insert fault,
//! flipped from the keyboard, turns requests into 503s and unavailable
//! decisions; flipped back, requests succeed; `q` exits cleanly. Without
//! the admin token, the console says how to pass it (the environment, a
//! file). A gateway without its store shows in red until it connects.

use idem_harness::Tmux;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::netstores::postgres::with;
use crate::netstores::{host_port, via};
use crate::proxy::Proxy;
pub(crate) use crate::support::Proc;
use crate::support::{IDEM, spawn_ledger, spawn_serve};

/// One HTTP/1.1 request; returns the status code (0 if the server is not up yet).
pub(crate) fn post(port: u16, key: &str, body: &str) -> u16 {
    post_as(port, None, key, body)
}

/// [`post`] as the client with this `Authorization` header.
fn post_as(port: u16, auth: Option<&str>, key: &str, body: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: \"{key}\"\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        auth.map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default(),
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn order(key: &str) -> String {
    format!(r#"{{"order":"{key}","sku":"A","qty":1,"cents":1000}}"#)
}

/// `idem ledger` and `idem serve` (memory store) on free ports, with the
/// admin API's `extra` arguments; returns them with the proxy and admin ports.
pub(crate) fn serve(extra: &[&str]) -> (Proc, Proc, u16, u16) {
    let (ledger, ledger_port) = spawn_ledger(&[]);
    let upstream = format!("http://127.0.0.1:{ledger_port}");
    let args = [&["--upstream", &upstream, "--store", "memory:"], extra].concat();
    let (serve, proxy_port, admin_port) = spawn_serve(&args);
    assert_eq!(
        post(proxy_port, "warm-up", &order("warm-up")) / 100,
        2,
        "the warm-up order"
    );
    (ledger, serve, proxy_port, admin_port)
}

/// `idem tui` on the admin API at `admin_port` in an 80×24 pane, after the
/// shell's `env` settings (`IDEM_ADMIN_TOKEN=…`, `env -u …`).
fn console(name: &str, env: &str, admin_port: u16) -> Tmux {
    let command = format!("{env} {IDEM} tui --admin http://127.0.0.1:{admin_port}");
    Tmux::start(&format!("console-{name}"), 80, 24, &command)
}

/// The table rows on screen: the lines between the column header and the
/// bottom border, each cut before its STATE column.
fn key_cells(screen: &str) -> Vec<String> {
    let header = screen
        .lines()
        .find(|l| l.contains("KEY▲"))
        .unwrap_or_default();
    // In characters: the borders and the sort arrow are wider in bytes.
    let cut = header
        .find("STATE")
        .map_or(usize::MAX, |at| header[..at].chars().count());
    screen
        .lines()
        .skip_while(|l| !l.contains("KEY▲"))
        .skip(1)
        .take_while(|l| !l.starts_with('╰'))
        .filter(|l| l.contains("DONE") || l.contains("PROCESSING"))
        .map(|l| {
            l.chars()
                .take(cut)
                .collect::<String>()
                .trim_end()
                .to_owned()
        })
        .collect()
}

#[test]
fn console_at_80x24_tells_two_clients_apart_searches_and_flips_the_insert_fault() {
    let (_ledger, _serve, proxy_port, admin_port) = serve(&[]);
    // Two clients (two Authorization headers) send the same keys, and one
    // a key far longer than the column.
    let long = "checkout-2026-12-03T10:00:00Z-session-000000000001";
    for (auth, key) in [
        ("Bearer alice", "order-1"),
        ("Bearer alice", "order-2"),
        ("Bearer alice", long),
        ("Bearer bob", "order-1"),
        ("Bearer bob", "order-2"),
    ] {
        assert_eq!(post_as(proxy_port, Some(auth), key, &order(key)) / 100, 2);
    }

    let tmux = console("clients", "", admin_port);
    let screen = tmux.wait_for("the keys of both clients", |s| {
        s.contains("connected") && key_cells(s).len() == 6
    });
    // Every key is told apart: the client's own key, its scope as a tag.
    let cells = key_cells(&screen);
    let mut distinct = cells.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        cells.len(),
        "two keys look alike:\n{screen}"
    );
    assert_eq!(
        cells.iter().filter(|c| c.ends_with(" order-1")).count(),
        2,
        "both clients' order-1, by the key they sent:\n{screen}"
    );
    assert!(
        cells
            .iter()
            .any(|c| c.contains("checkout-") && c.contains('…') && c.contains("0001")),
        "a long key is cut in the middle, marked:\n{screen}"
    );

    // Search by what the client sent, anywhere in the key.
    tmux.keys(&["/", "der-2", "Enter"]);
    let screen = tmux.wait_for("the search", |s| {
        s.contains(r#"search "der-2""#) && key_cells(s).len() == 2
    });
    assert!(
        key_cells(&screen).iter().all(|c| c.ends_with(" order-2")),
        "{screen}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_for("the search cleared", |s| key_cells(s).len() == 6);

    // The faults view opens on insert and says what the guard calls; the
    // insert fault, flipped with its key, makes the gateway fail closed.
    tmux.keys(&["2"]);
    let screen = tmux.wait_for("the faults view", |s| {
        s.contains("Store faults") && s.contains("The guard calls get, insert and replace")
    });
    assert!(screen.contains(" insert: [o] off"), "{screen}");
    assert!(
        screen.contains("The guard calls get, insert and replace; *delete"),
        "{screen}"
    );
    tmux.keys(&["e"]);
    tmux.wait_for("the insert fault on", |s| s.contains("insert → error"));
    let mut n = 100;
    let mut statuses = Vec::new();
    tmux.keys(&["3"]);
    tmux.wait_for_doing(
        "unavailable decisions in the activity view",
        || {
            n += 1;
            let key = format!("console-{n}");
            statuses.push(post(proxy_port, &key, &order(&key)));
        },
        |s| s.contains("UNAVAILABLE"),
    );
    assert!(
        statuses.contains(&503),
        "the gateway failed closed: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 503),
        "no request got through the faulty store: {statuses:?}"
    );

    // And off again: requests succeed.
    tmux.keys(&["2", "Space"]);
    tmux.wait_for("the insert fault off", |s| s.contains("insert → off"));
    assert_eq!(
        post(proxy_port, "console-after", &order("console-after")) / 100,
        2
    );

    tmux.quit();
}

#[test]
fn a_console_without_the_admin_token_says_how_to_pass_it() {
    let (_ledger, _serve, _proxy_port, admin_port) = serve(&["--admin-token", "s3cret"]);
    let tmux = console("token", "env -u IDEM_ADMIN_TOKEN", admin_port);
    let screen = tmux.wait_for("the fix for a missing token", |s| {
        s.contains("--token") && s.contains("IDEM_ADMIN_TOKEN") && s.contains("unauthorized")
    });
    assert!(
        !screen.contains("reconnecting") && !screen.contains("disconnected"),
        "a refused token is not an outage:\n{screen}"
    );
    tmux.quit();

    // With the token, it connects: from the environment, or from a file
    // (which `ps` does not show), with the newline `echo` leaves.
    let tmux = console("token-ok", "IDEM_ADMIN_TOKEN=s3cret", admin_port);
    tmux.wait_for("the console to connect with the token", |s| {
        s.contains("● connected") && s.contains("warm-up")
    });
    tmux.quit();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let env = format!(
        "env -u IDEM_ADMIN_TOKEN IDEM_ADMIN_TOKEN_FILE={}",
        file.display()
    );
    let tmux = console("token-file", &env, admin_port);
    tmux.wait_for("the console to connect with the token file", |s| {
        s.contains("● connected") && s.contains("warm-up")
    });
    tmux.quit();
    let tmux = Tmux::start(
        "console-token-file-flag",
        80,
        24,
        &format!(
            "env -u IDEM_ADMIN_TOKEN {IDEM} tui --admin http://127.0.0.1:{admin_port} --token-file {}",
            file.display()
        ),
    );
    tmux.wait_for("the console to connect with --token-file", |s| {
        s.contains("● connected") && s.contains("warm-up")
    });
    tmux.quit();
    // Both ways at once: refused, naming both, before the terminal is touched.
    let out = Command::new(IDEM)
        .args(["tui", "--admin", "http://127.0.0.1:1", "--token", "s3cret"])
        .arg("--token-file")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("--token (or IDEM_ADMIN_TOKEN) and --token-file")
            && err.contains("give one"),
        "{err}"
    );
}

/// A gateway started while its store (Redis, through a proxy that is cut)
/// is unreachable: the console says so in red — which store, for how long,
/// after how many attempts, why, and that guarded requests get 503 — and
/// the line goes once the store is back and the gateway has opened it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_gateway_without_its_store_until_it_connects() {
    let Some(url) = idem_harness::server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let proxy = Proxy::start(&host_port(&url, 6379)).await;
    proxy.cut();
    let prefix = idem_harness::unique("console-down");
    let store = with(&via(&url, proxy.addr), &format!("prefix={prefix}:"));
    let (_ledger, ledger_port) = spawn_ledger(&[]);
    let upstream = format!("http://127.0.0.1:{ledger_port}");
    let (_serve, proxy_port, admin_port) =
        spawn_serve(&["--upstream", &upstream, "--store", &store]);
    let tmux = Tmux::start(
        "console-store-down",
        120,
        30,
        &format!("{IDEM} tui --admin http://127.0.0.1:{admin_port}"),
    );
    let screen = tokio::task::block_in_place(|| {
        tmux.wait_for("the store's alarm", |s| {
            s.contains("store redis not connected") && s.contains("guarded requests get 503")
        })
    });
    assert!(screen.contains("attempts"), "{screen}");
    assert_eq!(post(proxy_port, "while-down", &order("while-down")), 503);

    proxy.restore().await;
    tokio::task::block_in_place(|| {
        tmux.wait_for("the alarm gone once the store is open", |s| {
            s.contains("● connected")
                && s.contains("store redis · up")
                && !s.contains("not connected")
        })
    });
    assert_eq!(post(proxy_port, "once-up", &order("once-up")) / 100, 2);
    tmux.quit();
}

#[test]
fn the_demo_console_says_when_the_run_is_over_and_q_shows_the_verdict() {
    let tmux = Tmux::start(
        "console-demo",
        80,
        24,
        &format!("{IDEM} demo --store memory: --orders 40 --duration 2s"),
    );
    tmux.wait_for("the console on the demo", |s| {
        s.contains("1 Keys") && s.contains("● connected")
    });
    tmux.wait_for("the end of the run, and how to see the verdict", |s| {
        s.contains("The run is over") && s.contains("q closes and shows the verdict")
    });
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("the verdict", |s| s.contains("exit="));
    assert!(
        screen.contains("exactly-once check passed") && screen.contains("exit=0"),
        "{screen}"
    );
    assert!(screen.contains("all orders answered"), "{screen}");
}

#[test]
fn every_option_of_ledger_and_component_says_what_it_is() {
    for (command, option, says) in [
        ("ledger", "--listen", "Where the ledger listens"),
        ("component", "--out", "The file to write the component to"),
    ] {
        let out = Command::new(IDEM)
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let line = help
            .lines()
            .find(|l| l.contains(option))
            .unwrap_or_else(|| panic!("{option} missing: {help}"));
        assert!(
            help.contains(says),
            "idem {command} --help: {option} has no help ({line}):\n{help}"
        );
    }
}
