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
//! take turns over `connections` (default 4) multiplexed connections, each
//! pipelining the commands of concurrent callers and reconnecting by itself
//! when the server comes back. More than one spreads the client's work over
//! the runtime's threads: with 32 concurrent callers, 4 connections gave
//! 1.05–1.25× the guarded ops of one (`benches/netstores.rs`).
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

use super::params::StoreUrl;
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, State, Store, StoreError};
use async_trait::async_trait;
use idem_guest::model::Response;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, FromRedisValue, Script, ServerErrorKind, Value};
use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

const NAME: &str = "redis";
/// At most this many keys under a prefix are scanned by `list`, an operator's
/// tool: past it the answer would cost the server too much to compute.
pub const LIST_SCAN_MAX: usize = 1_000_000;
/// The header `"{version} {expires_at_ms}\n"` fits in this many bytes (two u64s).
const HEADER_MAX: usize = 42;
/// At most this many unfinished records' bytes are remembered for the native
/// compare-and-set; past it they are forgotten at once, and the next
/// replaces of those keys run the script.
const SEEN_MAX: usize = 65_536;

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

/// One multiplexed connection: to a lone server, or to a cluster (a
/// connection per node, each command sent to the node that holds its key's
/// slot). Either pipelines the commands of concurrent callers.
#[derive(Clone)]
enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `WAIT replicas ms` after every write, when `replicas` > 0.
#[derive(Clone, Copy)]
struct Wait {
    replicas: u64,
    ms: u64,
}

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
}

/// Per full key, the version and bytes of the unfinished record last seen.
type Seen = HashMap<String, (u64, Vec<u8>)>;

impl RedisStore {
    /// Connects to the server (or cluster) the URL names, loads the scripts
    /// and asks whether the server has `SET … IFEQ`. Fails when it cannot
    /// be reached now; after that, the store reconnects by itself and fails
    /// each operation as unavailable meanwhile.
    #[allow(clippy::too_many_lines)] // one connect path per kind of server, read top to bottom
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(
            url,
            &[
                "prefix",
                "timeout_ms",
                "grace_ms",
                "connections",
                "wait",
                "wait_ms",
                "cas",
            ],
        )?;
        let connections = url.number("connections", 4, 1, 64)? as usize;
        let prefix = url.get("prefix").unwrap_or("idem:").to_owned();
        let timeout = url.timeout()?;
        let grace_ms = url.number("grace_ms", 60_000, 0, 86_400_000)?;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let wait = Wait {
            replicas: url.number("wait", 0, 0, 64)?,
            ms: url.number("wait_ms", (timeout_ms / 2).max(1), 1, timeout_ms)?,
        };
        let bad_url = |reason: String| OpenError::BadUrl {
            url: url.shown.clone(),
            reason,
        };
        let native_cas = match url.get("cas").unwrap_or("auto") {
            "auto" => true,
            "script" => false,
            other => return Err(bad_url(format!("cas={other:?} is not one of auto, script"))),
        };
        let unreachable = |reason: String| OpenError::Unreachable {
            store: NAME,
            url: url.shown.clone(),
            reason,
        };
        let cluster = cluster_nodes(&url.driver).map_err(bad_url)?;
        let connect = async {
            let mut conns = Vec::with_capacity(connections);
            #[allow(clippy::single_match_else)] // the two kinds of server, side by side
            match &cluster {
                Some(nodes) => {
                    let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                        .connection_timeout(timeout)
                        // As for a lone server: few, quick retries, each
                        // operation bounded by `timeout` as a whole. A retry
                        // is what follows a slot that moved (`MOVED`) or a
                        // primary that failed over.
                        .retries(2)
                        .min_retry_wait(10)
                        .max_retry_wait(100)
                        .build()
                        .map_err(|e| bad_url(e.to_string()))?;
                    for _ in 0..connections {
                        let conn = client
                            .get_async_connection()
                            .await
                            .map_err(|e| unreachable(e.to_string()))?;
                        conns.push(Conn::Cluster(conn));
                    }
                }
                None => {
                    let client = redis::Client::open(url.driver.as_str())
                        .map_err(|e| bad_url(e.to_string()))?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        // No per-request timer in the driver: `call` bounds
                        // each whole operation (connecting, a retry, the
                        // reply) by `timeout` itself, and one timer per
                        // operation is measurably cheaper than two.
                        .set_response_timeout(None)
                        // Few, quick retries: while the server is down each
                        // operation fails fast as unavailable, and the next
                        // one tries again.
                        .set_number_of_retries(1)
                        .set_min_delay(Duration::from_millis(10))
                        .set_max_delay(Duration::from_millis(100));
                    for _ in 0..connections {
                        let conn =
                            ConnectionManager::new_with_config(client.clone(), config.clone())
                                .await
                                .map_err(|e| unreachable(e.to_string()))?;
                        conns.push(Conn::Server(conn));
                    }
                }
            }
            // Loaded now so that the first claim is one round trip too (on a
            // cluster, `SCRIPT LOAD` goes to every node).
            for script in [&*CLAIM_EXPIRED, &*REPLACE, &*DELETE_AT, &*PURGE] {
                script
                    .load_async(&mut conns[0])
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            }
            let native = native_cas
                && has_ifeq(&mut conns[0], &prefix)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            Ok((conns, native))
        };
        let (conns, native) =
            tokio::time::timeout(timeout * 2, connect)
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
            wait,
            seen: native.then(Default::default),
        })
    }

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

    /// Runs one operation within the timeout. A refused connection means the
    /// command never left this process, so it is tried once more: that try
    /// waits for the reconnection the refusal started, which is what makes
    /// the first operation after the server comes back succeed.
    async fn call<T, Fut>(&self, key: &str, op: impl Fn(Conn) -> Fut) -> Result<T, StoreError>
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
                let _ = tokio::time::timeout(self.timeout, conn.req_packed_command(&ping)).await;
            }
        }
    }

    /// Sends `cmd`, which reads or writes `key` alone. When it runs
    /// `script` and the server does not have it (restarted, or a replica
    /// promoted since), loads it and sends `cmd` again. When `write` and the
    /// URL asks for `wait=N`, `WAIT N wait_ms` follows in the same pipeline,
    /// on the same connection to the same node, and fewer than N replicas
    /// acknowledging fails the operation as unavailable.
    async fn send<T: FromRedisValue>(
        &self,
        key: &str,
        cmd: &Cmd,
        script: Option<&Script>,
        write: bool,
    ) -> Result<T, StoreError> {
        let wait = self.wait;
        let pipe = (write && wait.replicas > 0).then(|| {
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(wait.ms);
            pipe
        });
        let pipe = pipe.as_ref();
        let once = async |mut conn: Conn| match pipe {
            None => cmd.query_async::<T>(&mut conn).await.map(|v| (v, None)),
            Some(pipe) => pipe
                .query_async::<(T, u64)>(&mut conn)
                .await
                .map(|(v, acked)| (v, Some(acked))),
        };
        let once = &once;
        let (value, acked) = self
            .call(key, |conn| async move {
                match (once(conn.clone()).await, script) {
                    (Err(e), Some(script))
                        if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                    {
                        script.load_async(&mut conn.clone()).await?;
                        once(conn).await
                    }
                    (done, _) => done,
                }
            })
            .await?;
        match acked {
            Some(acked) if acked < wait.replicas => Err(unavailable(format!(
                "the write reached {acked} of the {} replicas wait= asks for within {} ms; failing closed",
                wait.replicas, wait.ms
            ))),
            _ => Ok(value),
        }
    }

    /// The nodes a `SCAN` must visit: the one server (`None`), or each
    /// primary of the cluster, since a cursor is one node's.
    async fn scan_nodes(&self) -> Result<Vec<Option<(String, u16)>>, StoreError> {
        if !self.is_cluster() {
            return Ok(vec![None]);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let nodes: String = self.send(&self.prefix, &cmd, None, false).await?;
        Ok(cluster_primaries(&nodes).into_iter().map(Some).collect())
    }

    /// One page of the keys matching `pattern` on `node`.
    async fn scan_page(
        &self,
        node: Option<&(String, u16)>,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let cmd = &cmd;
        let value = self
            .call(&self.prefix, |conn| async move {
                match (conn, node) {
                    (Conn::Cluster(mut c), Some((host, port))) => {
                        let to = SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        };
                        c.route_command(cmd.clone(), RoutingInfo::SingleNode(to))
                            .await
                    }
                    (mut conn, _) => conn.req_packed_command(cmd).await,
                }
            })
            .await?;
        redis::from_redis_value(value).map_err(|e| unavailable(e.to_string()))
    }
}

/// The node URLs of a `redis+cluster://[USERINFO@]HOST:PORT[,HOST:PORT…][/0][?…]`
/// URL, or `None` for any other URL (a lone server's).
fn cluster_nodes(driver_url: &str) -> Result<Option<Vec<String>>, String> {
    let Some(rest) = driver_url.strip_prefix("redis+cluster://") else {
        return Ok(None);
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(path, "" | "0") {
        return Err(format!("a Redis Cluster has database 0 only, not /{path}"));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                Err("redis+cluster:// names an empty node".to_owned())
            } else {
                Ok(format!("redis://{userinfo}{host}{query}"))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(nodes))
}

/// The `host` and `port` of each primary that serves slots and is not
/// failing, from a `CLUSTER NODES` reply.
fn cluster_primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if fields.len() < 9 || !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let address = fields[1].split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// Whether the server has `SET … IFEQ` (Valkey 8.1 and later). The probe
/// key holds no record (it has a control character, which no idem key
/// has) and `IFEQ` never creates a key, so the probe writes nothing.
async fn has_ifeq(conn: &mut Conn, prefix: &str) -> redis::RedisResult<bool> {
    let mut cmd = redis::cmd("SET");
    cmd.arg(format!("{prefix}\u{1}ifeq-probe"))
        .arg("probe")
        .arg("IFEQ")
        .arg("probe");
    match cmd.query_async::<Option<String>>(conn).await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("ERR") => Ok(false),
        Err(e) => Err(e),
    }
}

/// `EVALSHA` of `script` on one key; its arguments follow.
fn evalsha(script: &Script, key: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    cmd
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
        let full = self.full_key(key);
        let mut cmd = redis::cmd("GET");
        cmd.arg(&full);
        let Some(value) = self.send::<Option<Vec<u8>>>(key, &cmd, None, false).await? else {
            return Ok(None);
        };
        let entry = decode(key, &value)?;
        if !entry.record.is_live(now_ms) {
            return Ok(None);
        }
        self.remember(&full, entry.version, entry.record.state, &value);
        Ok(Some(entry))
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
        let Some(held) = self.send::<Option<Vec<u8>>>(key, &cmd, None, true).await? else {
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
        let mut cmd = evalsha(&CLAIM_EXPIRED, full.as_bytes());
        cmd.arg(now_ms)
            .arg(ttl)
            .arg(record.expires_at_ms)
            .arg(&value[start..]);
        let reply: Value = self.send(key, &cmd, Some(&CLAIM_EXPIRED), true).await?;
        match reply {
            Value::Array(parts) => match parts.as_slice() {
                [Value::Int(0), version] => {
                    let version = number(version)
                        .and_then(|v| u64::try_from(v).ok())
                        .ok_or_else(|| unavailable("unexpected version reply".into()))?;
                    self.remember(&full, version, record.state, &encode(version, &record));
                    Ok(InsertOutcome::Inserted(version))
                }
                [Value::Int(1), live] => {
                    let live =
                        bytes(live).ok_or_else(|| unavailable("unexpected record reply".into()))?;
                    let entry = decode(key, live)?;
                    self.remember(&full, entry.version, entry.record.state, live);
                    Ok(InsertOutcome::Existing(entry))
                }
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
        let full = self.full_key(key);
        let ttl = self.ttl_ms(&record, now_ms);
        let value = encode(version, &record);
        if let Some(old) = self.recall(&full, expected_version) {
            // The exact bytes at that version: the server compares them
            // whole, and the expiry is theirs.
            if header(&old).is_none_or(|(_, _, expires_at_ms)| expires_at_ms <= now_ms) {
                return Ok(None);
            }
            let mut cmd = redis::cmd("SET");
            cmd.arg(&full)
                .arg(&value)
                .arg("IFEQ")
                .arg(&old)
                .arg("PX")
                .arg(ttl);
            let written: Option<String> = self.send(key, &cmd, None, true).await?;
            if written.is_none() {
                return Ok(None);
            }
            self.remember(&full, version, record.state, &value);
            return Ok(Some(version));
        }
        let mut cmd = evalsha(&REPLACE, full.as_bytes());
        cmd.arg(expected_version).arg(now_ms).arg(ttl).arg(&value);
        let reply: Value = self.send(key, &cmd, Some(&REPLACE), true).await?;
        match number(&reply) {
            Some(1) => {
                self.remember(&full, version, record.state, &value);
                Ok(Some(version))
            }
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
        self.forget(&full);
        let removed = match expected_version {
            None => {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(&full);
                self.send(key, &cmd, None, false).await?
            }
            Some(v) => {
                let mut cmd = evalsha(&DELETE_AT, full.as_bytes());
                cmd.arg(v);
                let reply: Value = self.send(key, &cmd, Some(&DELETE_AT), false).await?;
                number(&reply).unwrap_or(0)
            }
        };
        Ok(removed > 0)
    }

    /// Scans the keys under the prefix (up to [`LIST_SCAN_MAX`]; on a
    /// cluster, on each primary), sorts them and reads the page: an
    /// operator's tool, O(keys under the prefix).
    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let pattern = glob_prefix(&self.full_key(&query.prefix));
        let mut keys: Vec<String> = Vec::new();
        for node in self.scan_nodes().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch) = self
                    .scan_page(node.as_ref(), cursor, &pattern, 1000)
                    .await?;
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
        }
        keys.sort_unstable();
        keys.dedup(); // SCAN may return a key twice.
        let mut rows = Vec::new();
        for chunk in keys.chunks(query.limit.clamp(1, 1000)) {
            // One `GET` per key, all sent at once: the connection pipelines
            // them, and on a cluster each goes to its own node.
            let values = futures_util::future::join_all(chunk.iter().map(|key| async move {
                let mut cmd = redis::cmd("GET");
                cmd.arg(self.full_key(key));
                self.send::<Option<Vec<u8>>>(key, &cmd, None, false).await
            }))
            .await;
            for (key, value) in chunk.iter().zip(values) {
                if let Some(value) = value?
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
        let mut purged = 0usize;
        for node in self.scan_nodes().await? {
            let mut cursor = 0u64;
            while purged < limit {
                let (next, batch) = self.scan_page(node.as_ref(), cursor, &pattern, 500).await?;
                if self.is_cluster() {
                    // Keys of different slots cannot meet in one script: one
                    // call per key, all sent at once.
                    for chunk in batch.chunks(limit - purged) {
                        let counts = futures_util::future::join_all(
                            chunk
                                .iter()
                                .map(|key| self.purge_keys(std::slice::from_ref(key), now_ms, 1)),
                        )
                        .await;
                        for n in counts {
                            purged += n?;
                        }
                        if purged >= limit {
                            break;
                        }
                    }
                } else if !batch.is_empty() {
                    purged += self.purge_keys(&batch, now_ms, limit - purged).await?;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(purged)
    }
}

impl RedisStore {
    /// Deletes at most `limit` of `keys` whose records expired by `now_ms`.
    async fn purge_keys(
        &self,
        keys: &[Vec<u8>],
        now_ms: u64,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(PURGE.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_slice());
        }
        cmd.arg(now_ms).arg(limit);
        let reply: Value = self.send(&self.prefix, &cmd, Some(&PURGE), false).await?;
        Ok(number(&reply)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0))
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

    /// Values as this layout has always written them: whatever the code
    /// becomes, a record stored before must still decode, and be written
    /// again byte for byte.
    #[test]
    fn stored_bytes_still_decode() {
        let done = b"7 90000\n\0\0\0\0\0\0\x03\xe8\x01\0\0\0\x05fp-\xc3\xbc\x01\0\xc9\
            \0\0\0\x02\0\0\0\x0ccontent-type\0\0\0\ntext/plain\0\0\0\x01x\0\0\0\x02\0\xff\
            \0\0\0\x04paid";
        let record = Record {
            fingerprint: "fp-ü".into(),
            state: State::Done,
            lease_until_ms: 1_000,
            expires_at_ms: 90_000,
            response: Some(Response {
                status: 201,
                headers: vec![
                    ("content-type".to_owned(), b"text/plain".to_vec()),
                    ("x".to_owned(), vec![0, 255]),
                ],
                body: b"paid".to_vec(),
            }),
        };
        let processing = b"1 18446744073709551615\n\0\0\0\0\0\0\x01\xf4\0\0\0\0\x02fp\0";
        let claim = Record {
            fingerprint: "fp".into(),
            state: State::Processing,
            lease_until_ms: 500,
            expires_at_ms: u64::MAX,
            response: None,
        };
        for (bytes, version, record) in [(&done[..], 7, record), (&processing[..], 1, claim)] {
            assert_eq!(encode(version, &record), bytes);
            assert_eq!(decode("k", bytes).unwrap(), Entry { record, version });
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
    fn cluster_urls_name_every_node_with_the_same_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://:pw@a:7000,b:7001/0?protocol=resp3").unwrap(),
            Some(vec![
                "redis://:pw@a:7000?protocol=resp3".to_owned(),
                "redis://:pw@b:7001?protocol=resp3".to_owned(),
            ])
        );
        assert_eq!(cluster_nodes("redis://a:6379/2").unwrap(), None);
        let err = cluster_nodes("redis+cluster://a:7000/3").unwrap_err();
        assert!(err.contains("database 0 only"), "{err}");
        assert!(cluster_nodes("redis+cluster://a:7000,,b:7001").is_err());
    }

    #[test]
    fn cluster_scans_visit_the_live_primaries_with_slots() {
        let nodes = "\
a1 127.0.0.1:7004@17004 slave a0 0 1 5 connected
a0 127.0.0.1:7000@17000 myself,master - 0 1 1 connected 0-5460
b0 10.0.0.2:7001@17001,host-b master - 0 1 2 connected 5461-10922
c0 127.0.0.1:7002@17002 master,fail - 0 1 3 disconnected 10923-16383
d0 127.0.0.1:7003@17003 master - 0 1 4 connected
";
        assert_eq!(
            cluster_primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 7000),
                ("10.0.0.2".to_owned(), 7001)
            ]
        );
    }

    #[test]
    fn glob_characters_in_prefixes_are_escaped() {
        assert_eq!(glob_prefix(r"a*b?[c]\"), r"a\*b\?\[c\]\\*");
    }
}
