//! Records in Redis (or Valkey), shared by every guard that points at the
//! same server and key prefix.
//!
//! Each record is one string at `{prefix}{key}`: a text header
//! `"{version} {expires_at_ms}\n"` that the scripts read, then the rest of the
//! record in a binary layout only this module reads (see [`encode`]). One
//! string rather than a hash so that the common primitives are single native
//! commands, which cost the server a fraction of a script:
//!
//! - a claim is `SET key value NX GET PX ttl`: it writes version 1 if the key
//!   is absent, else returns the record held, atomically, in one round trip.
//!   Only when that record has expired by the guard's clock while Redis still
//!   holds it (its grace period, below) does a second round trip follow: a
//!   script that overwrites it at its version + 1 if it is still expired.
//! - a completion is a script (`EVALSHA`): read the header, compare the
//!   version and the expiry, `SET` the new value. Redis 7 has no native
//!   compare-and-set; Valkey 8.1 has, and then it is `SET … IFEQ` (below).
//! - a read is `GET`.
//!
//! Time: expiry is compared with the `now_ms` the guard passes, never with
//! the server's clock, so a record is absent from the guard's first expired
//! millisecond whatever the server's clock says. Space is freed by Redis
//! itself: every write sets `PX` to the record's remaining time by the
//! guard's clock (`expires_at_ms - now_ms`, immune to skew between the two
//! clocks) plus a grace period (`grace_ms`, default 60 s) so that a slow
//! round trip never lets Redis drop a record the guard still sees as live.
//! Versions: an expired record still held is overwritten at its version + 1;
//! once Redis has dropped it the key is absent and starts again at 1, which
//! the contract allows because no record exists to be fenced.
//!
//! Native compare-and-set: on a server that has `SET key value IFEQ old`
//! (Valkey 8.1 and later, detected at connect), a completion or renewal is
//! that one native command instead of the script, whenever the store holds
//! the bytes of the record at the expected version — it remembers the bytes
//! of every unfinished record it wrote or read, so the usual completion
//! after this process's own claim always does. Bytes that differ by
//! anything mean another writer came between: refused, as the script would
//! (stricter only for a key Redis dropped and a new claim wrote again at the
//! same version, which the script would let an old holder overwrite). When
//! the bytes are not known, or on Redis 7, the script runs.
//!
//! URL: `redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=P&timeout_ms=N&grace_ms=N&connections=N&wait=N&wait_ms=N&cas=auto|script]`,
//! or for a Redis Cluster `redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT…][?…]`
//! naming any of its nodes (the client learns the rest and follows the slots
//! as they move; a record is one key, so every primitive is still one
//! command on one node). `rediss://` for TLS is not built in. Operations
//! take turns over `connections` (default 4) connections, each pipelining
//! the commands of concurrent callers and reconnecting by itself when the
//! server comes back. To a lone server they are this module's own RESP
//! client (`conn.rs`): a caller writes its command to the socket itself and
//! one reader task per connection parses the replies in place, with no task
//! between the caller and the socket; to a cluster they are the `redis`
//! crate's, which follows slots as they move. More than one connection
//! spreads the reading over the runtime's threads.
//!
//! Durability: Redis replicates asynchronously, so a claim a primary
//! acknowledged and lost before its replica had it is gone after a failover,
//! and a second caller can claim the key again. `wait=N` sends
//! `WAIT N wait_ms` after every claim and every replace, in the same
//! pipeline on the same connection (one round trip still): when fewer than N
//! replicas have the write within `wait_ms` (default: half the timeout) the
//! operation fails as unavailable — the guard fails closed, nothing runs —
//! and the write stays on the primary alone, where it may or may not
//! survive. `cas=script` turns the native compare-and-set off (to compare).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::store::{RedisStore, Store};
//! let store = RedisStore::open("redis://127.0.0.1:6379/0?prefix=shop:").await?;
//! assert_eq!(store.name(), "redis");
//! let cluster = RedisStore::open("redis+cluster://127.0.0.1:7000,127.0.0.1:7001?wait=1").await?;
//! # Ok(()) }
//! ```

mod conn;
mod connect;
mod resp;
mod scan;
mod scripts;
mod value;

use super::codec::{corrupt, unavailable};
use super::{Entry, InsertOutcome, ListQuery, Record, Result, State, Store, StoreError};
use crate::clock::{Clock, SyncedClock, Syncing};
use async_trait::async_trait;
use bytes::Bytes;
use connect::{Conn, Wait};
use resp::{Command, Reply};
use scripts::{CLAIM_EXPIRED, DELETE_AT, REPLACE, evalsha};
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use value::{decode, encode, header};

const NAME: &str = "redis";
/// At most this many unfinished records' bytes are remembered for the native
/// compare-and-set; past it they are forgotten at once, and the next
/// replaces of those keys run the script.
const SEEN_MAX: usize = 65_536;

/// A store on a Redis server or cluster. Cheap to clone: clones share the
/// connections.
#[derive(Clone)]
pub struct RedisStore {
    conns: Arc<[Conn]>,
    next: Arc<AtomicUsize>,
    prefix: String,
    timeout: Duration,
    grace_ms: u64,
    wait: Wait,
    /// With the native compare-and-set: per full key, the version and bytes
    /// of the unfinished record last written or read. `None` without it.
    seen: Option<Arc<Mutex<Seen>>>,
    /// Where `purge_expired` goes on from (see [`scan::PurgeCursor`]).
    purge: Arc<tokio::sync::Mutex<scan::PurgeCursor>>,
    /// The server's clock, the store's time authority; kept synced while
    /// any clone holds `_syncing`.
    clock: Arc<SyncedClock>,
    _syncing: Arc<Syncing>,
}

/// Per full key, the version and bytes of the unfinished record last seen.
type Seen = HashMap<String, (u64, Vec<u8>)>;

impl RedisStore {
    /// The prefix every key is stored under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether completions and renewals use the server's `SET … IFEQ`
    /// (Valkey 8.1 and later) rather than a script.
    pub fn native_cas(&self) -> bool {
        self.seen.is_some()
    }

    /// Whether the URL named a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conns[0], Conn::Cluster(_))
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// How long Redis keeps the record: its remaining life by the guard's clock, plus the grace.
    fn ttl_ms(&self, record: &Record, now_ms: u64) -> u64 {
        record
            .expires_at_ms
            .saturating_sub(now_ms)
            .saturating_add(self.grace_ms)
            .max(1)
    }

    /// Keeps the bytes of an unfinished record for the native
    /// compare-and-set (a finished one is not replaced again: forgotten).
    fn remember(&self, full: &str, version: u64, state: State, value: &[u8]) {
        let Some(seen) = &self.seen else { return };
        let mut seen = seen.lock().expect("seen lock");
        if state == State::Done {
            seen.remove(full);
            return;
        }
        if seen.len() >= SEEN_MAX && !seen.contains_key(full) {
            seen.clear();
        }
        seen.insert(full.to_owned(), (version, value.to_vec()));
    }

    /// The bytes of the record at `version`, when known; taken out, so a
    /// concurrent replace of the same key runs the script.
    fn recall(&self, full: &str, version: u64) -> Option<Vec<u8>> {
        let mut seen = self.seen.as_ref()?.lock().expect("seen lock");
        match seen.remove(full) {
            Some((v, bytes)) if v == version => Some(bytes),
            Some(other) => {
                seen.insert(full.to_owned(), other);
                None
            }
            None => None,
        }
    }

    fn forget(&self, full: &str) {
        if let Some(seen) = &self.seen {
            seen.lock().expect("seen lock").remove(full);
        }
    }
}

/// A string's bytes, or `None` for no value.
fn value_or_nil(reply: Reply) -> Result<Option<Bytes>> {
    match reply {
        Reply::Nil => Ok(None),
        Reply::Bulk(value) => Ok(Some(value)),
        other => Err(unavailable(NAME, format!("unexpected reply {other:?}"))),
    }
}

fn wrong_type(key: &str) -> StoreError {
    corrupt(
        NAME,
        key,
        "the key holds a Redis value that is not a string: not an idem record, or one in the hash layout of earlier builds",
    )
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        let full = self.full_key(key);
        let mut cmd = Command::with_capacity("GET", full.len());
        cmd.arg(&full);
        let reply = self.send(key, &cmd, None, false).await?;
        let Some(value) = value_or_nil(reply)? else {
            return Ok(None);
        };
        let entry = decode(key, &value)?;
        if !entry.record.is_live(now_ms) {
            return Ok(None);
        }
        self.remember(&full, entry.version, entry.record.state, &value);
        Ok(Some(entry))
    }

    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        let full = self.full_key(key);
        let ttl = self.ttl_ms(&record, now_ms);
        let value = encode(1, &record);
        let mut cmd = Command::with_capacity("SET", full.len() + value.len() + 48);
        cmd.arg(&full)
            .arg(&value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl);
        let reply = self.send(key, &cmd, None, true).await?;
        let Some(held) = value_or_nil(reply)? else {
            self.remember(&full, 1, record.state, &value);
            return Ok(InsertOutcome::Inserted(1));
        };
        let entry = decode(key, &held)?;
        if entry.record.is_live(now_ms) {
            self.remember(&full, entry.version, entry.record.state, &held);
            return Ok(InsertOutcome::Existing(entry));
        }
        // Expired by the guard's clock, still held by Redis (the grace period).
        let (start, _, _) = header(&value).expect("encode writes a header");
        let mut cmd = evalsha(&CLAIM_EXPIRED, full.as_bytes(), value.len() + 64);
        cmd.arg(now_ms)
            .arg(ttl)
            .arg(record.expires_at_ms)
            .arg(&value[start..]);
        let reply = self.send(key, &cmd, Some(&CLAIM_EXPIRED), true).await?;
        let Reply::Array(parts) = reply else {
            return Err(unavailable(NAME, "unexpected script reply"));
        };
        match parts.as_slice() {
            [Reply::Int(0), version] => {
                let version = version
                    .number()
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| unavailable(NAME, "unexpected version reply"))?;
                self.remember(&full, version, record.state, &encode(version, &record));
                Ok(InsertOutcome::Inserted(version))
            }
            [Reply::Int(1), live] => {
                let live = live
                    .bytes()
                    .ok_or_else(|| unavailable(NAME, "unexpected record reply"))?;
                let entry = decode(key, live)?;
                self.remember(&full, entry.version, entry.record.state, live);
                Ok(InsertOutcome::Existing(entry))
            }
            [Reply::Int(2)] => Err(corrupt(
                NAME,
                key,
                "the stored record has no \"{version} {expires_at_ms}\" header",
            )),
            _ => Err(unavailable(NAME, "unexpected script reply")),
        }
    }

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        let Some(version) = expected.checked_add(1) else {
            return Ok(false);
        };
        let full = self.full_key(key);
        let ttl = self.ttl_ms(&record, now_ms);
        let value = encode(version, &record);
        if let Some(old) = self.recall(&full, expected) {
            // The exact bytes at that version: the server compares them
            // whole, and the expiry is theirs.
            if header(&old).is_none_or(|(_, _, expires_at_ms)| expires_at_ms <= now_ms) {
                return Ok(false);
            }
            let mut cmd = Command::with_capacity("SET", full.len() + value.len() + old.len() + 64);
            cmd.arg(&full)
                .arg(&value)
                .arg("IFEQ")
                .arg(&old)
                .arg("PX")
                .arg(ttl);
            if self.send(key, &cmd, None, true).await? == Reply::Nil {
                return Ok(false);
            }
            self.remember(&full, version, record.state, &value);
            return Ok(true);
        }
        let mut cmd = evalsha(&REPLACE, full.as_bytes(), value.len() + 64);
        cmd.arg(expected).arg(now_ms).arg(ttl).arg(&value);
        let reply = self.send(key, &cmd, Some(&REPLACE), true).await?;
        match reply.number() {
            Some(1) => {
                self.remember(&full, version, record.state, &value);
                Ok(true)
            }
            Some(0) => Ok(false),
            Some(-1) => Err(corrupt(
                NAME,
                key,
                "the stored record has no \"{version} {expires_at_ms}\" header",
            )),
            _ => Err(unavailable(NAME, "unexpected script reply")),
        }
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        let full = self.full_key(key);
        self.forget(&full);
        let mut cmd = evalsha(&DELETE_AT, full.as_bytes(), 48);
        match expected_version {
            Some(v) => cmd.arg(v),
            None => cmd.arg(""),
        };
        cmd.arg(now_ms);
        let reply = self.send(key, &cmd, Some(&DELETE_AT), false).await?;
        Ok(reply.number().unwrap_or(0) > 0)
    }

    /// The server's `TIME` (`time.lua`), read every second.
    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// Scans the keys under the prefix (up to `LIST_SCAN_MAX`, a million; on a
    /// cluster, on each primary), sorts them and reads the page: an
    /// operator's tool, O(keys under the prefix).
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        self.scan_list(query, now_ms).await
    }

    /// Redis drops each key at its own expiry (`PX`, plus a grace period).
    fn purges_itself(&self) -> bool {
        true
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        self.purge_held(now_ms, limit).await
    }
}
