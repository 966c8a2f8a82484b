//! The seed's two scenarios (`shared/seed/guard_test.go`), ported faithfully
//! and run through the component, on the memory store here and on every
//! store by the conformance suite. With `--nocapture` they print the seed's lines.

use crate::conformance::BASE_MS;
use idem::store::Store;
use idem::{FaultRule, Faulty, Guard, ManualClock, Op, Outcome, Response, RunError};
use idem_harness::unique;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The seed's ledger: applying an order twice is absorbed downstream.
struct Ledger {
    stock: i32,
    reservations: HashMap<String, i32>,
    charges: HashMap<String, i32>,
}

impl Ledger {
    fn new(stock: i32) -> Arc<Mutex<Ledger>> {
        Arc::new(Mutex::new(Ledger {
            stock,
            reservations: HashMap::new(),
            charges: HashMap::new(),
        }))
    }

    fn apply(&mut self, key: &str, qty: i32, cents: i32) -> Result<(), &'static str> {
        if self.reservations.contains_key(key) {
            return Ok(());
        }
        if self.stock < qty {
            return Err("OUT_OF_STOCK");
        }
        self.stock -= qty;
        self.reservations.insert(key.to_owned(), qty);
        self.charges.insert(key.to_owned(), cents);
        Ok(())
    }

    /// The scenario's one order left its trace once: 9 of 10 in stock, one
    /// reservation, one charge.
    fn applied_once(&self) -> bool {
        self.stock == 9 && self.reservations.len() == 1 && self.charges.len() == 1
    }
}

/// As the seed prints it.
impl std::fmt::Display for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stock={} reservations={} charges={}",
            self.stock,
            self.reservations.len(),
            self.charges.len()
        )
    }
}

fn guard(store: impl Store, clock: &ManualClock) -> Guard {
    Guard::builder(store)
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_hours(1))
        .build()
        .unwrap()
}

/// The seed's handler: counts its calls, waits, applies to the ledger.
async fn handler(
    ledger: Arc<Mutex<Ledger>>,
    key: String,
    calls: Arc<AtomicU32>,
    delay: Duration,
) -> Result<Response, std::convert::Infallible> {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(delay).await;
    let applied = ledger.lock().unwrap().apply(&key, 1, 1000);
    Ok(match applied {
        Ok(()) => Response {
            status: 200,
            headers: vec![],
            body: b"paid".to_vec(),
        },
        Err(e) => Response {
            status: 409,
            headers: vec![],
            body: e.as_bytes().to_vec(),
        },
    })
}

pub async fn seed_concurrent_same_key(store: Arc<dyn Store>) {
    let clock = ManualClock::new(BASE_MS);
    let g = guard(store, &clock);
    let ledger = Ledger::new(10);
    let calls = Arc::new(AtomicU32::new(0));
    let key = unique("order-1");
    const WORKERS: usize = 8;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let (g, ledger, calls, key) = (g.clone(), ledger.clone(), calls.clone(), key.clone());
        tasks.spawn(async move {
            let h = |_| handler(ledger, key.clone(), calls, Duration::from_millis(20));
            g.run(&key, "sku=A&qty=1", h).await
        });
    }
    let mut outcomes = Vec::new();
    while let Some(result) = tasks.join_next().await {
        let outcome = result.unwrap().unwrap();
        // A worker scheduled late on a loaded machine arrives after the
        // first completed and replays: every order is right, none runs twice.
        match &outcome {
            Outcome::Executed(_) | Outcome::InFlight { .. } => {}
            Outcome::Replayed(response) => assert_eq!(response.body, b"paid"),
            other => panic!("{other:?}"),
        }
        outcomes.push(outcome.name());
    }
    let executed = outcomes.iter().filter(|&&o| o == "EXECUTED").count();
    {
        let l = ledger.lock().unwrap();
        let calls = calls.load(Ordering::SeqCst);
        assert!(
            executed == 1 && calls == 1 && l.applied_once(),
            "executed={executed} calls={calls} {l} outcomes={outcomes:?}"
        );
    }
    let h = |_| handler(ledger.clone(), key.clone(), calls.clone(), Duration::ZERO);
    let conflict = g.run(&key, "sku=A&qty=2", h).await.unwrap();
    assert_eq!(conflict, Outcome::Conflict);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a conflict runs nothing");
    println!(
        "workers={WORKERS} executed={executed} calls={} stock={}",
        calls.load(Ordering::SeqCst),
        ledger.lock().unwrap().stock
    );
}

pub async fn seed_lease_takeover_faults_and_window(store: Arc<dyn Store>) {
    let clock = ManualClock::new(BASE_MS);
    let (store, faults) = Faulty::new(store);
    let g = guard(store, &clock);
    let ledger = Ledger::new(10);
    let calls = Arc::new(AtomicU32::new(0));
    let key = unique("order-2");
    let h = || {
        let (ledger, key, calls) = (ledger.clone(), key.clone(), calls.clone());
        move |_| handler(ledger, key, calls, Duration::ZERO)
    };

    // complete fails once: the handler ran, its response is not recorded.
    faults
        .set(Op::Replace, FaultRule::error("store timeout").times(1))
        .unwrap();
    match g.run(&key, "sku=A&qty=1", h()).await {
        Err(RunError::NotRecorded { response, .. }) => assert_eq!(response.body, b"paid"),
        other => panic!("first call: {other:?}"),
    }
    // Inside the lease: in flight.
    let inside = g.run(&key, "sku=A&qty=1", h()).await.unwrap();
    assert!(
        matches!(inside, Outcome::InFlight { .. }),
        "inside lease: {inside:?}"
    );
    // After the lease: taken over and executed; the ledger absorbs the retry.
    clock.advance(Duration::from_secs(2));
    let after = g.run(&key, "sku=A&qty=1", h()).await.unwrap();
    assert!(
        matches!(after, Outcome::Executed(_)),
        "after lease: {after:?}"
    );
    {
        let l = ledger.lock().unwrap();
        let calls = calls.load(Ordering::SeqCst);
        assert!(calls == 2 && l.applied_once(), "calls={calls} {l}");
    }
    // After the retention window the key is new again.
    clock.advance(Duration::from_hours(2));
    let window = g.run(&key, "sku=A&qty=1", h()).await.unwrap();
    assert!(
        matches!(window, Outcome::Executed(_)),
        "after window: {window:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    println!(
        "calls={} {}",
        calls.load(Ordering::SeqCst),
        ledger.lock().unwrap()
    );
    // The store goes down: unavailable, and the handler is never called.
    faults
        .set_all(&FaultRule::error("connection refused"))
        .unwrap();
    let down = g.run(&unique("order-3"), "sku=A&qty=1", h()).await.unwrap();
    assert!(
        matches!(down, Outcome::Unavailable(_)),
        "store down: {down:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
