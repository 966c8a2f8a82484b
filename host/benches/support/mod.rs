//! What the store benches share: the servers they run against, timing a
//! work from many callers at once, and cleaning up after themselves on a
//! shared Redis.
//!
//! A bench that uses only part of it leaves the rest unused.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The server `IDEM_BENCH_{name}_URL` names, falling back to the tests'
/// `IDEM_TEST_{name}_URL`; `None` when neither is set.
pub fn url(name: &str) -> Option<String> {
    std::env::var(format!("IDEM_BENCH_{name}_URL"))
        .or_else(|_| std::env::var(format!("IDEM_TEST_{name}_URL")))
        .ok()
        .filter(|u| !u.is_empty())
}

/// Unlinks the keys matching `pattern` (a run writes millions), so that the
/// shared server's tests do not scan them until they expire.
pub async fn unlink_matching(url: &str, pattern: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        cursor = next;
        if cursor == 0 {
            return;
        }
    }
}

/// A number no other call of the run gets: every work claims keys no other
/// work used.
pub fn fresh() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// One unit of work, given a number unique to the call.
pub type Op = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

pub fn op<F, Fut>(f: F) -> Op
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// What one work did: calls per second, and the latencies of its calls.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub ops_per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// The latencies of one work's slices and the wall time they took.
#[derive(Default)]
struct Sample {
    latencies: Vec<Duration>,
    secs: f64,
}

impl Sample {
    fn figures(mut self) -> Figures {
        let all = &mut self.latencies;
        all.sort_unstable();
        let pct = |p: usize| {
            all.get((all.len() * p / 100).min(all.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Figures {
            ops_per_s: all.len() as f64 / self.secs,
            p50: pct(50),
            p99: pct(99),
        }
    }
}

/// Runs `op` from `callers` tasks for `time`, adding to `sample`.
async fn slice(callers: usize, time: Duration, op: &Op, sample: &mut Sample) {
    let started = Instant::now();
    let deadline = started + time;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let op = op.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let i = fresh();
                let t = Instant::now();
                op(i).await;
                latencies.push(t.elapsed());
            }
            latencies
        });
    }
    while let Some(l) = tasks.join_next().await {
        sample.latencies.extend(l.unwrap());
    }
    sample.secs += started.elapsed().as_secs_f64();
}

/// Every work in `works` from `callers` callers for `time` in all, in
/// `turns` slices each. The works take turns, each turn starting with
/// another, so that a change in the machine's load during the measure weighs
/// on all of them alike. Their figures, in the order of `works`.
pub async fn measure(callers: usize, time: Duration, turns: usize, works: &[&Op]) -> Vec<Figures> {
    let mut samples: Vec<Sample> = works.iter().map(|_| Sample::default()).collect();
    let turn = time / turns as u32;
    for t in 0..turns {
        for k in 0..works.len() {
            let w = (k + t) % works.len();
            slice(callers, turn, works[w], &mut samples[w]).await;
        }
    }
    samples.into_iter().map(Sample::figures).collect()
}

/// The seconds `IDEM_BENCH_SECS` sets, or `default`.
pub fn secs(default: f64) -> f64 {
    std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
