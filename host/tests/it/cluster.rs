//! Beyond one Redis server: the native compare-and-set on Valkey 8.1, `wait=N`
//! failing closed, and a failover of a Redis Cluster measured — how many keys
//! end up with two winners when a primary dies before its replica has a
//! claim, without `wait` and with it.
//!
//! Valkey comes from `IDEM_TEST_VALKEY_URL`; the failover tests start (and
//! kill) loopback clusters of their own with the `redis-server` binary named
//! by `IDEM_TEST_REDIS_SERVER`. Without them each test prints why it skipped;
//! `scripts/test-all.sh` sets them all.

use crate::conformance::{BASE_MS, claimed, record};
use crate::netstores::{claim_is_one_round_trip, host_port, via};
use crate::proxy::Proxy;
use idem::State;
use idem::store::{InsertOutcome, RedisStore, Store, StoreError};
use idem_harness::{server_url, unique};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn valkey_completes_by_native_compare_and_set_in_one_round_trip() {
    let Some(url) = server_url("IDEM_TEST_VALKEY_URL") else {
        return;
    };
    let proxy = Proxy::start(&host_port(&url, 6379)).await;
    let store = RedisStore::open(&via(&url, proxy.addr)).await.unwrap();
    assert!(store.native_cas(), "Valkey 8.1 has SET … IFEQ");
    claim_is_one_round_trip(Arc::new(store), &proxy).await;
    let scripted = RedisStore::open(&format!("{url}?cas=script"))
        .await
        .unwrap();
    assert!(!scripted.native_cas(), "cas=script turns it off");
}

#[tokio::test]
async fn redis_7_completes_by_script() {
    let Some(url) = server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let store = RedisStore::open(&url).await.unwrap();
    assert!(!store.native_cas(), "Redis 7.0 has no SET … IFEQ");
}

/// A lone server has no replica to acknowledge: with `wait=1` the claim fails
/// closed, naming why, and the guard never runs the handler.
#[tokio::test]
async fn wait_fails_closed_when_no_replica_acknowledges() {
    let Some(url) = server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let store = RedisStore::open(&format!("{url}?wait=1&wait_ms=20"))
        .await
        .unwrap();
    let claim = claimed(BASE_MS + 1_000, BASE_MS + 10_000);
    match store.insert(&unique("wait"), claim, BASE_MS).await {
        Err(StoreError::Unavailable { reason, .. }) => {
            assert!(reason.contains("0 of the 1 replicas"), "{reason}");
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

/// A loopback Redis Cluster of 3 primaries and 3 replicas this test owns:
/// started by `scripts/redis-cluster.sh` with a 1 s node timeout and
/// replicas that may always take over, every node killed when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
}

impl Cluster {
    /// Started on ports nothing listens on; tried again on other ports (at
    /// most 3 times) when a node could not bind, as when another process
    /// took a port between the check and the start.
    fn start(server: &str) -> Cluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start(server) {
                Ok(cluster) => return cluster,
                Err(why) => failures.push(why),
            }
        }
        panic!("the loopback cluster did not start: {failures:#?}");
    }

    fn try_start(server: &str) -> Result<Cluster, String> {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(6);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/redis-cluster.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg(dir.path())
            .args(ports.iter().map(u16::to_string))
            .env("REDIS_SERVER", server)
            .env("NODE_TIMEOUT_MS", "1000")
            .env("REDIS_ARGS", "--cluster-replica-validity-factor 0")
            .output()
            .expect("run scripts/redis-cluster.sh");
        // Dropped on failure too: the nodes that did start are killed.
        let cluster = Cluster { dir, ports };
        if out.status.success() {
            Ok(cluster)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn pid(&self, port: u16) -> String {
        let file: PathBuf = self.dir.path().join(port.to_string()).join("pid");
        std::fs::read_to_string(file).unwrap().trim().to_owned()
    }

    fn signal(&self, port: u16, signal: &str) {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.pid(port))
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} of the node on {port}");
    }

    fn cli(port: u16, args: &[&str]) -> String {
        redis_cli(port, args)
    }

    /// The port of the primary serving slot 0, and of its replica.
    fn primary_and_replica(&self) -> (u16, u16) {
        let nodes = Self::cli(self.ports[0], &["cluster", "nodes"]);
        let lines: Vec<Vec<&str>> = nodes
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let port = |fields: &[&str]| -> u16 {
            let address = fields[1].split('@').next().unwrap();
            address.rsplit_once(':').unwrap().1.parse().unwrap()
        };
        let primary = lines
            .iter()
            .find(|f| f.len() > 8 && f[8..].iter().any(|s| s.starts_with("0-")))
            .expect("a primary serves slot 0");
        let replica = lines
            .iter()
            .find(|f| f[2].contains("slave") && f[3] == primary[0])
            .expect("the primary has a replica");
        (port(primary), port(replica))
    }

    /// Polls until `done` holds (the cluster reaching a state), or panics
    /// naming `what` after a minute.
    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for &port in &self.ports {
            // A node that never started has no pid file: nothing to kill (and
            // no panic here, which would abort a test that is failing already).
            let file = self.dir.path().join(port.to_string()).join("pid");
            let Ok(pid) = std::fs::read_to_string(file) else {
                continue;
            };
            for signal in ["-CONT", "-KILL"] {
                let _ = Command::new("kill").args([signal, pid.trim()]).status();
            }
        }
    }
}

/// What `redis-cli` prints for `args` against the server at 127.0.0.1:`port`.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `n` ports on 127.0.0.1, each with its cluster bus port (+10000), that
/// nothing listens on now. All below 32768, where Linux's ephemeral range
/// starts, so no outgoing connection of a concurrent test takes one.
fn free_ports(n: u16) -> Vec<u16> {
    loop {
        let base = 10_000 + fastrand::u16(..12_000);
        let ports: Vec<u16> = (base..base + n).collect();
        let free = ports.iter().all(|&p| {
            std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
                && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        });
        if free {
            return ports;
        }
    }
}

/// What a failover did to the claims acknowledged before it.
#[derive(Debug)]
struct Failover {
    /// Claims won while the replica kept up.
    won_replicated: usize,
    /// Claims won while the replica was cut off.
    won_unreplicated: usize,
    /// Of those two, the keys a second caller won again after the failover.
    double_replicated: usize,
    double_unreplicated: usize,
}

/// Claims every key once, 32 at a time; returns the keys won.
async fn claim_all(store: &RedisStore, keys: &[String]) -> Vec<String> {
    let claim = record(
        "first",
        State::Processing,
        BASE_MS + 600_000,
        BASE_MS + 900_000,
    );
    let mut won = Vec::new();
    for chunk in keys.chunks(32) {
        let outcomes = futures::future::join_all(
            chunk
                .iter()
                .map(|key| store.insert(key, claim.clone(), BASE_MS)),
        )
        .await;
        for (key, outcome) in chunk.iter().zip(outcomes) {
            if let Ok(InsertOutcome::Inserted(_)) = outcome {
                won.push(key.clone());
            }
        }
    }
    won
}

/// Of `keys`, those a second caller wins after the failover (retrying each
/// until the cluster answers for its slot again).
async fn claimed_again(store: &RedisStore, keys: &[String]) -> usize {
    let claim = record(
        "second",
        State::Processing,
        BASE_MS + 600_000,
        BASE_MS + 900_000,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut again = 0;
    for key in keys {
        loop {
            match store.insert(key, claim.clone(), BASE_MS + 1).await {
                Ok(InsertOutcome::Inserted(_)) => again += 1,
                Ok(InsertOutcome::Existing(_)) => {}
                Err(e) => {
                    assert!(Instant::now() < deadline, "the cluster never answered: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
            break;
        }
    }
    again
}

/// Claims under load on the primary of slot 0 while its replica keeps up;
/// then the replica falls behind (stopped, its link cut) and more claims
/// come; then the primary is killed (`kill -9`), the replica resumes and is
/// promoted, and a second caller claims every key again. The replica had
/// claims when it fell behind, or the run shows nothing.
async fn fail_over(wait: &str) -> Option<Failover> {
    let server = server_url("IDEM_TEST_REDIS_SERVER")?;
    let cluster = Cluster::start(&server);
    let (primary, replica) = cluster.primary_and_replica();
    // Keys on the primary's slot 0: the hash tag `{3560}` hashes to it.
    assert_eq!(
        Cluster::cli(primary, &["cluster", "keyslot", "{3560}"]).trim(),
        "0"
    );
    let keys = |phase: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("{{3560}}{phase}-{i}")).collect()
    };
    let url = format!(
        "redis+cluster://127.0.0.1:{primary},127.0.0.1:{}?prefix=&timeout_ms=2000",
        cluster.ports[1]
    );
    let store = RedisStore::open(&format!("{url}{wait}")).await.unwrap();
    // The second caller does not wait: after the failover the promoted
    // replica has no replica of its own, and with `wait` every claim would
    // fail closed. It counts which first claims survived.
    let second = RedisStore::open(&url).await.unwrap();

    let won_replicated = claim_all(&store, &keys("replicated", 2_000)).await;
    let offset = |port: u16, field: &str| -> Option<u64> {
        Cluster::cli(port, &["info", "replication"])
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
    };
    Cluster::until("the replica has every claim so far", || {
        offset(primary, "master_repl_offset:") == offset(replica, "slave_repl_offset:")
    });
    cluster.signal(replica, "-STOP");
    let cut = Cluster::cli(primary, &["client", "kill", "type", "replica"]);
    assert_eq!(cut.trim(), "1", "the replica's link is cut");
    let won_unreplicated = claim_all(&store, &keys("unreplicated", 200)).await;

    cluster.signal(primary, "-KILL");
    cluster.signal(replica, "-CONT");
    let other = cluster
        .ports
        .iter()
        .copied()
        .find(|&p| p != primary && p != replica);
    let other = other.expect("a third node");
    Cluster::until("the replica is promoted and the cluster ok", || {
        Cluster::cli(replica, &["role"]).starts_with("master")
            && Cluster::cli(other, &["cluster", "info"]).contains("cluster_state:ok")
    });
    let f = Failover {
        double_replicated: claimed_again(&second, &won_replicated).await,
        double_unreplicated: claimed_again(&second, &won_unreplicated).await,
        won_replicated: won_replicated.len(),
        won_unreplicated: won_unreplicated.len(),
    };
    eprintln!("failover with options {wait:?}: {f:?}");
    assert!(f.won_replicated > 0, "{f:?}");
    Some(f)
}

/// Without `wait`, every claim only the dead primary had is lost: a second
/// caller wins each of those keys too. The claims the replica had survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_without_wait_gives_keys_two_winners() {
    let Some(f) = fail_over("").await else {
        return;
    };
    assert_eq!(f.double_replicated, 0, "replicated claims survive: {f:?}");
    assert!(f.won_unreplicated > 0, "{f:?}");
    assert_eq!(
        f.double_unreplicated, f.won_unreplicated,
        "every claim the primary alone acknowledged was lost: {f:?}"
    );
}

/// With `wait=1` a claim no replica acknowledged fails closed, so nothing
/// ran on it, and no key has two winners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_wait_gives_no_key_two_winners() {
    let Some(f) = fail_over("&wait=1&wait_ms=50").await else {
        return;
    };
    assert_eq!(
        f.won_unreplicated, 0,
        "unacknowledged claims fail closed: {f:?}"
    );
    assert_eq!(f.double_replicated + f.double_unreplicated, 0, "{f:?}");
}
