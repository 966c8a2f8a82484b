//! `idem ledger`'s three-step fulfilment (reserve → charge → ship), black
//! box: the holder is the real `idem ledger` process, killed (`SIGKILL`)
//! right after each checkpoint and started again on the same store and books
//! file. Each retry continues from the last checkpoint, and each step is
//! applied exactly once.

use crate::support::{Proc, Reply, assert_replay, http, spawn_ledger};
use idem::Clock as _;
use idem::store::{SqliteOptions, SqliteStore, Store};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// `idem ledger` on a free port (returned), guarding fulfilments with the
/// SQLite file `db` and a 1 s lease, keeping its books in `books`.
fn start(db: &Path, books: &Path) -> (Proc, u16) {
    spawn_ledger(&[
        "--store",
        &format!("sqlite:{}", db.display()),
        "--lease",
        "1s",
        "--books",
        &books.display().to_string(),
        "--stock",
        "10",
    ])
}

/// Waits until the key's record holds the checkpoint `phase` (read from the
/// store file itself, as another process would).
async fn wait_for_checkpoint(db: &Path, phase: &str) {
    let store = SqliteStore::open(db, SqliteOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = store.clock().now_ms();
        let entry = store.get("fulfil/o-1", now).await.unwrap();
        if entry
            .and_then(|e| e.record.checkpoint)
            .is_some_and(|c| c.phase == phase)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint {phase:?} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn books(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Posts the order until it is answered other than 409 in-flight (the
/// killed holder's lease has to run out first).
async fn fulfil(port: u16, order: &str) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = http(
            port,
            "POST",
            "/fulfilments",
            &[("content-type", "application/json")],
            order,
        )
        .await;
        if reply.status != 409 {
            return reply;
        }
        assert!(reply.header("retry-after").is_some(), "{reply:?}");
        assert!(Instant::now() < deadline, "still in flight after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_between_steps_is_resumed_and_each_step_applies_once() {
    let dir = tempfile::tempdir().unwrap();
    let (db, books_file) = (dir.path().join("idem.db"), dir.path().join("books.json"));
    // A 3 s pause before the charge and before the shipping: time to kill
    // the holder between steps.
    let order =
        json!({"order": "o-1", "sku": "A", "qty": 2, "cents": 500, "step_ms": 3000}).to_string();

    // Killed after the reservation.
    let (ledger, port) = start(&db, &books_file);
    let first = tokio::spawn({
        let order = order.clone();
        async move { http(port, "POST", "/fulfilments", &[], &order).await }
    });
    wait_for_checkpoint(&db, "reserved").await;
    drop(ledger);
    first.abort();
    let after_first = books(&books_file);
    assert_eq!(after_first["steps"]["o-1"], json!({"reserve": 1}));
    assert_eq!(after_first["stock"], 8);

    // Started again: the retry continues after the reservation; killed
    // after the charge.
    let (ledger, port) = start(&db, &books_file);
    let second = tokio::spawn({
        let order = order.clone();
        async move { fulfil(port, &order).await }
    });
    wait_for_checkpoint(&db, "charged").await;
    drop(ledger);
    second.abort();
    let after_second = books(&books_file);
    assert_eq!(
        after_second["steps"]["o-1"],
        json!({"reserve": 1, "charge": 1}),
        "the reservation was not made again"
    );

    // Started again: the retry only ships.
    let (_ledger, port) = start(&db, &books_file);
    let done = fulfil(port, &order).await;
    assert_eq!(
        done.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&done.body)
    );
    assert_eq!(
        done.head
            .to_ascii_lowercase()
            .matches("content-type:")
            .count(),
        1,
        "{}",
        done.head
    );
    assert_eq!(done.header("content-type"), Some("application/json"));
    let body = done.json();
    assert_eq!(body["resumed_from"], "charged");
    assert_eq!(body["status"], "shipped");
    let fence = |id: &Value| {
        id.as_str()
            .and_then(|id| id.rsplit('-').next()?.parse::<u64>().ok())
            .unwrap()
    };
    assert!(
        fence(&body["reservation"]) < fence(&body["charge"])
            && fence(&body["charge"]) < fence(&body["shipment"]),
        "each step ran under a later holder's claim: {body}"
    );
    let last = books(&books_file);
    assert_eq!(
        last["steps"]["o-1"],
        json!({"reserve": 1, "charge": 1, "ship": 1}),
        "each step applied exactly once"
    );
    assert_eq!(
        (
            &last["stock"],
            &last["charges"]["o-1"],
            &last["shipped"]["o-1"]
        ),
        (&json!(8), &json!(500), &json!(2))
    );

    // A repeat replays the stored bytes; another body for the order is 422.
    let again = fulfil(port, &order).await;
    assert_replay(&again, &done);
    let other = json!({"order": "o-1", "sku": "B", "qty": 1, "cents": 1}).to_string();
    assert_eq!(fulfil(port, &other).await.status, 422);
    assert_eq!(books(&books_file)["steps"]["o-1"]["ship"], 1);
}
