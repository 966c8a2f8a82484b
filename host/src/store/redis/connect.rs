//! The connections to a server or a cluster, and sending a command on them
//! within the timeout.

use super::scripts::{CLAIM_EXPIRED, DELETE_AT, PURGE, REPLACE, TIME, evalsha};
use super::{NAME, RedisStore, wrong_type};
use crate::clock::SyncedClock;
use crate::store::codec::{driver_failed, unavailable};
use crate::store::params::StoreUrl;
use crate::store::{OpenError, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, Script, ServerErrorKind, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One multiplexed connection: to a lone server, or to a cluster (a
/// connection per node, each command sent to the node that holds its key's
/// slot). Either pipelines the commands of concurrent callers.
#[derive(Clone)]
pub(super) enum Conn {
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
pub(super) struct Wait {
    pub(super) replicas: u64,
    pub(super) ms: u64,
}

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
                "clock_sync_ms",
            ],
        )?;
        let clock_sync = url.clock_sync()?;
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
            for script in [&*CLAIM_EXPIRED, &*REPLACE, &*DELETE_AT, &*PURGE, &*TIME] {
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
        let conns: Arc<[Conn]> = conns.into();
        // The time authority: the server's clock, read once now (a store
        // whose clock is unknown fails every guard call closed) and every
        // second after.
        let clock = SyncedClock::new(if cluster.is_some() {
            "the Redis Cluster's clock (TIME on the node of the prefix's clock key)"
        } else {
            "the Redis server's clock (TIME)"
        });
        let clock_key = format!("{prefix}\u{1}clock");
        let read = {
            let (conns, key) = (conns.clone(), clock_key);
            move || server_time(conns[0].clone(), key.clone(), timeout)
        };
        let syncing = Arc::new(
            clock
                .start_syncing(clock_sync, read)
                .await
                .map_err(unreachable)?,
        );
        Ok(RedisStore {
            conns,
            next: Arc::new(AtomicUsize::new(0)),
            prefix,
            timeout,
            grace_ms,
            wait,
            seen: native.then(Default::default),
            purge: Arc::default(),
            clock,
            _syncing: syncing,
        })
    }

    /// Runs one operation within the timeout. A refused connection means the
    /// command never left this process, so it is tried once more: that try
    /// waits for the reconnection the refusal started, which is what makes
    /// the first operation after the server comes back succeed.
    pub(super) async fn call<T, Fut>(&self, key: &str, op: impl Fn(Conn) -> Fut) -> Result<T>
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
                Err(driver_failed(NAME, e))
            }
            Err(_) => Err(unavailable(
                NAME,
                format!("no answer within {} ms", self.timeout.as_millis()),
            )),
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
    pub(super) async fn send<T: FromRedisValue>(
        &self,
        key: &str,
        cmd: &Cmd,
        script: Option<&Script>,
        write: bool,
    ) -> Result<T> {
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
            Some(acked) if acked < wait.replicas => Err(unavailable(
                NAME,
                format!(
                    "the write reached {acked} of the {} replicas wait= asks for within {} ms; failing closed",
                    wait.replicas, wait.ms
                ),
            )),
            _ => Ok(value),
        }
    }
}

/// The server's time in milliseconds since the Unix epoch: `time.lua` on
/// `key`, within `timeout`.
async fn server_time(mut conn: Conn, key: String, timeout: Duration) -> Result<u64, String> {
    let cmd = evalsha(&TIME, key.as_bytes());
    let ask = async {
        match cmd.query_async::<(u64, u64)>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                TIME.load_async(&mut conn).await?;
                cmd.query_async::<(u64, u64)>(&mut conn).await
            }
            done => done,
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok((seconds, micros))) => Ok(time_ms(seconds, micros)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// `TIME`'s reply in milliseconds since the Unix epoch.
fn time_ms(seconds: u64, micros: u64) -> u64 {
    seconds.saturating_mul(1_000).saturating_add(micros / 1_000)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout's vectors (`wit/store-layout/vectors.json`, `time`).
    #[test]
    fn time_replies_read_as_the_layout_says() {
        let text = include_str!("../../../../wit/store-layout/vectors.json");
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        let cases = doc["time"]["redis_time"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let n = |v: &serde_json::Value| v.as_str().unwrap().parse::<u64>().unwrap();
            let reply = case["reply"].as_array().unwrap();
            assert_eq!(
                time_ms(n(&reply[0]), n(&reply[1])),
                n(&case["ms"]),
                "{case}"
            );
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
}
