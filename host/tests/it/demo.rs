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
