//! `idem-testkit hammer`: one process of a multi-process test. It claims the
//! same keys as its twin against one shared store and prints the keys whose
//! handler it ran, so the test can check that, across both processes, every
//! key ran exactly once.
//!
//! Protocol: after opening the store and the guard it prints `ready` and
//! waits for one line on stdin, so that both processes start together; then
//! it prints `executed KEY` per handler run, `not_recorded KEY` when a run's
//! response could not be stored, and `summary executed=N replayed=N
//! in_flight=N unavailable=N not_recorded=N` at the end. A key answered in
//! flight, or unavailable (the guard failed closed: the store did not
//! answer, and nothing ran), is asked again in a later pass, as a client
//! retries; so is a key whose response was not recorded (the store did not
//! answer the completion): it replays if the completion was applied after
//! all, and otherwise runs again once its lease is over — the one case in
//! which the guard runs a key twice, as it documents, and which the test
//! allows only for a key so reported.

use anyhow::{Context, bail};
use idem::{Guard, Outcome, Response, RunError};
use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct HammerArgs {
    /// Store URL, as for `store::open`.
    #[arg(long)]
    store: String,
    /// Keys `{prefix}0` .. `{prefix}{keys-1}`.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    #[arg(long)]
    prefix: String,
    /// Passes over all keys.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

#[derive(Default)]
struct Tally {
    executed: AtomicUsize,
    replayed: AtomicUsize,
    in_flight: AtomicUsize,
    unavailable: AtomicUsize,
    not_recorded: AtomicUsize,
}

pub async fn hammer(args: HammerArgs) -> anyhow::Result<()> {
    let store = idem::store::open(&args.store).await?;
    let guard = Guard::builder(store)
        .retention(Duration::from_mins(10))
        .build()
        .context("build the guard")?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .context("wait for the start line")?;

    let tally = Arc::new(Tally::default());
    // Keys this process saw settle (executed here or replayed from the twin).
    let settled = Arc::new(Mutex::new(HashSet::new()));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    // The passes, then passes over the keys still in flight elsewhere until
    // every key has settled here too: bounded by two leases (the default,
    // 30 s), the longest a key whose completion was lost stays claimed.
    let mut settling_until = None;
    for pass in 0.. {
        let todo: Vec<usize> = {
            let settled = settled.lock().unwrap();
            (0..args.keys)
                .filter(|i| pass < args.repeat || !settled.contains(i))
                .collect()
        };
        if todo.is_empty() {
            break;
        }
        if pass >= args.repeat
            && Instant::now()
                > *settling_until.get_or_insert_with(|| Instant::now() + Duration::from_mins(1))
        {
            break;
        }
        if pass >= args.repeat {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let next = Arc::new(AtomicUsize::new(0));
        let todo = Arc::new(todo);
        let mut workers = tokio::task::JoinSet::<anyhow::Result<()>>::new();
        for _ in 0..args.concurrency.max(1) {
            let (guard, tally, settled, out, next, todo) = (
                guard.clone(),
                tally.clone(),
                settled.clone(),
                out.clone(),
                next.clone(),
                todo.clone(),
            );
            let prefix = args.prefix.clone();
            workers.spawn(async move {
                while let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let key = format!("{prefix}{i}");
                    if ask(&guard, &key, &out, &tally).await? {
                        settled.lock().unwrap().insert(i);
                    }
                }
                Ok(())
            });
        }
        while let Some(done) = workers.join_next().await {
            done??;
        }
    }
    let unsettled = args.keys - settled.lock().unwrap().len();
    if unsettled > 0 {
        bail!("{unsettled} keys never settled");
    }
    let mut out = out.lock().unwrap();
    writeln!(
        out,
        "summary executed={} replayed={} in_flight={} unavailable={} not_recorded={}",
        tally.executed.load(Ordering::Relaxed),
        tally.replayed.load(Ordering::Relaxed),
        tally.in_flight.load(Ordering::Relaxed),
        tally.unavailable.load(Ordering::Relaxed),
        tally.not_recorded.load(Ordering::Relaxed)
    )?;
    out.flush()?;
    Ok(())
}

/// Asks for `key` once, as a client would: whether it settled (ran here,
/// or replayed the response stored for it), or is to be asked again.
async fn ask(
    guard: &Guard,
    key: &str,
    out: &Mutex<std::io::Stdout>,
    tally: &Tally,
) -> anyhow::Result<bool> {
    let handler = |_| async {
        writeln!(out.lock().unwrap(), "executed {key}")?;
        // The work: long enough for the twin to find the key in flight.
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok::<_, std::io::Error>(Response {
            status: 200,
            headers: vec![],
            body: key.as_bytes().to_vec(),
        })
    };
    let (counter, settled) = match guard.run(key, "hammer", handler).await {
        Ok(Outcome::Executed(_)) => (&tally.executed, true),
        Ok(Outcome::Replayed(r)) if r.body == key.as_bytes() => (&tally.replayed, true),
        Ok(Outcome::InFlight { .. }) => (&tally.in_flight, false),
        // Failed closed (a store timeout under load, say): nothing ran.
        Ok(Outcome::Unavailable(_)) => (&tally.unavailable, false),
        // It ran, and its completion did not answer in time.
        Err(RunError::NotRecorded { .. }) => {
            writeln!(out.lock().unwrap(), "not_recorded {key}")?;
            (&tally.not_recorded, false)
        }
        other => bail!("{key}: unexpected {other:?}"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(settled)
}
