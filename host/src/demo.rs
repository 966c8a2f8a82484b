//! `idem demo`: the seed's scenarios at scale through the component.

use anyhow::bail;
use idem::{FaultRule, Faulty, Guard, MemoryStore, Op, Outcome, Response, RunError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Orders to place.
    #[arg(long, default_value_t = 1000)]
    orders: usize,
    /// Concurrent duplicates of each order.
    #[arg(long, default_value_t = 8)]
    workers: usize,
}

/// The seed's ledger: stock, one reservation and one charge per order.
#[derive(Default)]
struct Ledger {
    stock: i64,
    reservations: HashMap<String, i64>,
    charges: HashMap<String, i64>,
    executions: HashMap<String, u32>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (store, faults) = Faulty::new(MemoryStore::new());
    let guard = Guard::builder(store)
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(3600))
        .build()?;
    let ledger = Arc::new(Mutex::new(Ledger {
        stock: args.orders as i64 * 2,
        ..Ledger::default()
    }));
    let started = Instant::now();
    println!(
        "idem demo: {} orders, each sent by {} concurrent workers, through the guard component",
        args.orders, args.workers
    );

    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    for order in 0..args.orders {
        for _ in 0..args.workers {
            let (guard, ledger) = (guard.clone(), ledger.clone());
            tasks.spawn(async move {
                let key = format!("order-{order}");
                let handler = |_fence| {
                    let (ledger, key) = (ledger.clone(), key.clone());
                    async move {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let mut l = ledger.lock().unwrap();
                        *l.executions.entry(key.clone()).or_default() += 1;
                        if !l.reservations.contains_key(&key) {
                            l.stock -= 1;
                            l.reservations.insert(key.clone(), 1);
                            l.charges.insert(key, 1000);
                        }
                        Ok::<_, std::convert::Infallible>(Response {
                            status: 200,
                            headers: vec![],
                            body: b"paid".to_vec(),
                        })
                    }
                };
                guard.run(&key, "sku=A&qty=1", handler).await
            });
        }
    }
    while let Some(result) = tasks.join_next().await {
        match result? {
            Ok(outcome) => *counts.entry(outcome.name()).or_default() += 1,
            Err(RunError::Handler(never)) => match never {},
            Err(e) => bail!("guard failed: {e}"),
        }
    }
    let requests = args.orders * args.workers;
    println!(
        "{requests} requests in {:.2?}: executed={} in_flight={} replayed={}",
        started.elapsed(),
        counts.get("EXECUTED").unwrap_or(&0),
        counts.get("IN_FLIGHT").unwrap_or(&0),
        counts.get("REPLAYED").unwrap_or(&0)
    );

    // Repeats after completion replay; reused keys with other parameters conflict.
    let mut replayed = 0;
    let mut conflicts = 0;
    for order in 0..args.orders {
        let key = format!("order-{order}");
        let never = |_fence| async { unreachable_handler() };
        match guard.run(&key, "sku=A&qty=1", never).await {
            Ok(Outcome::Replayed(r)) if r.body == b"paid" => replayed += 1,
            other => bail!("{key}: expected a replay, got {other:?}"),
        }
        match guard.run(&key, "sku=A&qty=2", never).await {
            Ok(Outcome::Conflict) => conflicts += 1,
            other => bail!("{key}: expected a conflict, got {other:?}"),
        }
    }
    println!(
        "repeats after completion: replayed={replayed}; same keys, other parameters: conflicts={conflicts}"
    );

    // The store goes down: every call fails closed and nothing runs.
    faults.set_all(&FaultRule::error("connection refused"))?;
    let mut unavailable = 0;
    for order in 0..100 {
        let fresh = |_fence| async { unreachable_handler() };
        if let Ok(Outcome::Unavailable(_)) = guard
            .run(&format!("down-{order}"), "sku=A&qty=1", fresh)
            .await
        {
            unavailable += 1;
        }
    }
    faults.clear_all();
    faults.set(Op::Insert, FaultRule::default())?;
    println!("store down: 100 new orders -> unavailable={unavailable}, handler calls=0");

    let l = ledger.lock().unwrap();
    let executions: u32 = l.executions.values().sum();
    let ok = executions as usize == args.orders
        && l.executions.values().all(|&n| n == 1)
        && l.reservations.len() == args.orders
        && l.charges.len() == args.orders
        && unavailable == 100;
    println!(
        "ledger: orders={} executions={executions} reservations={} charges={} stock={}",
        args.orders,
        l.reservations.len(),
        l.charges.len(),
        l.stock
    );
    if !ok {
        bail!("exactly-once check FAILED");
    }
    println!("exactly-once check passed: every order executed exactly once");
    Ok(())
}

fn unreachable_handler() -> Result<Response, std::convert::Infallible> {
    panic!("the guard ran a handler it should not have")
}
