//! Records in Redis (or Valkey), shared by every guard that points at the
//! same server and key prefix.
//!
//! Each record is a hash at `{prefix}{key}` with the fields `ver`, `exp`,
//! `fp`, `state`, `lease`, `status`, `headers`, `body`. The atomic
//! primitives are Lua scripts run with `EVALSHA`, so a claim — insert if
//! absent or expired, else return the live record — is one round trip.
//!
//! Time: the scripts compare `exp` with the `now_ms` the guard passes, never
//! with the server's clock, so a record is absent from the guard's first
//! expired millisecond whatever the server's clock says. Space is freed by
//! Redis itself: every write sets `PEXPIRE` to the record's remaining time
//! by the guard's clock (`expires_at_ms - now_ms`, immune to skew between
//! the two clocks) plus a grace period (`grace_ms`, default 60 s) so that a
//! slow round trip never lets Redis drop a record the guard still sees as
//! live. Versions: an expired record still held is overwritten at its
//! version + 1; once Redis has dropped it the key is absent and starts again
//! at 1, which the contract allows because no record exists to be fenced.
//!
//! URL: `redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=P&timeout_ms=N&grace_ms=N]`
//! (`rediss://` for TLS is not built in). The connection is one multiplexed
//! connection that reconnects by itself when the server comes back.
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
use std::sync::LazyLock;
use std::time::Duration;

const NAME: &str = "redis";
/// The hash fields, in the order every script and `get` reads them.
const FIELDS: [&str; 8] = [
    "ver", "exp", "fp", "state", "lease", "status", "headers", "body",
];
/// At most this many keys under a prefix are scanned by `list`, an operator's
/// tool: past it the answer would cost the server too much to compute.
pub const LIST_SCAN_MAX: usize = 1_000_000;

/// Script reply codes: `{code, payload}`.
const WROTE: i64 = 0;
const EXISTING: i64 = 1;
const NOTHING: i64 = 2;
const WRONG_TYPE: i64 = 3;

/// Reads the record at KEYS[1] into `cur` when it is a hash; shared by the scripts.
const READ: &str = r"
local t = redis.call('TYPE', KEYS[1])['ok']
local cur = nil
if t == 'hash' then
  cur = redis.call('HMGET', KEYS[1], 'ver', 'exp', 'fp', 'state', 'lease', 'status', 'headers', 'body')
elseif t ~= 'none' then
  return {3, t}
end
";

/// ARGV: now, ttl, fp, state, lease, exp, status, headers, body.
static INSERT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{READ}
local ver = 0
if cur then
  local v, e = tonumber(cur[1]), tonumber(cur[2])
  if v == nil or e == nil then return {{1, cur}} end
  if e > tonumber(ARGV[1]) then return {{1, cur}} end
  ver = v
end
ver = ver + 1
redis.call('HSET', KEYS[1], 'ver', ver, 'exp', ARGV[6], 'fp', ARGV[3], 'state', ARGV[4], 'lease', ARGV[5],
  'status', ARGV[7], 'headers', ARGV[8], 'body', ARGV[9])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {{0, ver}}"
    ))
});

/// ARGV: expected, now, ttl, fp, state, lease, exp, status, headers, body.
static REPLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{READ}
if not cur then return {{2, 0}} end
local v, e = tonumber(cur[1]), tonumber(cur[2])
if v == nil or e == nil then return {{1, cur}} end
if v ~= tonumber(ARGV[1]) or e <= tonumber(ARGV[2]) then return {{2, 0}} end
redis.call('HSET', KEYS[1], 'ver', v + 1, 'exp', ARGV[7], 'fp', ARGV[4], 'state', ARGV[5], 'lease', ARGV[6],
  'status', ARGV[8], 'headers', ARGV[9], 'body', ARGV[10])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {{0, v + 1}}"
    ))
});

/// ARGV: expected version.
static DELETE_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'ver')) ~= tonumber(ARGV[1]) then return 0 end
return redis.call('DEL', KEYS[1])",
    )
});

/// Deletes those of KEYS whose `exp` is at or before ARGV[1], at most ARGV[2].
static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local n = 0
for _, k in ipairs(KEYS) do
  if n >= tonumber(ARGV[2]) then break end
  if redis.call('TYPE', k)['ok'] == 'hash' then
    local e = tonumber(redis.call('HGET', k, 'exp'))
    if e ~= nil and e <= tonumber(ARGV[1]) then n = n + redis.call('DEL', k) end
  end
end
return n",
    )
});

/// A store on a Redis server. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    grace_ms: u64,
}

impl RedisStore {
    /// Connects to the server the URL names and loads the scripts. Fails
    /// when the server cannot be reached now; after that, the store
    /// reconnects by itself and fails each operation as unavailable meanwhile.
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url, &["prefix", "timeout_ms", "grace_ms"])?;
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
            .set_response_timeout(Some(timeout))
            // Few, quick retries: while the server is down each operation
            // fails fast as unavailable, and the next one tries again.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let connect = async {
            let mut conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            // Loaded now so that the first claim is one round trip too.
            for script in [&*INSERT, &*REPLACE, &*DELETE_AT, &*PURGE] {
                script
                    .load_async(&mut conn)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            }
            Ok(conn)
        };
        let conn = tokio::time::timeout(timeout * 2, connect)
            .await
            .map_err(|_| {
                unreachable(format!("no answer within {} ms", (timeout * 2).as_millis()))
            })??;
        Ok(RedisStore {
            conn,
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
        let attempt = async {
            match op(self.conn.clone()).await {
                Err(e) if e.is_connection_refusal() => op(self.conn.clone()).await,
                done => done,
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.code() == Some("WRONGTYPE") => Err(corrupt(
                key,
                "a Redis value that is not an idem record hash is stored there",
            )),
            Ok(Err(e)) => Err(unavailable(e.to_string())),
            Err(_) => Err(unavailable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
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

fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        store: NAME,
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// The record's fields as script arguments: fp, state, lease, exp, status, headers, body.
fn record_args(inv: &mut redis::ScriptInvocation<'_>, record: &Record) {
    let (status, headers, body) = match &record.response {
        Some(r) => (
            r.status.to_string(),
            encode_headers(&r.headers),
            r.body.as_slice(),
        ),
        None => (String::new(), Vec::new(), &[][..]),
    };
    inv.arg(record.fingerprint.as_str())
        .arg(record.state.as_str())
        .arg(record.lease_until_ms)
        .arg(record.expires_at_ms)
        .arg(status)
        .arg(headers)
        .arg(body);
}

/// Headers as `(u32 BE length, bytes)` pairs: binary-safe, no escaping.
fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.iter().map(|(n, v)| 8 + n.len() + v.len()).sum());
    for (name, value) in headers {
        for part in [name.as_bytes(), value.as_slice()] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

fn decode_headers(mut bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let take = |bytes: &mut &[u8]| -> Option<Vec<u8>> {
        let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let part = bytes.get(4..4 + len)?.to_vec();
        *bytes = &bytes[4 + len..];
        Some(part)
    };
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let name = String::from_utf8(take(&mut bytes)?).ok()?;
        headers.push((name, take(&mut bytes)?));
    }
    Some(headers)
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

/// Decodes the `FIELDS` of one record; `None` when the key has no hash.
fn decode_entry(key: &str, fields: &[Value]) -> Result<Option<Entry>, StoreError> {
    if fields.iter().all(|v| matches!(v, Value::Nil)) {
        return Ok(None);
    }
    let [ver, exp, fp, state, lease, status, headers, body] = fields else {
        return Err(corrupt(
            key,
            format!("expected {} fields, found {}", FIELDS.len(), fields.len()),
        ));
    };
    let field = |name: &str| corrupt(key, format!("the field {name:?} is missing or malformed"));
    let version = number(ver).ok_or_else(|| field("ver"))?;
    let expires_at_ms = number(exp).ok_or_else(|| field("exp"))?;
    let lease_until_ms = number(lease).ok_or_else(|| field("lease"))?;
    let fingerprint = bytes(fp)
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .ok_or_else(|| field("fp"))?;
    let state = bytes(state)
        .and_then(|b| State::parse(std::str::from_utf8(b).ok()?))
        .ok_or_else(|| field("state"))?;
    let status = bytes(status).ok_or_else(|| field("status"))?;
    let response = if status.is_empty() {
        None
    } else {
        let status = std::str::from_utf8(status)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| field("status"))?;
        let headers = bytes(headers)
            .and_then(decode_headers)
            .ok_or_else(|| field("headers"))?;
        let body = bytes(body).ok_or_else(|| field("body"))?.to_vec();
        Some(Response {
            status,
            headers,
            body,
        })
    };
    Ok(Some(Entry {
        record: Record {
            fingerprint,
            state,
            lease_until_ms,
            expires_at_ms,
            response,
        },
        version,
    }))
}

/// Splits a script's `{code, payload}` reply.
fn reply(key: &str, value: Value) -> Result<(i64, Value), StoreError> {
    if let Value::Array(mut parts) = value
        && parts.len() == 2
        && let Value::Int(code) = parts[0]
    {
        let payload = parts.pop().unwrap_or(Value::Nil);
        if code == WRONG_TYPE {
            let found = bytes(&payload)
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
                .into_owned();
            return Err(corrupt(
                key,
                format!("the key holds a Redis {found}, not an idem record hash"),
            ));
        }
        return Ok((code, payload));
    }
    Err(unavailable("unexpected script reply".into()))
}

fn existing(key: &str, payload: &Value) -> Result<Entry, StoreError> {
    let Value::Array(fields) = payload else {
        return Err(corrupt(key, "the record's fields did not come back"));
    };
    decode_entry(key, fields)?.ok_or_else(|| corrupt(key, "the record has no fields"))
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
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.full_key(key)).arg(&FIELDS[..]);
        let fields: Vec<Value> = self.query(key, &cmd).await?;
        Ok(decode_entry(key, &fields)?.filter(|e| e.record.is_live(now_ms)))
    }

    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        let mut inv = INSERT.key(self.full_key(key));
        inv.arg(now_ms).arg(self.ttl_ms(&record, now_ms));
        record_args(&mut inv, &record);
        match reply(key, self.invoke(key, &inv).await?)? {
            (WROTE, v) => {
                Ok(InsertOutcome::Inserted(number(&v).ok_or_else(|| {
                    unavailable("unexpected version reply".into())
                })?))
            }
            (EXISTING, fields) => Ok(InsertOutcome::Existing(existing(key, &fields)?)),
            (code, _) => Err(unavailable(format!("unexpected script reply code {code}"))),
        }
    }

    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mut inv = REPLACE.key(self.full_key(key));
        inv.arg(expected_version)
            .arg(now_ms)
            .arg(self.ttl_ms(&record, now_ms));
        record_args(&mut inv, &record);
        match reply(key, self.invoke(key, &inv).await?)? {
            (WROTE, v) => {
                Ok(Some(number(&v).ok_or_else(|| {
                    unavailable("unexpected version reply".into())
                })?))
            }
            (NOTHING, _) => Ok(None),
            // A record whose version or expiry does not decode.
            (EXISTING, fields) => existing(key, &fields).map(|_| None),
            (code, _) => Err(unavailable(format!("unexpected script reply code {code}"))),
        }
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        let full = self.full_key(key);
        let removed: i64 = match expected_version {
            None => self.query(key, redis::cmd("DEL").arg(&full)).await?,
            Some(v) => {
                let mut inv = DELETE_AT.key(full);
                inv.arg(v);
                number(&self.invoke(key, &inv).await?).map_or(0, u64::cast_signed)
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
            for key in chunk {
                pipe.cmd("HMGET").arg(self.full_key(key)).arg(&FIELDS[..]);
            }
            let pipe = &pipe;
            let replies: Vec<Vec<Value>> = self
                .call(&query.prefix, |mut conn| async move {
                    pipe.query_async(&mut conn).await
                })
                .await?;
            for (key, fields) in chunk.iter().zip(replies) {
                if let Some(entry) = decode_entry(key, &fields)?
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
                purged += number(&self.invoke(&self.prefix, &inv).await?).unwrap_or(0) as usize;
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

    #[test]
    fn headers_round_trip_and_truncation_is_refused() {
        let headers = vec![
            ("a".to_owned(), vec![0, 255]),
            (String::new(), vec![]),
            ("ü".to_owned(), b"x".to_vec()),
        ];
        let bytes = encode_headers(&headers);
        assert_eq!(decode_headers(&bytes), Some(headers));
        assert_eq!(decode_headers(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode_headers(&[0, 0, 0, 9, b'a']), None);
    }

    #[test]
    fn glob_characters_in_prefixes_are_escaped() {
        assert_eq!(glob_prefix(r"a*b?[c]\"), r"a\*b\?\[c\]\\*");
    }
}
