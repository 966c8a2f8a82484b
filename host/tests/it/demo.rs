//! `idem demo`, the README's first command, as a newcomer runs it (piped, so
//! headless): on the embedded SQLite default it must end with the ledger's
//! exactly-once check passing and every order executed once.

use std::process::Command;

#[test]
fn the_demo_on_the_sqlite_default_ends_with_every_order_executed_once() {
    let orders = 150;
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["demo", "--headless", "--duration", "3s", "--orders"])
        .arg(orders.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "idem demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("(store: sqlite:"), "{stdout}");
    assert!(stdout.contains("store fault ON"), "{stdout}");
    assert!(
        stdout.contains("clients' executed is below the ledger's")
            && stdout.contains("not when the console was closed"),
        "the summary explains its counts and its time: {stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "ledger: orders={orders} executions={orders} reservations={orders} charges={orders} "
        )),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l == "exactly-once check passed: every order executed exactly once"),
        "{stdout}"
    );
}

/// `idem demo | head -3`: the reader goes away after three lines. The demo
/// must not panic on the closed pipe, must still finish its run and check,
/// and must remove its temporary directory.
#[test]
fn piped_into_head_the_demo_finishes_quietly_and_cleans_up() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut demo = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["demo", "--headless", "--duration", "2s", "--orders", "40"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("idem-demo-{}", demo.id()));
    let mut stdout = BufReader::new(demo.stdout.take().unwrap());
    let mut first = String::new();
    for _ in 0..3 {
        stdout.read_line(&mut first).unwrap();
    }
    assert!(first.starts_with("idem demo: 40 orders"), "{first}");
    assert!(dir.exists(), "the demo's directory while it runs");
    drop(stdout);
    let output = demo.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{}: {stderr}", output.status);
    assert!(!dir.exists(), "{} was left behind", dir.display());
}
