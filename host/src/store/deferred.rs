//! A store opened in the background, so that a gateway starts whatever
//! its store's state. [`connect`] returns at once; until the store named by
//! the URL is open every operation fails as unavailable ("not connected
//! yet", with the latest attempt's error), which the guard answers 503 with
//! `Retry-After`; meanwhile a task tries again with backoff. Once the store
//! is open every call goes to it, and its driver's own reconnection takes
//! over. [`Connection`] is what the admin API shows of it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem::store::OpenError> {
//! use idem::store::{Store, connect};
//! let (store, connection) = connect("redis://127.0.0.1:6379?prefix=shop:")?;
//! // Redis down: an answer all the same, and an error that says why.
//! let read = store.get("order-1", 1_000).await;
//! println!("{read:?}; {:?}", connection.snapshot().state);
//! # Ok(()) }
//! ```

use super::codec::unavailable;
use super::open::{open, store_name};
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, Result, Store, SyncStore};
use crate::clock::{Clock, LocalClock};
use async_trait::async_trait;
use idem_admin_api::{ConnectionState, StoreConnection};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The wait after the first failed attempt; each next wait doubles it, up
/// to [`LAST_RETRY`], and is then drawn between half of it and all of it,
/// so that gateways restarted together do not retry in step.
pub const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
pub const LAST_RETRY: Duration = Duration::from_secs(5);
/// How long one attempt may take before it counts as failed (the stores'
/// own connect timeouts are shorter; this bounds a driver that has none).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a gateway's store is open yet, how many attempts it took, and
/// the latest error. Clones share it.
#[derive(Clone)]
pub struct Connection {
    state: Arc<watch::Sender<StoreConnection>>,
    /// Why the attempts stopped for good: the store refused the URL as written.
    refused: Arc<OnceLock<String>>,
}

impl Connection {
    /// The connection of a store that is open already.
    pub fn connected() -> Connection {
        Connection::new(StoreConnection {
            state: ConnectionState::Connected,
            since_ms: unix_ms(),
            attempts: 1,
            last_error: None,
        })
    }

    fn new(state: StoreConnection) -> Connection {
        Connection {
            state: Arc::new(watch::Sender::new(state)),
            refused: Arc::default(),
        }
    }

    /// Why no attempt will be made again, if so: the store refused the URL
    /// as written ([`OpenError::BadUrl`]), which waiting cannot fix.
    pub fn refused(&self) -> Option<&str> {
        self.refused.get().map(String::as_str)
    }

    /// The state now.
    pub fn snapshot(&self) -> StoreConnection {
        self.state.borrow().clone()
    }

    /// Every change from now on (an attempt failed, the store opened).
    pub fn subscribe(&self) -> watch::Receiver<StoreConnection> {
        self.state.subscribe()
    }

    fn failed(&self, why: String) {
        self.state.send_modify(|s| {
            s.attempts += 1;
            s.last_error = Some(why);
        });
    }

    fn opened(&self) {
        self.state.send_modify(|s| {
            s.attempts += 1;
            s.state = ConnectionState::Connected;
            s.since_ms = unix_ms();
        });
    }
}

/// The store `url` names, opened in the background: see the module docs.
/// Fails at once only when the URL names no store; any other problem
/// (unreachable, refused, a bad parameter the store finds) is an attempt
/// that failed, in the [`Connection`]. A URL the store refuses as written
/// ([`OpenError::BadUrl`]) is not tried again.
pub fn connect(url: &str) -> Result<(Arc<dyn Store>, Connection), OpenError> {
    let name = store_name(url)?;
    let connection = Connection::new(StoreConnection {
        state: ConnectionState::Connecting,
        since_ms: unix_ms(),
        attempts: 0,
        last_error: None,
    });
    let opened = Arc::new(OnceLock::new());
    let task = tokio::spawn(keep_trying(
        url.to_owned(),
        opened.clone(),
        connection.clone(),
    ));
    let store = Deferred {
        name,
        opened,
        connection: connection.clone(),
        _task: AbortOnDrop(task),
    };
    Ok((Arc::new(store), connection))
}

async fn keep_trying(url: String, opened: Arc<OnceLock<Arc<dyn Store>>>, connection: Connection) {
    let mut wait = FIRST_RETRY;
    loop {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, open(&url)).await {
            Ok(Ok(store)) => {
                let _ = opened.set(store);
                connection.opened();
                return;
            }
            Ok(Err(e @ OpenError::BadUrl { .. })) => {
                let _ = connection.refused.set(e.to_string());
                connection.failed(format!("{e} (not tried again)"));
                return;
            }
            Ok(Err(e)) => connection.failed(e.to_string()),
            Err(_) => {
                connection.failed(format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs()));
            }
        }
        tokio::time::sleep(wait.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
        wait = (wait * 2).min(LAST_RETRY);
    }
}

/// The store behind [`connect`]: every call goes to the opened store, or
/// fails as unavailable until there is one.
struct Deferred {
    name: &'static str,
    opened: Arc<OnceLock<Arc<dyn Store>>>,
    connection: Connection,
    _task: AbortOnDrop,
}

impl Deferred {
    fn store(&self) -> Result<&Arc<dyn Store>> {
        self.opened
            .get()
            .ok_or_else(|| unavailable(self.name, not_connected(&self.connection)))
    }
}

/// Why a store is not there yet, with the latest attempt's error.
fn not_connected(connection: &Connection) -> String {
    let now = connection.snapshot();
    let why = now
        .last_error
        .unwrap_or_else(|| "the first attempt is under way".into());
    format!(
        "store not connected yet ({} attempts so far, trying again): {why}",
        now.attempts
    )
}

/// The opened store's time authority; unknown until it is open (so every
/// guard call answers unavailable, saying the store is not connected yet).
struct DeferredClock {
    opened: Arc<OnceLock<Arc<dyn Store>>>,
    clock: OnceLock<Arc<dyn Clock>>,
    connection: Connection,
}

impl DeferredClock {
    fn inner(&self) -> Option<&Arc<dyn Clock>> {
        if let Some(clock) = self.clock.get() {
            return Some(clock);
        }
        let store = self.opened.get()?;
        Some(self.clock.get_or_init(|| store.clock()))
    }
}

impl Clock for DeferredClock {
    /// Before the store is open no decision reads it (its time is not
    /// known): this process's own clock, for operators' displays.
    fn now_ms(&self) -> u64 {
        match self.inner() {
            Some(clock) => clock.now_ms(),
            None => LocalClock.now_ms(),
        }
    }

    fn known(&self) -> std::result::Result<u64, String> {
        match self.inner() {
            Some(clock) => clock.known(),
            None => Err(not_connected(&self.connection)),
        }
    }

    fn authority(&self) -> String {
        match self.inner() {
            Some(clock) => clock.authority(),
            None => "the store's clock, once the store is connected".into(),
        }
    }
}

/// Each call to the opened store, or the error that says there is none yet.
#[async_trait]
impl Store for Deferred {
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        self.store()?.get(key, now_ms).await
    }
    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        self.store()?.insert(key, record, now_ms).await
    }
    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        self.store()?.replace(key, expected, record, now_ms).await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        self.store()?.delete(key, expected_version, now_ms).await
    }
    fn name(&self) -> &'static str {
        self.name
    }
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        self.store()?.list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        self.store()?.purge_expired(now_ms, limit).await
    }
    /// Asked once, when a guard is built: before the store is open, by
    /// its kind (Redis expires keys itself; the others are purged).
    fn purges_itself(&self) -> bool {
        self.opened
            .get()
            .map_or(self.name == "redis", Store::purges_itself)
    }
    /// Asked once, when a guard is built: only a store open by then
    /// (the memory store is, at once) offers its sync side.
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        self.opened.get()?.as_sync()
    }
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(DeferredClock {
            opened: self.opened.clone(),
            clock: OnceLock::new(),
            connection: self.connection.clone(),
        })
    }
}

/// Ends the background task with the store that owns it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, State};

    #[tokio::test(flavor = "current_thread")]
    async fn unavailable_until_open_then_every_call_goes_through() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-yet");
        let url = format!("sqlite:{}", missing.join("idem.db").display());
        let (store, connection) = connect(&url).unwrap();
        // The directory is missing: attempts fail, and say why.
        while connection.snapshot().attempts < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let err = store.get("k", 1).await.unwrap_err().to_string();
        assert!(
            err.contains("store not connected yet") && err.contains("does not exist"),
            "{err}"
        );
        assert_eq!(connection.snapshot().state, ConnectionState::Connecting);
        // Once the directory is there, the next attempt opens the store.
        std::fs::create_dir(&missing).unwrap();
        let mut changes = connection.subscribe();
        changes
            .wait_for(|c| c.state == ConnectionState::Connected)
            .await
            .unwrap();
        let record = Record {
            fingerprint: "fp".into(),
            state: State::Processing,
            holder: 1,
            lease_until_ms: 10,
            expires_at_ms: 100,
            response: None,
            checkpoint: None,
        };
        store.insert("k", record, 1).await.unwrap();
        assert!(store.get("k", 1).await.unwrap().is_some());
        let now = connection.snapshot();
        assert!(now.attempts >= 3 && now.last_error.is_some(), "{now:?}");
    }

    #[test]
    fn a_url_that_names_no_store_fails_at_once() {
        let err = connect("mysql://db").err().unwrap().to_string();
        assert!(err.contains("unknown store \"mysql\""), "{err}");
    }
}
