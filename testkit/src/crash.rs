//! `idem-testkit complete` and `idem-testkit crash`: a process that writes
//! to a store and then waits, at a chosen point, for the test's `kill -9`.

use anyhow::Context;
use idem::{Guard, Response};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// `idem-testkit complete`: claims KEY, stores BODY as its response, prints
/// `completed KEY` and returns; the caller then waits to be killed.
pub async fn complete(
    url: &str,
    key: &str,
    fingerprint: &str,
    body: Vec<u8>,
) -> anyhow::Result<()> {
    let store = idem::store::open(url).await?;
    let guard = idem::Guard::builder(store).build()?;
    let idem::Decision::Proceed(claim) = guard.begin(key, fingerprint).await? else {
        anyhow::bail!("key {key:?} is not free to claim");
    };
    let response = idem::Response {
        status: 201,
        headers: vec![("x-idem-test".into(), b"crash".to_vec())],
        body,
    };
    guard.complete(claim, response).await.1?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "completed {key}")?;
    out.flush()?;
    // Leak the guard and store: no drop, no clean close; only the kill ends them.
    std::mem::forget(guard);
    Ok(())
}

/// Where `idem-testkit crash` stops to wait for its `kill -9`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CrashAt {
    /// Inside the handler: every key claimed, nothing stored.
    Handler,
    /// Inside `complete`, as the store is asked to write the response: the
    /// write is never sent.
    CompleteUnwritten,
    /// Inside `complete`, after the store wrote the response and before the
    /// guard hears so: written, never acknowledged.
    CompleteWritten,
    /// Nowhere: it claims and completes keys round after round.
    StoreWrite,
    /// As `store-write`, but in the last round (SQLite only) inside the
    /// writer's transaction: its statements ran, its `COMMIT` did not. The
    /// transaction holds more than half the round's completions, or all of
    /// those still unwritten, so large responses have spilled pages into the
    /// write-ahead log.
    SqliteTransaction,
}

#[derive(clap::Args)]
pub struct CrashArgs {
    /// Store URL, as for `store::open`.
    #[arg(long)]
    store: String,
    #[arg(long, value_enum)]
    crash_at: CrashAt,
    /// Keys per round, `{prefix}{round}-{i}`, all requested at once.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    #[arg(long)]
    prefix: String,
    /// Rounds of claims then completions (`store-write` only).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The lease of every claim.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Each key's response body is the key, a newline, then this file's bytes.
    #[arg(long, value_name = "FILE")]
    body_file: std::path::PathBuf,
    /// `store-write`: after the first round's claims, print `waiting` and
    /// read a line from stdin before completing them.
    #[arg(long)]
    wait_before_complete: bool,
}

/// The response `crash` stores for `key`: what a test expects to replay.
fn crash_response(key: &str, body: &[u8]) -> Response {
    let mut bytes = Vec::with_capacity(key.len() + 1 + body.len());
    bytes.extend_from_slice(key.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(body);
    Response {
        status: 201,
        headers: vec![("x-idem-key".into(), key.as_bytes().to_vec())],
        body: bytes,
    }
}

/// One line on stdout, flushed at once: the test acts on it.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the test is gone; the kill follows anyway.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A store that stops where `crash` is told to crash: it says where,
/// then never answers, so the process is still there for the kill.
struct Halting {
    inner: Arc<dyn idem::Store>,
    at: CrashAt,
    /// Completions that reached the store.
    completions: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl idem::Store for Halting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<idem::Entry>, idem::StoreError> {
        self.inner.get(key, now_ms).await
    }
    async fn insert(
        &self,
        key: &str,
        record: idem::Record,
        now_ms: u64,
    ) -> Result<idem::store::InsertOutcome, idem::StoreError> {
        self.inner.insert(key, record, now_ms).await
    }
    async fn replace(
        &self,
        key: &str,
        expected: u64,
        record: idem::Record,
        now_ms: u64,
    ) -> Result<bool, idem::StoreError> {
        let completion = record.state == idem::State::Done;
        if completion {
            self.completions.fetch_add(1, Ordering::SeqCst);
        }
        if completion && self.at == CrashAt::CompleteUnwritten {
            say(&format!("halted-before-write {key}"));
            std::future::pending::<()>().await;
        }
        let written = self.inner.replace(key, expected, record, now_ms).await;
        if completion && self.at == CrashAt::CompleteWritten {
            match &written {
                Ok(true) => say(&format!("halted-after-write {key} {}", expected + 1)),
                other => say(&format!("not-written {key} {other:?}")),
            }
            std::future::pending::<()>().await;
        }
        written
    }
    async fn delete(
        &self,
        key: &str,
        expected_version: Option<u64>,
        now_ms: u64,
    ) -> Result<bool, idem::StoreError> {
        self.inner.delete(key, expected_version, now_ms).await
    }
    async fn list(
        &self,
        query: &idem::store::ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, idem::Entry)>, idem::StoreError> {
        self.inner.list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, idem::StoreError> {
        self.inner.purge_expired(now_ms, limit).await
    }
    fn purges_itself(&self) -> bool {
        self.inner.purges_itself()
    }
    fn clock(&self) -> std::sync::Arc<dyn idem::Clock> {
        self.inner.clock()
    }
}

/// `idem-testkit crash`: one process of a crash test. It claims keys and
/// stops where `--crash-at` says, printing one line per step so the test
/// knows when to `kill -9` it:
///
/// - `handler`: `in-handler KEY FENCE` per key, then nothing more;
/// - `complete-unwritten`: `halted-before-write KEY` per key;
/// - `complete-written`: `halted-after-write KEY VERSION` per key;
/// - `store-write`: `claimed KEY` per claim, `acknowledged KEY` per
///   completion the store confirmed, `finished` after the last round;
/// - `sqlite-transaction`: the same, then `in-transaction N` with the number
///   of primitives in the transaction it stopped in.
///
/// It never exits by itself: only the kill ends it. It runs on [`runtime`].
pub async fn crash(args: CrashArgs) -> anyhow::Result<()> {
    let body: Arc<[u8]> = std::fs::read(&args.body_file)
        .with_context(|| format!("read {}", args.body_file.display()))?
        .into();
    let writes = matches!(
        args.crash_at,
        CrashAt::StoreWrite | CrashAt::SqliteTransaction
    );
    let rounds = if writes { args.rounds.max(1) } else { 1 };
    let completions = Arc::new(AtomicUsize::new(0));
    let inner: Arc<dyn idem::Store> = if args.crash_at == CrashAt::SqliteTransaction {
        let path = args
            .store
            .strip_prefix("sqlite:")
            .context("sqlite-transaction needs a sqlite:PATH store")?
            .to_owned();
        let store = tokio::task::spawn_blocking(move || {
            idem::store::SqliteStore::open(path, idem::store::SqliteOptions::default())
        })
        .await??;
        store.set_before_commit(stop_in_transaction(
            store.clone(),
            completions.clone(),
            args.keys * (rounds - 1),
            args.keys,
        ));
        Arc::new(store)
    } else {
        idem::store::open(&args.store).await?
    };
    let store = Halting {
        inner,
        at: args.crash_at,
        completions,
    };
    let guard = Guard::builder(store)
        .lease(Duration::from_millis(args.lease_ms))
        // Half the lease, so that a renewal always lands inside it.
        .store_timeout(Duration::from_millis(args.lease_ms / 2))
        .build()
        .context("build the guard")?;
    for round in 0..rounds {
        let keys: Vec<String> = (0..args.keys)
            .map(|i| format!("{}{round}-{i}", args.prefix))
            .collect();
        if writes {
            let wait = round == 0 && args.wait_before_complete;
            claim_and_complete(&guard, keys, &body, wait).await?;
        } else {
            for key in keys {
                tokio::spawn(run_until_halted(
                    guard.clone(),
                    key,
                    body.clone(),
                    args.crash_at,
                ));
            }
        }
    }
    if writes {
        say("finished");
    }
    // Leak the guard and store: no drop, no clean close; only the kill ends them.
    std::mem::forget(guard);
    Ok(())
}

/// The runtime `crash` runs on. For `sqlite-transaction`, one thread: a
/// store on a multi-thread runtime applies a lone write in place, where the
/// writer thread may already hold the next writes taken from its queue;
/// on one thread every write goes through the queue, so the transaction
/// hook ([`stop_in_transaction`]) sees every unwritten completion there.
pub fn runtime(args: &CrashArgs) -> std::io::Result<tokio::runtime::Runtime> {
    if args.crash_at == CrashAt::SqliteTransaction {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    }
}

/// Runs `key` through the guard; the handler or the store halts it.
async fn run_until_halted(guard: Guard, key: String, body: Arc<[u8]>, crash_at: CrashAt) {
    let (key, body) = (&key, &body);
    let handler = |idem::Fence(fence)| async move {
        if crash_at == CrashAt::Handler {
            say(&format!("in-handler {key} {fence}"));
            std::future::pending::<()>().await;
        }
        Ok::<_, std::convert::Infallible>(crash_response(key, body))
    };
    let outcome = guard.run(key, "fp-crash", handler).await;
    say(&format!("unexpected {outcome:?}"));
}

/// Claims every key at once, then (after a line on stdin when `wait`)
/// completes them all at once, saying each claim and acknowledgement.
async fn claim_and_complete(
    guard: &Guard,
    keys: Vec<String>,
    body: &Arc<[u8]>,
    wait: bool,
) -> anyhow::Result<()> {
    let mut claims = tokio::task::JoinSet::new();
    for key in keys {
        let guard = guard.clone();
        claims.spawn(async move {
            match guard.begin(&key, "fp-crash").await {
                Ok(idem::Decision::Proceed(claim)) => {
                    say(&format!("claimed {key}"));
                    Ok(claim)
                }
                other => Err(anyhow::anyhow!("{key}: not claimed: {other:?}")),
            }
        });
    }
    let claims = claims
        .join_all()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    if wait {
        say("waiting");
        let mut go = String::new();
        std::io::stdin()
            .read_line(&mut go)
            .context("wait for the go line")?;
    }
    let mut completions = tokio::task::JoinSet::new();
    for claim in claims {
        let (guard, body) = (guard.clone(), body.clone());
        completions.spawn(async move {
            let key = claim.key.clone();
            match guard.complete(claim, crash_response(&key, &body)).await.1 {
                Ok(_expires_at_ms) => {
                    say(&format!("acknowledged {key}"));
                    Ok(())
                }
                Err(e) => Err(anyhow::anyhow!("{key}: not completed: {e}")),
            }
        });
    }
    completions.join_all().await.into_iter().collect()
}

/// The SQLite writer's hook for `sqlite-transaction`: once `before` earlier
/// completions have gone by, it stops the writer inside the first
/// transaction that holds more than half of the last round's `keys`
/// completions or all of those still unwritten. So the stopped transaction
/// holds more keys than are queued behind it: had its writes survived the
/// kill, fewer keys than it holds would be left to take over, which is what
/// the test checks. A transaction that holds neither waits, before its
/// commit, until every other unwritten completion is in the writer's queue,
/// so the next transaction takes them all (a batch takes up to 256).
fn stop_in_transaction(
    store: idem::store::SqliteStore,
    completions: Arc<AtomicUsize>,
    before: usize,
    keys: usize,
) -> impl Fn(usize) + Send + Sync + 'static {
    // The round's completions committed so far (only the writer calls the hook).
    let committed = AtomicUsize::new(0);
    move |primitives| {
        if completions.load(Ordering::SeqCst) <= before {
            return;
        }
        let unwritten = keys - committed.load(Ordering::SeqCst);
        if primitives > keys / 2 || primitives >= unwritten {
            say(&format!("in-transaction {primitives}"));
            loop {
                std::thread::park();
            }
        }
        while store.queued_writes() < unwritten - primitives {
            std::thread::sleep(Duration::from_millis(1));
        }
        committed.fetch_add(primitives, Ordering::SeqCst);
    }
}
