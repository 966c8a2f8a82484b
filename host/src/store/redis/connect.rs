//! The connections to a server or a cluster, and sending a command on them
//! within the timeout.

use super::conn::{Address, Failure, Server};
use super::resp::{Command, Reply};
use super::scripts::{CLAIM_EXPIRED, DELETE_AT, PURGE, REPLACE, Script, TIME, evalsha};
use super::{NAME, RedisStore, wrong_type};
use crate::clock::SyncedClock;
use crate::store::codec::{driver_failed, unavailable};
use crate::store::params::StoreUrl;
use crate::store::{OpenError, Result};
use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, ProtocolVersion, RedisError, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One connection: to a lone server (this module's own client, see
/// [`super::conn`]), or to a cluster (the `redis` crate's: a connection
/// per node, each command sent to the node that holds its key's slot,
/// following slots as they move). Either pipelines the commands of
/// concurrent callers.
#[derive(Clone)]
pub(super) enum Conn {
    Server(Arc<Server>),
    Cluster(ClusterConnection),
}

/// Why commands got no reply.
pub(super) enum Failed {
    Server(Failure),
    Cluster(RedisError),
}

impl Conn {
    /// Sends `commands` in one pipeline and returns their replies in order;
    /// a server's refusal is a [`Reply::Error`], not a failure. On a
    /// cluster, a refused connection means the commands never left this
    /// process, so they are tried once more: that try waits for the
    /// reconnection the refusal started.
    pub(super) async fn ask<const N: usize>(
        &self,
        commands: [&Command; N],
    ) -> Result<[Reply; N], Failed> {
        match self {
            Conn::Server(server) => server.ask(commands).await.map_err(Failed::Server),
            Conn::Cluster(conn) => {
                let once = async || {
                    let mut conn = conn.clone();
                    if N == 1 {
                        let cmd = driver_cmd(commands[0]);
                        conn.req_packed_command(&cmd).await.map(|v| vec![v])
                    } else {
                        let mut pipe = redis::pipe();
                        for command in commands {
                            pipe.add_command(driver_cmd(command));
                        }
                        conn.req_packed_commands(&pipe, 0, N).await
                    }
                };
                let values = match once().await {
                    Err(e) if e.is_connection_refusal() => once().await,
                    done => done,
                };
                let mut values = match values {
                    Ok(values) if values.len() == N => values.into_iter(),
                    Ok(_) => {
                        let e = RedisError::from((redis::ErrorKind::Client, "replies miscounted"));
                        return Err(Failed::Cluster(e));
                    }
                    // The server refused the command: a reply like any other.
                    Err(e) if e.code().is_some() => {
                        let text = format!(
                            "{} {}",
                            e.code().unwrap_or_default(),
                            e.detail().unwrap_or_default()
                        );
                        let mut replies = [const { Reply::Nil }; N];
                        replies[0] = Reply::Error(Bytes::from(text));
                        return Ok(replies);
                    }
                    Err(e) => return Err(Failed::Cluster(e)),
                };
                Ok(std::array::from_fn(|_| {
                    reply_of(values.next().unwrap_or_default())
                }))
            }
        }
    }
}

/// The `redis` crate's command for ours.
pub(super) fn driver_cmd(command: &Command) -> redis::Cmd {
    let mut args = command.args();
    let mut cmd = redis::cmd(&String::from_utf8_lossy(args.next().unwrap_or_default()));
    for arg in args {
        cmd.arg(arg);
    }
    cmd
}

/// The `redis` crate's reply as ours.
pub(super) fn reply_of(value: Value) -> Reply {
    let text = |s: String| Reply::Bulk(Bytes::from(s));
    let all = |items: Vec<Value>| Reply::Array(items.into_iter().map(reply_of).collect());
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(b) => Reply::Bulk(Bytes::from(b)),
        Value::SimpleString(s) => Reply::Status(Bytes::from(s)),
        Value::Okay => Reply::Status(Bytes::from_static(b"OK")),
        Value::Array(items) | Value::Set(items) => all(items),
        Value::Map(pairs) => all(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
        Value::Attribute { data, .. } => reply_of(*data),
        Value::Double(d) => text(d.to_string()),
        Value::Boolean(b) => Reply::Int(i64::from(b)),
        Value::VerbatimString { text: t, .. } => text(t),
        Value::BigNumber(n) => Reply::Bulk(Bytes::from(n)),
        Value::Push { data, .. } => all(data),
        Value::ServerError(e) => Reply::Error(Bytes::from(format!(
            "{} {}",
            e.code(),
            e.details().unwrap_or_default()
        ))),
        other => text(format!("{other:?}")),
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
                        // Few, quick retries, each operation bounded by
                        // `timeout` as a whole. A retry is what follows a
                        // slot that moved (`MOVED`) or a primary that
                        // failed over.
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
                    let (address, setup) = server_setup(&url.driver).map_err(bad_url)?;
                    for _ in 0..connections {
                        let server = Arc::new(Server::new(address.clone(), setup.clone()));
                        // Connected now, so that an unreachable server
                        // fails the open.
                        server
                            .ask([&Command::new("PING")])
                            .await
                            .map_err(|f| unreachable(f.reason().to_owned()))?;
                        conns.push(Conn::Server(server));
                    }
                }
            }
            // Loaded now so that the first claim is one round trip too (on a
            // cluster, `SCRIPT LOAD` goes to every node).
            for script in [&*CLAIM_EXPIRED, &*REPLACE, &*DELETE_AT, &*PURGE, &*TIME] {
                load(&conns[0], script).await.map_err(unreachable)?;
            }
            let native = native_cas && has_ifeq(&conns[0], &prefix).await.map_err(unreachable)?;
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
        let syncing = clock
            .start_syncing(
                clock_sync,
                (conns[0].clone(), clock_key, timeout),
                server_time,
            )
            .await
            .map_err(unreachable)?;
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

    /// The connection the next operation takes.
    pub(super) fn turn(&self) -> (usize, &Conn) {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        (turn, &self.conns[turn])
    }

    /// Runs `attempt`, one operation on the connection `turn`, within the
    /// timeout.
    pub(super) async fn bounded<T>(
        &self,
        turn: usize,
        attempt: impl Future<Output = Result<T, Failed>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(Failed::Server(failure))) => Err(unavailable(NAME, failure.reason())),
            Ok(Err(Failed::Cluster(e))) => {
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

    /// One cluster connection found a node gone. A `PING` on each of the
    /// others makes a dead one notice now and start reconnecting, so that
    /// once the node is back the first operation on any connection goes
    /// through (by the retry of a refusal) instead of failing on a socket
    /// that died unnoticed. (A lone server's connections each notice by
    /// themselves: each has a reader on its socket.)
    async fn wake_others(&self, failed: usize) {
        let ping = Command::new("PING");
        for (i, conn) in self.conns.iter().enumerate() {
            if i != failed {
                let _ = tokio::time::timeout(self.timeout, conn.ask([&ping])).await;
            }
        }
    }

    /// Sends `cmd`, which reads or writes `key` alone, and returns its
    /// reply; a refusal by the server fails it (`WRONGTYPE` as a corrupt
    /// record). When it runs `script` and the server does not have it
    /// (restarted, or a replica promoted since), loads it and sends `cmd`
    /// again. When `write` and the URL asks for `wait=N`, `WAIT N wait_ms`
    /// follows in the same pipeline, on the same connection to the same
    /// node, and fewer than N replicas acknowledging fails the operation as
    /// unavailable.
    pub(super) async fn send(
        &self,
        key: &str,
        cmd: &Command,
        script: Option<&Script>,
        write: bool,
    ) -> Result<Reply> {
        let wait = self.wait;
        let wait_cmd = (write && wait.replicas > 0).then(|| {
            let mut cmd = Command::new("WAIT");
            cmd.arg(wait.replicas).arg(wait.ms);
            cmd
        });
        let (turn, conn) = self.turn();
        let attempt = async {
            let mut loaded = false;
            loop {
                let (reply, acked) = match &wait_cmd {
                    None => {
                        let [reply] = conn.ask([cmd]).await?;
                        (reply, None)
                    }
                    Some(wait_cmd) => {
                        let [reply, acked] = conn.ask([cmd, wait_cmd]).await?;
                        (reply, Some(acked))
                    }
                };
                match script {
                    Some(script) if !loaded && reply.error_code() == Some(b"NOSCRIPT") => {
                        loaded = true;
                        let [_] = conn.ask([&script.load()]).await?;
                    }
                    _ => return Ok((reply, acked)),
                }
            }
        };
        let (reply, acked) = self.bounded(turn, attempt).await?;
        refused(key, &reply)?;
        if let Some(acked) = acked {
            refused(key, &acked)?;
            match acked.number() {
                Some(n) if u64::try_from(n).is_ok_and(|n| n >= wait.replicas) => {}
                _ => {
                    return Err(unavailable(
                        NAME,
                        format!(
                            "the write reached {} of the {} replicas wait= asks for within {} ms; failing closed",
                            acked.number().unwrap_or(0),
                            wait.replicas,
                            wait.ms
                        ),
                    ));
                }
            }
        }
        Ok(reply)
    }
}

/// A reply the server refused with: `WRONGTYPE` is a key that holds no
/// record; anything else leaves the store unavailable.
fn refused(key: &str, reply: &Reply) -> Result<()> {
    match reply {
        Reply::Error(_) if reply.error_code() == Some(b"WRONGTYPE") => Err(wrong_type(key)),
        Reply::Error(message) => Err(unavailable(NAME, String::from_utf8_lossy(message))),
        _ => Ok(()),
    }
}

/// Loads `script` on `conn` (on a cluster, on every primary).
async fn load(conn: &Conn, script: &Script) -> Result<(), String> {
    match conn.ask([&script.load()]).await {
        Ok([Reply::Error(e)]) => Err(String::from_utf8_lossy(&e).into_owned()),
        Ok(_) => Ok(()),
        Err(failed) => Err(failed.to_string()),
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Server(failure) => f.write_str(failure.reason()),
            Failed::Cluster(e) => e.fmt(f),
        }
    }
}

/// The server's time in milliseconds since the Unix epoch: `time.lua` on
/// `key`, within `timeout`.
async fn server_time((conn, key, timeout): (Conn, String, Duration)) -> Result<u64, String> {
    let cmd = evalsha(&TIME, key.as_bytes(), 0);
    let ask = async {
        let mut reply = ask_one(&conn, &cmd).await?;
        if reply.error_code() == Some(b"NOSCRIPT") {
            load(&conn, &TIME).await?;
            reply = ask_one(&conn, &cmd).await?;
        }
        match &reply {
            Reply::Array(parts) => match parts.as_slice() {
                [seconds, micros] => {
                    let n = |r: &Reply| r.number().and_then(|n| u64::try_from(n).ok());
                    n(seconds)
                        .zip(n(micros))
                        .ok_or_else(|| format!("TIME answered {reply:?}"))
                }
                _ => Err(format!("TIME answered {reply:?}")),
            },
            Reply::Error(e) => Err(String::from_utf8_lossy(e).into_owned()),
            _ => Err(format!("TIME answered {reply:?}")),
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok((seconds, micros))) => Ok(time_ms(seconds, micros)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

async fn ask_one(conn: &Conn, cmd: &Command) -> Result<Reply, String> {
    conn.ask([cmd])
        .await
        .map(|[reply]| reply)
        .map_err(|e| e.to_string())
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
async fn has_ifeq(conn: &Conn, prefix: &str) -> Result<bool, String> {
    let mut cmd = Command::new("SET");
    cmd.arg(format!("{prefix}\u{1}ifeq-probe"))
        .arg("probe")
        .arg("IFEQ")
        .arg("probe");
    match ask_one(conn, &cmd).await? {
        Reply::Error(e) if e.starts_with(b"ERR") => Ok(false),
        Reply::Error(e) => Err(String::from_utf8_lossy(&e).into_owned()),
        _ => Ok(true),
    }
}

/// Where a lone server's URL points, and the commands each new connection
/// starts with: `HELLO 3` (with `protocol=resp3`), the credentials, the
/// database. The URL is read as the `redis` crate reads it.
fn server_setup(driver_url: &str) -> Result<(Address, Vec<Command>), String> {
    let client = redis::Client::open(driver_url).map_err(|e| e.to_string())?;
    let info = client.get_connection_info();
    let address = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Address::Tcp(host.clone(), *port),
        ConnectionAddr::Unix(path) => Address::Unix(path.clone()),
        other => return Err(format!("{other} is not supported: TLS is not built in")),
    };
    let settings = info.redis_settings();
    let mut setup = Vec::new();
    let password = settings.password();
    if settings.protocol() == ProtocolVersion::RESP3 {
        let mut hello = Command::new("HELLO");
        hello.arg("3");
        if let Some(password) = password {
            hello
                .arg("AUTH")
                .arg(settings.username().unwrap_or("default"))
                .arg(password);
        }
        setup.push(hello);
    } else if let Some(password) = password {
        let mut auth = Command::new("AUTH");
        if let Some(username) = settings.username() {
            auth.arg(username);
        }
        auth.arg(password);
        setup.push(auth);
    }
    if settings.db() != 0 {
        let mut select = Command::new("SELECT");
        select.arg(settings.db().to_string());
        setup.push(select);
    }
    Ok((address, setup))
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
