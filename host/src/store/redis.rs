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
//!   compare-and-set.
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
//! URL: `redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=P&timeout_ms=N&grace_ms=N&connections=N]`
//! (`rediss://` for TLS is not built in). Operations take turns over
//! `connections` (default 4) multiplexed connections, each pipelining the
//! commands of concurrent callers and reconnecting by itself when the server
//! comes back. More than one spreads the client's work over the runtime's
//! threads: with 32 concurrent callers, 4 connections gave 1.05–1.25× the
//! guarded ops of one (`benches/netstores.rs`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::store::{RedisStore, Store};
//! let store = RedisStore::open("redis://127.0.0.1:6379/0?prefix=shop:").await?;
//! assert_eq!(store.name(), "redis");
//! # Ok(()) }
//! ```

use super::params::StoreUrl;
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, State, Store, StoreError};
use async_trait::async_trait;
use idem_guest::model::Response;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

const NAME: &str = "redis";
/// At most this many keys under a prefix are scanned by `list`, an operator's
/// tool: past it the answer would cost the server too much to compute.
pub const LIST_SCAN_MAX: usize = 1_000_000;
/// The header `"{version} {expires_at_ms}\n"` fits in this many bytes (two u64s).
const HEADER_MAX: usize = 42;

/// Overwrites an expired record at its version + 1, or returns the live one
/// that a concurrent claimer wrote meanwhile: `{0, version}` or `{1, value}`;
/// `{2}` when the header does not decode.
/// ARGV: now, ttl, expires_at_ms, the value after the header.
static CLAIM_EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ver = 0
local cur = redis.call('GET', KEYS[1])
if cur then
  local v, e = string.match(cur, '^(%d+) (%d+)\n')
  if not v then return {2} end
  if tonumber(e) > tonumber(ARGV[1]) then return {1, cur} end
  ver = tonumber(v)
end
ver = ver + 1
redis.call('SET', KEYS[1], string.format('%d %s\n', ver, ARGV[3]) .. ARGV[4], 'PX', ARGV[2])
return {0, ver}",
    )
});

/// Sets the new value only if the record is live at the expected version:
/// 1 when written, 0 when not, -1 when the header does not decode.
/// ARGV: expected version, now, ttl, the new value (its header already at version + 1).
static REPLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local head = redis.call('GETRANGE', KEYS[1], 0, {last})
if head == '' then return 0 end
local v, e = string.match(head, '^(%d+) (%d+)\n')
if not v then return -1 end
if v ~= ARGV[1] or tonumber(e) <= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
return 1",
        last = HEADER_MAX - 1
    ))
});

/// Deletes the record only at the version ARGV[1]; a key that holds no
/// record is left alone.
static DELETE_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local head = redis.pcall('GETRANGE', KEYS[1], 0, {last})
if type(head) ~= 'string' or string.match(head, '^(%d+) ') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])",
        last = HEADER_MAX - 1
    ))
});

/// Deletes those of KEYS whose record expired at or before ARGV[1], at most ARGV[2].
static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"
local n = 0
for _, k in ipairs(KEYS) do
  if n >= tonumber(ARGV[2]) then break end
  local head = redis.pcall('GETRANGE', k, 0, {last})
  if type(head) == 'string' then
    local e = string.match(head, '^%d+ (%d+)\n')
    if e and tonumber(e) <= tonumber(ARGV[1]) then n = n + redis.call('DEL', k) end
  end
end
return n",
        last = HEADER_MAX - 1
    ))
});

/// A store on a Redis server. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RedisStore {
    conns: Arc<[ConnectionManager]>,
    next: Arc<AtomicUsize>,
    prefix: String,
    timeout: Duration,
    grace_ms: u64,
}

impl RedisStore {
    /// Connects to the server the URL names and loads the scripts. Fails
    /// when the server cannot be reached now; after that, the store
    /// reconnects by itself and fails each operation as unavailable meanwhile.
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url, &["prefix", "timeout_ms", "grace_ms", "connections"])?;
        let connections = url.number("connections", 4, 1, 64)? as usize;
        let prefix = url.get("prefix").unwrap_or("idem:").to_owned();
        let timeout = url.timeout()?;
        let grace_ms = url.number("grace_ms", 60_000, 0, 86_400_000)?;
        let unreachable = |reason: String| OpenError::Unreachable {
            store: NAME,
            url: url.shown.clone(),
            reason,
        };
        let client = redis::Client::open(url.driver.as_str()).map_err(|e| OpenError::BadUrl {
            url: url.shown.clone(),
            reason: e.to_string(),
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // No per-request timer in the driver: `call` bounds each whole
            // operation (connecting, a retry, the reply) by `timeout` itself,
            // and one timer per operation is measurably cheaper than two.
            .set_response_timeout(None)
            // Few, quick retries: while the server is down each operation
            // fails fast as unavailable, and the next one tries again.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let connect = async {
            let mut conns = Vec::with_capacity(connections);
            for _ in 0..connections {
                conns.push(
                    ConnectionManager::new_with_config(client.clone(), config.clone())
                        .await
                        .map_err(|e| unreachable(e.to_string()))?,
                );
            }
            // Loaded now so that the first claim is one round trip too.
            for script in [&*CLAIM_EXPIRED, &*REPLACE, &*DELETE_AT, &*PURGE] {
                script
                    .load_async(&mut conns[0])
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            }
            Ok(conns)
        };
        let conns = tokio::time::timeout(timeout * 2, connect)
            .await
            .map_err(|_| {
                unreachable(format!("no answer within {} ms", (timeout * 2).as_millis()))
            })??;
        Ok(RedisStore {
            conns: conns.into(),
            next: Arc::new(AtomicUsize::new(0)),
            prefix,
            timeout,
            grace_ms,
        })
    }

    /// The prefix every key is stored under.
    pub fn prefix(&self) -> &str {
        &self.prefix
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

    /// Runs one operation within the timeout. A refused connection means the
    /// command never left this process, so it is tried once more: that try
    /// waits for the reconnection the refusal started, which is what makes
    /// the first operation after the server comes back succeed.
    async fn call<T, Fut>(
        &self,
        key: &str,
        op: impl Fn(ConnectionManager) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let conn = &self.conns[turn];
        let attempt = async {
            match op(conn.clone()).await {
                Err(e) if e.is_connection_refusal() => op(conn.clone()).await,
                done => done,
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.code() == Some("WRONGTYPE") => Err(wrong_type(key)),
            Ok(Err(e)) => {
                if e.is_connection_dropped() || e.is_io_error() {
                    self.wake_others(turn).await;
                }
                Err(unavailable(e.to_string()))
            }
            Err(_) => Err(unavailable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// One connection found the server gone. A `PING` on each of the others
    /// makes a dead one notice now and start reconnecting, so that once the
    /// server is back the first operation on any connection goes through (by
    /// the retry above) instead of failing on a socket that died unnoticed.
    async fn wake_others(&self, failed: usize) {
        let ping = redis::cmd("PING");
        for (i, conn) in self.conns.iter().enumerate() {
            if i != failed {
                let mut conn = conn.clone();
                let _ = tokio::time::timeout(self.timeout, conn.send_packed_command(&ping)).await;
            }
        }
    }

    async fn invoke(
        &self,
        key: &str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        self.call(key, |mut conn| async move {
            invocation.invoke_async::<Value>(&mut conn).await
        })
        .await
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.call(key, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
    }
}

fn unavailable(reason: String) -> StoreError {
    StoreError::Unavailable {
        store: NAME,
        reason,
    }
}

fn wrong_type(key: &str) -> StoreError {
    corrupt(
        key,
        "the key holds a Redis value that is not a string: not an idem record, or one in the hash layout of earlier builds",
    )
}

fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        store: NAME,
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// A record as the string stored for it: the header
/// `"{version} {expires_at_ms}\n"` (ASCII, read by the scripts), then
/// `lease_until_ms` (u64), the state (u8: 0 processing, 1 done), the
/// fingerprint (u32 length, UTF-8), and the response: a u8 0 for none, or 1,
/// the status (u16), the headers (u32 count, then per header a u32 length and
/// the name, a u32 length and the value) and the body (u32 length, bytes).
/// Big-endian.
fn encode(version: u64, record: &Record) -> Vec<u8> {
    let response_len = record.response.as_ref().map_or(0, |r| {
        10 + r.body.len()
            + r.headers
                .iter()
                .map(|(n, v)| 8 + n.len() + v.len())
                .sum::<usize>()
    });
    let mut out = Vec::with_capacity(HEADER_MAX + 14 + record.fingerprint.len() + response_len);
    // Written in place: no intermediate String on every claim.
    let _ = writeln!(out, "{version} {}", record.expires_at_ms);
    out.extend_from_slice(&record.lease_until_ms.to_be_bytes());
    out.push(match record.state {
        State::Processing => 0,
        State::Done => 1,
    });
    put(&mut out, record.fingerprint.as_bytes());
    match &record.response {
        None => out.push(0),
        Some(r) => {
            out.push(1);
            out.extend_from_slice(&r.status.to_be_bytes());
            out.extend_from_slice(&(r.headers.len() as u32).to_be_bytes());
            for (name, value) in &r.headers {
                put(&mut out, name.as_bytes());
                put(&mut out, value);
            }
            put(&mut out, &r.body);
        }
    }
    out
}

/// A u32 length, then the bytes.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The length of the header, and the version and expiry it holds.
fn header(value: &[u8]) -> Option<(usize, u64, u64)> {
    let end = value.iter().take(HEADER_MAX).position(|&b| b == b'\n')?;
    let text = std::str::from_utf8(&value[..end]).ok()?;
    let (version, expires) = text.split_once(' ')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(version) || !digits(expires) {
        return None;
    }
    Some((end + 1, version.parse().ok()?, expires.parse().ok()?))
}

/// The inverse of [`encode`]; `Corrupt` naming the key and what is wrong.
fn decode(key: &str, value: &[u8]) -> Result<Entry, StoreError> {
    let bad = |what: &str| corrupt(key, format!("the stored record {what}"));
    let (start, version, expires_at_ms) =
        header(value).ok_or_else(|| bad("has no \"{version} {expires_at_ms}\" header"))?;
    let mut rest = &value[start..];
    let mut take = |n: usize, what: &str| -> Result<&[u8], StoreError> {
        if rest.len() < n {
            return Err(bad(&format!("ends inside {what}")));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let u32_at = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let lease_until_ms = u64::from_be_bytes(take(8, "the lease")?.try_into().expect("8 bytes"));
    let state = match take(1, "the state")?[0] {
        0 => State::Processing,
        1 => State::Done,
        other => return Err(bad(&format!("has an unknown state {other}"))),
    };
    let n = u32_at(take(4, "the fingerprint's length")?);
    let fingerprint = String::from_utf8(take(n, "the fingerprint")?.to_vec())
        .map_err(|_| bad("has a fingerprint that is not UTF-8"))?;
    let response = match take(1, "the response flag")?[0] {
        0 => None,
        1 => {
            let status = take(2, "the status")?;
            let status = u16::from_be_bytes([status[0], status[1]]);
            let count = u32_at(take(4, "the header count")?);
            let mut headers = Vec::with_capacity(count.min(64));
            for _ in 0..count {
                let n = u32_at(take(4, "a header name's length")?);
                let name = String::from_utf8(take(n, "a header name")?.to_vec())
                    .map_err(|_| bad("has a header name that is not UTF-8"))?;
                let n = u32_at(take(4, "a header value's length")?);
                headers.push((name, take(n, "a header value")?.to_vec()));
            }
            let n = u32_at(take(4, "the body's length")?);
            let body = take(n, "the body")?.to_vec();
            Some(Response {
                status,
                headers,
                body,
            })
        }
        other => return Err(bad(&format!("has an unknown response flag {other}"))),
    };
    if !rest.is_empty() {
        return Err(bad(&format!("has {} bytes after its end", rest.len())));
    }
    Ok(Entry {
        record: Record {
            fingerprint,
            state,
            lease_until_ms,
            expires_at_ms,
            response,
        },
        version,
    })
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

/// `MATCH` pattern for keys starting with `prefix`: glob characters escaped.
fn glob_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.full_key(key));
        let value: Option<Vec<u8>> = self.query(key, &cmd).await?;
        value
            .map(|v| decode(key, &v))
            .transpose()
            .map(|e| e.filter(|e| e.record.is_live(now_ms)))
    }

    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        let full = self.full_key(key);
        let ttl = self.ttl_ms(&record, now_ms);
        let value = encode(1, &record);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&full)
            .arg(&value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl);
        let Some(held) = self.query::<Option<Vec<u8>>>(key, &cmd).await? else {
            return Ok(InsertOutcome::Inserted(1));
        };
        let entry = decode(key, &held)?;
        if entry.record.is_live(now_ms) {
            return Ok(InsertOutcome::Existing(entry));
        }
        // Expired by the guard's clock, still held by Redis (the grace period).
        let (start, _, _) = header(&value).expect("encode writes a header");
        let mut inv = CLAIM_EXPIRED.key(full);
        inv.arg(now_ms)
            .arg(ttl)
            .arg(record.expires_at_ms)
            .arg(&value[start..]);
        let reply = self.invoke(key, &inv).await?;
        match reply {
            Value::Array(parts) => match parts.as_slice() {
                [Value::Int(0), version] => number(version)
                    .and_then(|v| u64::try_from(v).ok())
                    .map(InsertOutcome::Inserted)
                    .ok_or_else(|| unavailable("unexpected version reply".into())),
                [Value::Int(1), live] => bytes(live)
                    .ok_or_else(|| unavailable("unexpected record reply".into()))
                    .and_then(|v| decode(key, v))
                    .map(InsertOutcome::Existing),
                [Value::Int(2)] => Err(corrupt(
                    key,
                    "the stored record has no \"{version} {expires_at_ms}\" header",
                )),
                _ => Err(unavailable("unexpected script reply".into())),
            },
            _ => Err(unavailable("unexpected script reply".into())),
        }
    }

    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(version) = expected_version.checked_add(1) else {
            return Ok(None);
        };
        let mut inv = REPLACE.key(self.full_key(key));
        inv.arg(expected_version)
            .arg(now_ms)
            .arg(self.ttl_ms(&record, now_ms))
            .arg(encode(version, &record));
        match number(&self.invoke(key, &inv).await?) {
            Some(1) => Ok(Some(version)),
            Some(0) => Ok(None),
            Some(-1) => Err(corrupt(
                key,
                "the stored record has no \"{version} {expires_at_ms}\" header",
            )),
            _ => Err(unavailable("unexpected script reply".into())),
        }
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        let full = self.full_key(key);
        let removed = match expected_version {
            None => self.query(key, redis::cmd("DEL").arg(&full)).await?,
            Some(v) => {
                let mut inv = DELETE_AT.key(full);
                inv.arg(v);
                number(&self.invoke(key, &inv).await?).unwrap_or(0)
            }
        };
        Ok(removed > 0)
    }

    /// Scans the keys under the prefix (up to [`LIST_SCAN_MAX`]), sorts them
    /// and reads the page: an operator's tool, O(keys under the prefix).
    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let pattern = glob_prefix(&self.full_key(&query.prefix));
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, batch): (u64, Vec<Vec<u8>>) = self.query(&self.prefix, &cmd).await?;
            for raw in batch {
                let full = String::from_utf8(raw).map_err(|e| {
                    corrupt(
                        &String::from_utf8_lossy(e.as_bytes()),
                        "the key is not UTF-8",
                    )
                })?;
                let key = full[self.prefix.len()..].to_owned();
                if query
                    .after
                    .as_ref()
                    .is_none_or(|a| key.as_str() > a.as_str())
                {
                    keys.push(key);
                }
            }
            if keys.len() > LIST_SCAN_MAX {
                return Err(unavailable(format!(
                    "more than {LIST_SCAN_MAX} keys start with {:?}; list a narrower prefix",
                    query.prefix
                )));
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        keys.sort_unstable();
        keys.dedup(); // SCAN may return a key twice.
        let mut rows = Vec::new();
        for chunk in keys.chunks(query.limit.clamp(1, 1000)) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for key in chunk {
                pipe.cmd("GET").arg(self.full_key(key));
            }
            let pipe = &pipe;
            let values: Vec<redis::RedisResult<Option<Vec<u8>>>> = self
                .call(&query.prefix, |mut conn| async move {
                    pipe.query_async(&mut conn).await
                })
                .await?;
            for (key, value) in chunk.iter().zip(values) {
                let value = value.map_err(|e| {
                    if e.code() == Some("WRONGTYPE") {
                        wrong_type(key)
                    } else {
                        unavailable(e.to_string())
                    }
                })?;
                if let Some(value) = value
                    && let entry = decode(key, &value)?
                    && entry.record.is_live(now_ms)
                    && query.state.is_none_or(|s| s == entry.record.state)
                {
                    rows.push((key.clone(), entry));
                    if rows.len() == query.limit {
                        return Ok(rows);
                    }
                }
            }
        }
        Ok(rows)
    }

    /// Redis drops each key at its own expiry (`PX`, plus a grace period).
    fn purges_itself(&self) -> bool {
        true
    }

    /// Deletes up to `limit` records already expired by `now_ms` that Redis
    /// still holds (within their grace period). Redis frees the rest itself.
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let pattern = glob_prefix(&self.prefix);
        let (mut cursor, mut purged) = (0u64, 0usize);
        while purged < limit {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500);
            let (next, batch): (u64, Vec<Vec<u8>>) = self.query(&self.prefix, &cmd).await?;
            if !batch.is_empty() {
                let mut inv = PURGE.prepare_invoke();
                for key in &batch {
                    inv.key(key.as_slice());
                }
                inv.arg(now_ms).arg(limit - purged);
                purged += number(&self.invoke(&self.prefix, &inv).await?)
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(0);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(response: bool) -> Record {
        Record {
            fingerprint: "sha256:ü".into(),
            state: if response {
                State::Done
            } else {
                State::Processing
            },
            lease_until_ms: 1_792_382_430_000,
            expires_at_ms: u64::MAX,
            response: response.then(|| Response {
                status: 201,
                headers: vec![
                    ("a".to_owned(), vec![0, 255]),
                    (String::new(), vec![]),
                    ("ü".to_owned(), b"x".to_vec()),
                ],
                body: b"\n0 0\n".to_vec(),
            }),
        }
    }

    #[test]
    fn records_round_trip() {
        for response in [false, true] {
            let record = sample(response);
            let value = encode(7, &record);
            assert!(value.starts_with(b"7 18446744073709551615\n"));
            assert_eq!(decode("k", &value).unwrap(), Entry { record, version: 7 });
        }
    }

    #[test]
    fn bad_values_are_corrupt_naming_the_key() {
        let value = encode(3, &sample(true));
        let mut trailing = encode(3, &sample(false));
        trailing.push(0);
        let mut bad_state = encode(3, &sample(false));
        let at = header(&bad_state).unwrap().0 + 8;
        bad_state[at] = 9;
        for (bytes, says) in [
            (&b"garbage"[..], "header"),
            (b"1 x\n", "header"),
            (b"-1 5\n", "header"),
            (&value[..value.len() - 1], "ends inside the body"),
            (&bad_state, "unknown state 9"),
            (&trailing[..trailing.len()], "after its end"),
        ] {
            match decode("the-key", bytes) {
                Err(StoreError::Corrupt { key, reason, .. }) => {
                    assert_eq!(key, "the-key");
                    assert!(reason.contains(says), "{reason:?} should say {says:?}");
                }
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
            }
        }
    }

    #[test]
    fn glob_characters_in_prefixes_are_escaped() {
        assert_eq!(glob_prefix(r"a*b?[c]\"), r"a\*b\?\[c\]\\*");
    }
}
