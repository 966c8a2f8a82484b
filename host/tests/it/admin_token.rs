//! The admin token of the real `idem serve`, each way it can be given: on
//! an address others can reach, a weak token (too short, only whitespace)
//! or none stops the gateway at start with an error naming the rule and the
//! limit; a token from a file or the environment works and is not on the
//! command line `ps` shows.

use crate::support::{Proc, http, serve};
use std::process::Command;

/// 32 bytes, as `openssl rand -hex 16` makes them.
const TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015";

/// `idem serve` with its admin API on every address (not loopback), and
/// `args`; `env` set, and no `IDEM_*` variable of the test's own.
fn serve_exposed(args: &[&str], env: &[(&str, &str)]) -> Command {
    serve_admin_on("0.0.0.0:0", args, env)
}

/// [`serve_exposed`] with the admin API on `admin`.
fn serve_admin_on(admin: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut idem = serve(admin);
    idem.args(["--upstream", "http://127.0.0.1:9", "--store", "memory:"])
        .args(args);
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            idem.env_remove(name);
        }
    }
    idem.envs(env.iter().copied());
    idem
}

/// The gateway refuses to start: its exit status and what it said.
fn refused(mut idem: Command) -> String {
    let out = idem.output().expect("run idem serve");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "idem serve started: {stderr}");
    stderr
}

/// The admin API at `port` answers `/v1/stats` 401 without the token and
/// 200 with it.
async fn only_with_the_token(port: u16) {
    let none = http(port, "GET", "/v1/stats", &[], "").await;
    assert_eq!(none.status, 401, "{none:?}");
    let wrong = http(
        port,
        "GET",
        "/v1/stats",
        &[("authorization", &format!("Bearer {}", &TOKEN[1..]))],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let right = http(
        port,
        "GET",
        "/v1/stats",
        &[("authorization", &format!("Bearer {TOKEN}"))],
        "",
    )
    .await;
    assert_eq!(right.status, 200, "{right:?}");
}

/// The command line of a running process, as `ps` shows it.
fn command_line(proc: &Proc) -> String {
    std::fs::read(format!("/proc/{}/cmdline", proc.0.id()))
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .unwrap()
}

/// The gateway started, and its admin port.
fn start(idem: Command) -> (Proc, u16) {
    let (proc, [admin]) = idem_harness::spawn_bound(idem, ["admin API: http://"]);
    (proc, admin)
}

#[test]
fn weak_or_missing_tokens_off_loopback_stop_the_gateway_naming_the_rule() {
    let err = refused(serve_exposed(&[], &[]));
    assert!(
        err.contains("not a loopback address, without a token")
            && err.contains("--admin-token-file"),
        "{err}"
    );
    let err = refused(serve_exposed(&["--admin-token", "x"], &[]));
    assert!(
        err.contains("the admin token is 1 bytes") && err.contains("at least 16 bytes"),
        "{err}"
    );
    let err = refused(serve_exposed(&["--admin-token", "s3cret-s3cret"], &[]));
    assert!(err.contains("is 13 bytes"), "{err}");
    let err = refused(serve_exposed(
        &[],
        &[("IDEM_ADMIN_TOKEN", "                ")],
    ));
    assert!(err.contains("only whitespace"), "{err}");
    let err = refused(serve_exposed(
        &["--admin-token", "\t \t \t \t \t \t \t \t "],
        &[],
    ));
    assert!(err.contains("only whitespace"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin-token");
    std::fs::write(&file, "short\n").unwrap();
    let file = file.to_str().unwrap();
    let err = refused(serve_exposed(&["--admin-token-file", file], &[]));
    assert!(
        err.contains("is 5 bytes"),
        "the newline is not counted: {err}"
    );
    let err = refused(serve_exposed(
        &["--admin-token-file", file, "--admin-token", TOKEN],
        &[],
    ));
    assert!(
        err.contains("--admin-token (or IDEM_ADMIN_TOKEN) and --admin-token-file")
            && err.contains("give one"),
        "{err}"
    );
    let missing = dir.path().join("no-such-file");
    let err = refused(serve_exposed(
        &["--admin-token-file", missing.to_str().unwrap()],
        &[],
    ));
    assert!(
        err.contains("read the admin token file") && err.contains("no-such-file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_file_or_the_environment_guards_the_admin_api_unseen_by_ps() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let file = file.to_str().unwrap();
    for (args, env) in [
        (vec!["--admin-token-file", file], vec![]),
        (vec![], vec![("IDEM_ADMIN_TOKEN_FILE", file)]),
        (vec![], vec![("IDEM_ADMIN_TOKEN", TOKEN)]),
    ] {
        let (proc, admin) = start(serve_exposed(&args, &env));
        only_with_the_token(admin).await;
        let shown = command_line(&proc);
        assert!(
            shown.contains("serve") && !shown.contains(TOKEN),
            "ps shows the token: {shown}"
        );
    }
    // On the command line it works too (and shows): the rules are the same.
    let (_proc, admin) = start(serve_exposed(&["--admin-token", TOKEN], &[]));
    only_with_the_token(admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_loopback_a_short_token_is_allowed_but_not_one_http_cannot_carry() {
    let idem = serve_admin_on("127.0.0.1:0", &["--admin-token", "s3cret"], &[]);
    let (_proc, admin) = start(idem);
    let reply = http(
        admin,
        "GET",
        "/v1/stats",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");

    let err = refused(serve_admin_on(
        "127.0.0.1:0",
        &["--admin-token", " s3cret"],
        &[],
    ));
    assert!(
        err.contains("cannot be sent in an HTTP header") && err.contains("whitespace"),
        "{err}"
    );
}
