//! What the network stores promise beyond the conformance suite: a claim is
//! one round trip, an unreachable server fails closed and the same store
//! works again when it is back, undecodable bytes are `Corrupt` naming the
//! key, and opening an unreachable server says which store and URL.
//!
//! Servers come from `IDEM_TEST_REDIS_URL` and `IDEM_TEST_POSTGRES_URL`;
//! without them each test prints why it skipped.

use crate::conformance::{
    BASE_MS, claimed, counting, done, guard_at_base, paid, put, record, under,
};
use crate::proxy::Proxy;
use idem::store::{InsertOutcome, Store, StoreError};
use idem::{Outcome, Record, State};
use idem_harness::{server_url, unique};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `url` with its `host:port` replaced by `addr`.
pub fn via(url: &str, addr: std::net::SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    // The store reads its server's clock once as it opens, and (for the
    // tests that count round trips through the proxy) not again.
    let sync = if tail.contains('?') { "&" } else { "?" };
    format!("{scheme}://{userinfo}{addr}{tail}{sync}clock_sync_ms=3600000")
}

/// The `host:port` a URL names.
pub fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").unwrap().1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}

/// A port nothing listens on.
pub async fn closed_port() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A claim, the refusal's read, a completion and a replay: each one round trip.
pub async fn claim_is_one_round_trip(store: Arc<dyn Store>, proxy: &Proxy) {
    let now = BASE_MS;
    // Warm: connections made and statements or scripts prepared.
    put(
        &store,
        &unique("warm"),
        claimed(now + 1_000, now + 10_000),
        now,
    )
    .await;
    proxy.take_round_trips();

    let key = unique("rt");
    let claim = claimed(now + 1_000, now + 10_000);
    assert_eq!(
        store.insert(&key, claim.clone(), now).await.unwrap(),
        InsertOutcome::Inserted(1)
    );
    assert_eq!(proxy.take_round_trips(), 1, "a claim of an absent key");
    assert!(matches!(
        store.insert(&key, claim, now).await.unwrap(),
        InsertOutcome::Existing(_)
    ));
    assert_eq!(
        proxy.take_round_trips(),
        1,
        "a refused claim returns the live record in the same round trip"
    );
    let replaced = store.replace(&key, 1, done(now + 10_000), now);
    assert!(replaced.await.unwrap(), "at the claim's version");
    assert_eq!(proxy.take_round_trips(), 1, "a completion");
    assert!(store.get(&key, now).await.unwrap().is_some());
    assert_eq!(proxy.take_round_trips(), 1, "a read");
}

/// Through a proxy that is cut and restored: Unavailable while cut and the
/// handler never runs; then the same store object works again.
pub async fn fails_closed_when_cut_and_recovers(store: Arc<dyn Store>, proxy: &Proxy) {
    let guard = guard_at_base(store.clone());
    let calls = AtomicUsize::new(0);
    let (done, later) = (unique("before-cut"), unique("during-cut"));
    assert!(matches!(
        guard.run(&done, "fp", counting(&calls)).await.unwrap(),
        Outcome::Executed(_)
    ));

    proxy.cut();
    for key in [&later, &done] {
        let outcome = guard.run(key, "fp", counting(&calls)).await.unwrap();
        assert!(
            matches!(outcome, Outcome::Unavailable(_)),
            "server gone, {key}: {outcome:?}"
        );
    }
    assert!(matches!(
        store.get(&done, BASE_MS).await,
        Err(StoreError::Unavailable { .. })
    ));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "fail closed: nothing ran while the server was gone"
    );

    proxy.restore().await;
    let outcome = guard.run(&later, "fp", counting(&calls)).await.unwrap();
    assert!(
        matches!(outcome, Outcome::Executed(_)),
        "server back: {outcome:?}"
    );
    let replay = guard.run(&done, "fp", counting(&calls)).await.unwrap();
    assert_eq!(replay, Outcome::Replayed(paid()));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Bytes that do not decode are `Corrupt` naming the key, and the guard
/// fails closed on them.
pub async fn corrupt_record_names_the_key(store: Arc<dyn Store>, key: &str) {
    for result in [
        store.get(key, BASE_MS).await.map(|_| ()),
        store
            .insert(key, claimed(BASE_MS + 1, BASE_MS + 10), BASE_MS)
            .await
            .map(|_| ()),
    ] {
        match result {
            Err(StoreError::Corrupt { key: named, .. }) => assert_eq!(named, key),
            other => panic!("expected Corrupt for {key}, got {other:?}"),
        }
    }
    let guard = guard_at_base(store);
    let calls = AtomicUsize::new(0);
    let outcome = guard.run(key, "fp", counting(&calls)).await.unwrap();
    assert!(
        matches!(&outcome, Outcome::Unavailable(why) if why.contains(key)),
        "{outcome:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Why opening `url` fails.
async fn refusal(url: &str) -> String {
    match idem::store::open(url).await {
        Ok(_) => panic!("opened {url}"),
        Err(err) => err.to_string(),
    }
}

/// Opening a server nothing answers on fails, naming the store and the URL.
#[tokio::test]
async fn open_unreachable_names_store_and_url() {
    let addr = closed_port().await;
    for (url, store) in [
        (format!("redis://{addr}/0?timeout_ms=500"), "redis"),
        (
            format!("postgres://postgres@{addr}/test?timeout_ms=500"),
            "postgres",
        ),
        (
            format!("postgresql://postgres@{addr}/test?timeout_ms=500"),
            "postgres",
        ),
        (
            format!("dynamodb://{addr}?table=idem&timeout_ms=500"),
            "dynamodb",
        ),
    ] {
        let text = refusal(&url).await;
        assert!(text.contains(store) && text.contains(&url), "{text}");
    }
}

/// A URL parameter the store cannot take is refused, naming it and why.
#[tokio::test]
async fn bad_url_parameters_are_refused() {
    for (url, why) in [
        (
            "redis://127.0.0.1:6379/0?grace_ms=soon",
            "grace_ms=\"soon\" must be a whole number",
        ),
        (
            "postgres://postgres@127.0.0.1/test?table=x;drop",
            "table=\"x;drop\" must be 1 to 48 characters",
        ),
        (
            "dynamodb://127.0.0.1:8000?table=a/b",
            "table=\"a/b\" must be 3 to 255 characters",
        ),
        (
            "dynamodb://127.0.0.1:8000?table=idem&consistent=false",
            "unknown dynamodb option \"consistent=false\"",
        ),
        (
            "dynamodb+https://?table=idem",
            "expected dynamodb://HOST:PORT",
        ),
    ] {
        let err = refusal(url).await;
        assert!(err.contains(why), "{url}: {err}");
    }
}

/// The store on the server `var` names, opened through a [`Proxy`] of its
/// own in front of that server (`default_port` when the URL names none);
/// `None` when `var` is not set.
async fn through_proxy(var: &str, default_port: u16) -> Option<(Arc<dyn Store>, Proxy)> {
    let url = server_url(var)?;
    let proxy = Proxy::start(&host_port(&url, default_port)).await;
    let store = idem::store::open(&via(&url, proxy.addr)).await.unwrap();
    Some((store, proxy))
}

/// A claim at `BASE_MS + 10` of a key whose record `old` has expired by
/// then takes the key over at version 2, in `round_trips` requests through
/// `proxy`: the key and the claim.
async fn claim_over_expired(
    store: &Arc<dyn Store>,
    proxy: &Proxy,
    old: Record,
    round_trips: u64,
) -> (String, Record) {
    let key = unique("rt-expired");
    store.insert(&key, old, BASE_MS).await.unwrap();
    proxy.take_round_trips();
    let claim = claimed(BASE_MS + 1_000, BASE_MS + 10_000);
    assert_eq!(
        store
            .insert(&key, claim.clone(), BASE_MS + 10)
            .await
            .unwrap(),
        InsertOutcome::Inserted(2)
    );
    assert_eq!(proxy.take_round_trips(), round_trips);
    (key, claim)
}

/// What every network store promises through a proxy, as tests of the
/// module that invokes it, on the store [`through_proxy`] opens.
macro_rules! proxied_tests {
    ($var:literal, $default_port:literal) => {
        #[tokio::test]
        async fn claim_is_one_round_trip() {
            if let Some((store, proxy)) = through_proxy($var, $default_port).await {
                super::claim_is_one_round_trip(store, &proxy).await;
            }
        }

        #[tokio::test]
        async fn fails_closed_when_cut_and_recovers() {
            if let Some((store, proxy)) = through_proxy($var, $default_port).await {
                super::fails_closed_when_cut_and_recovers(store, &proxy).await;
            }
        }
    };
}

mod redis {
    use super::*;
    use idem::store::RedisStore;

    fn url() -> Option<String> {
        server_url("IDEM_TEST_REDIS_URL")
    }

    /// A raw connection for the test's own commands.
    async fn raw(url: &str) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    proxied_tests!("IDEM_TEST_REDIS_URL", 6379);

    /// The one claim that takes two round trips: the key's record has expired
    /// by the guard's clock while Redis still holds it (its grace period).
    #[tokio::test]
    async fn redis_claim_of_an_expired_record_still_held_is_two_round_trips() {
        let Some((store, proxy)) = through_proxy("IDEM_TEST_REDIS_URL", 6379).await else {
            return;
        };
        let old = claimed(BASE_MS + 1, BASE_MS + 10);
        claim_over_expired(&store, &proxy, old, 2).await;
    }

    #[tokio::test]
    async fn redis_corrupt_record_names_the_key() {
        let Some(url) = url() else { return };
        let store = RedisStore::open(&url).await.unwrap();
        let mut conn = raw(&url).await;
        // A string that is not a record.
        let key = unique("garbage");
        let () = ::redis::cmd("SET")
            .arg(format!("{}{key}", store.prefix()))
            .arg("garbage")
            .query_async(&mut conn)
            .await
            .unwrap();
        corrupt_record_names_the_key(Arc::new(store.clone()), &key).await;
        // Not a string: another application's hash (or the hash layout of earlier builds).
        let key = unique("garbled");
        let full = format!("{}{key}", store.prefix());
        let () = ::redis::cmd("HSET")
            .arg(&full)
            .arg(&[
                "ver",
                "one",
                "exp",
                "99999999999999",
                "fp",
                "x",
                "state",
                "??",
                "lease",
                "0",
                "status",
                "",
                "headers",
                "",
                "body",
                "",
            ])
            .query_async(&mut conn)
            .await
            .unwrap();
        corrupt_record_names_the_key(Arc::new(store), &key).await;
    }

    /// Expiry follows the guard's clock, not the server's: a record written
    /// at a test time far in the past still lives its full remaining time
    /// (plus the grace) in Redis.
    #[tokio::test]
    async fn redis_expiry_is_relative_to_the_guards_clock() {
        let Some(url) = url() else { return };
        let store = RedisStore::open(&format!("{url}?grace_ms=1000"))
            .await
            .unwrap();
        let key = unique("ttl");
        put(
            &store,
            &key,
            claimed(BASE_MS + 1, BASE_MS + 50_000),
            BASE_MS,
        )
        .await;
        let ttl: i64 = ::redis::cmd("PTTL")
            .arg(format!("{}{key}", store.prefix()))
            .query_async(&mut raw(&url).await)
            .await
            .unwrap();
        assert!(
            (40_000..=51_000).contains(&ttl),
            "PTTL {ttl} ms; expected about 50 s remaining + 1 s grace"
        );
        // Logically expired by the guard's clock while Redis still holds it: absent.
        assert!(store.get(&key, BASE_MS + 50_000).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn redis_prefixes_keep_guards_apart() {
        let Some(url) = url() else { return };
        let (a, b) = (unique("a:"), unique("b:"));
        let store_a = RedisStore::open(&format!("{url}?prefix={a}"))
            .await
            .unwrap();
        let store_b = RedisStore::open(&format!("{url}?prefix={b}"))
            .await
            .unwrap();
        let r = claimed(BASE_MS + 1, BASE_MS + 10_000);
        assert_eq!(
            store_a.insert("k", r.clone(), BASE_MS).await.unwrap(),
            InsertOutcome::Inserted(1)
        );
        assert_eq!(
            store_b.insert("k", r.clone(), BASE_MS).await.unwrap(),
            InsertOutcome::Inserted(1)
        );
        let q = under("", 10);
        assert_eq!(store_a.list(&q, BASE_MS).await.unwrap().len(), 1);
        assert!(store_a.delete("k", Some(1), BASE_MS).await.unwrap());
        assert!(store_b.get("k", BASE_MS).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn redis_purge_frees_expired_records_only() {
        let Some(url) = url() else { return };
        let prefix = unique("purge:");
        let store = RedisStore::open(&format!("{url}?prefix={prefix}"))
            .await
            .unwrap();
        crate::conformance::purge_is_bounded_and_spares_live_records(&store).await;
    }

    /// On the lone server, the loopback cluster (a cursor per primary) and
    /// Valkey, each under a prefix of its own.
    #[tokio::test]
    async fn redis_purges_in_batches_from_where_the_last_one_stopped() {
        for var in [
            "IDEM_TEST_REDIS_URL",
            "IDEM_TEST_REDIS_CLUSTER_URL",
            "IDEM_TEST_VALKEY_URL",
        ] {
            let Some(url) = server_url(var) else { continue };
            let prefix = unique("batches:");
            let store = RedisStore::open(&format!("{url}?prefix={prefix}"))
                .await
                .unwrap();
            crate::conformance::purge_in_batches_frees_every_expired_record(&store).await;
        }
    }
}

pub(crate) mod postgres {
    use super::*;
    use deadpool_postgres::tokio_postgres::{self, NoTls};
    use idem::store::PostgresStore;

    /// The PostgreSQL test server's URL; `None` when none is configured.
    pub(crate) fn url() -> Option<String> {
        server_url("IDEM_TEST_POSTGRES_URL")
    }

    /// A raw connection for the test's own statements.
    pub(crate) async fn raw(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// The schema version `idem_schema` holds for `table`.
    async fn schema_version(client: &tokio_postgres::Client, table: &str) -> i32 {
        client
            .query_one(
                "SELECT version FROM idem_schema WHERE table_name = $1",
                &[&table],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// A table name no other test run uses.
    pub(crate) fn table() -> String {
        format!("t_{}_{}", std::process::id(), fastrand::u32(..))
    }

    /// Drops `table` and what the store made beside it.
    pub(crate) async fn drop_table(client: &tokio_postgres::Client, table: &str) {
        let t = table;
        client
            .batch_execute(&format!(
                "DROP TABLE {t}; DROP FUNCTION {t}_claim; DROP FUNCTION {t}_try_claim; \
                 DELETE FROM idem_schema WHERE table_name = '{t}'"
            ))
            .await
            .unwrap();
    }

    /// The store on the table `t` of the server at `url`.
    async fn open_table(url: &str, t: &str) -> PostgresStore {
        PostgresStore::open(&with(url, &format!("table={t}")))
            .await
            .unwrap()
    }

    pub(crate) fn with(url: &str, param: &str) -> String {
        format!("{url}{}{param}", if url.contains('?') { '&' } else { '?' })
    }

    proxied_tests!("IDEM_TEST_POSTGRES_URL", 5432);

    /// A claim that reads the key absent while another claimer's insert is
    /// not yet committed loses the race when it commits: it gets the
    /// winner's record, in a second round trip, and writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_claimer_that_loses_the_race_gets_the_winners_record() {
        let Some((store, proxy)) = through_proxy("IDEM_TEST_POSTGRES_URL", 5432).await else {
            return;
        };
        let url = url().unwrap();
        let key = unique("race");
        let mut winner = raw(&url).await;
        let tx = winner.transaction().await.unwrap();
        let winner_pid: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        tx.execute(
            "INSERT INTO idem_records (key, version, fingerprint, state, lease_until_ms, expires_at_ms) \
             VALUES ($1, 1, 'winner', 'processing', $2, $3)",
            &[&key, &((BASE_MS + 30_000) as i64), &((BASE_MS + 60_000) as i64)],
        )
        .await
        .unwrap();
        proxy.take_round_trips();
        let claim = tokio::spawn({
            let (store, key) = (store.clone(), key.clone());
            async move {
                store
                    .insert(
                        &key,
                        record(
                            "loser",
                            State::Processing,
                            BASE_MS + 30_000,
                            BASE_MS + 60_000,
                        ),
                        BASE_MS,
                    )
                    .await
            }
        });
        // The claim read the key absent and now waits on the winner's
        // uncommitted row in the unique index.
        let watcher = raw(&url).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&winner_pid],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the claim never waited on the winner's row"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tx.commit().await.unwrap();
        match claim.await.unwrap().unwrap() {
            idem::store::InsertOutcome::Existing(entry) => {
                assert_eq!(entry.version, 1);
                assert_eq!(entry.record.fingerprint, "winner");
            }
            other => panic!("the loser claimed the key: {other:?}"),
        }
        assert_eq!(
            proxy.take_round_trips(),
            2,
            "the read, then the settling claim"
        );
        let fingerprint: String = watcher
            .query_one(
                "SELECT fingerprint FROM idem_records WHERE key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(fingerprint, "winner", "the loser wrote nothing");
    }

    #[tokio::test]
    async fn postgres_corrupt_record_names_the_key() {
        let Some(url) = url() else { return };
        let store = PostgresStore::open(&url).await.unwrap();
        let key = unique("garbled");
        put(&store, &key, done(BASE_MS + 10_000), BASE_MS).await;
        raw(&url)
            .await
            .execute(
                "UPDATE idem_records SET header_names = ARRAY['a', 'b'], header_values = ARRAY['\\x00'::bytea] WHERE key = $1",
                &[&key],
            )
            .await
            .unwrap();
        corrupt_record_names_the_key(Arc::new(store), &key).await;
    }

    /// Guards starting together create the schema once, without racing.
    #[tokio::test]
    async fn postgres_concurrent_opens_create_one_schema() {
        let Some(url) = url() else { return };
        let t = table();
        let store_url = with(&url, &format!("table={t}&pool=2"));
        let opens = (0..4).map(|_| PostgresStore::open(&store_url));
        for store in futures::future::join_all(opens).await {
            store.unwrap();
        }
        let client = raw(&url).await;
        let version = schema_version(&client, &t).await;
        assert_eq!(version, idem::store::PostgresStore::SCHEMA_VERSION);
        drop_table(&client, &t).await;
    }

    #[tokio::test]
    async fn postgres_purge_is_bounded_and_frees_expired_rows_only() {
        let Some(url) = url() else { return };
        let t = table();
        let store = open_table(&url, &t).await;
        crate::conformance::purge_is_bounded_and_spares_live_records(&store).await;
        let client = raw(&url).await;
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1, "the expired rows are gone from the table");
        drop_table(&client, &t).await;
    }

    #[tokio::test]
    async fn postgres_purges_in_batches() {
        let Some(url) = url() else { return };
        let t = table();
        let store = open_table(&url, &t).await;
        crate::conformance::purge_in_batches_frees_every_expired_record(&store).await;
        let client = raw(&url).await;
        drop_table(&client, &t).await;
    }

    /// The schema says which version wrote it; a table from another version is refused by name.
    #[tokio::test]
    async fn postgres_refuses_a_table_of_another_schema_version() {
        let Some(url) = url() else { return };
        let t = table();
        open_table(&url, &t).await;
        let client = raw(&url).await;
        client
            .execute(
                "UPDATE idem_schema SET version = 99 WHERE table_name = $1",
                &[&t],
            )
            .await
            .unwrap();
        let err = PostgresStore::open(&with(&url, &format!("table={t}")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("schema version 99") && err.contains(&t),
            "{err}"
        );
        drop_table(&client, &t).await;
    }

    /// A table written by 0.1 hosts (schema version 1: no holder, no
    /// checkpoint, claim functions of ten parameters) is migrated when a 0.2
    /// store opens it, and its rows keep working: a completed one replays,
    /// a claim whose holder crashed is taken over and completed.
    #[tokio::test]
    async fn postgres_migrates_a_table_of_schema_version_1() {
        let Some(url) = url() else { return };
        let t = table();
        let client = raw(&url).await;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS idem_schema (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL);
                 INSERT INTO idem_schema VALUES ('{t}', 1);
                 CREATE TABLE {t} (key TEXT COLLATE \"C\" PRIMARY KEY, version BIGINT NOT NULL,
                   fingerprint TEXT NOT NULL, state TEXT NOT NULL, lease_until_ms BIGINT NOT NULL,
                   expires_at_ms BIGINT NOT NULL, status INTEGER, header_names TEXT[],
                   header_values BYTEA[], body BYTEA);
                 CREATE FUNCTION {t}_claim(p_key TEXT, p_now BIGINT, p_fp TEXT, p_state TEXT, p_lease BIGINT,
                   p_exp BIGINT, p_status INTEGER, p_names TEXT[], p_values BYTEA[], p_body BYTEA)
                   RETURNS BIGINT LANGUAGE sql AS 'SELECT 1::BIGINT';
                 INSERT INTO {t} VALUES ('paid', 2, 'fp', 'done', 0, {exp}, 201, ARRAY['x'],
                   ARRAY['\\xff'::bytea], 'paid!');
                 INSERT INTO {t} VALUES ('crashed', 1, 'fp', 'processing', {lease}, {exp},
                   NULL, NULL, NULL, NULL);",
                exp = BASE_MS + 60_000,
                lease = BASE_MS - 1,
            ))
            .await
            .unwrap();
        let store = open_table(&url, &t).await;
        let version = schema_version(&client, &t).await;
        assert_eq!(version, PostgresStore::SCHEMA_VERSION);
        crate::conformance::records_of_0_1_hosts_keep_working(store).await;
        drop_table(&client, &t).await;
    }
}

mod dynamodb {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;
    use idem::store::DynamoDbStore;

    fn url() -> Option<String> {
        crate::conformance::dynamodb_test_url()
    }

    /// `url` on another table, created by the store as it opens.
    fn on_table(url: &str, table: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let rest: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("table="))
            .collect();
        format!("{base}?table={table}&{}", rest.join("&"))
    }

    /// A raw client for the test's own requests, on the server `url` names.
    async fn raw(url: &str) -> aws_sdk_dynamodb::Client {
        use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
        let endpoint = format!("http://{}", host_port(url, 8000));
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let config = aws_sdk_dynamodb::Config::builder()
            .http_client(http)
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "idem", "idem", None, None, "test",
            ))
            .build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }

    /// A table no other test uses, and `url` on it.
    fn own_table(url: &str, name: &str) -> (String, String) {
        let table = format!(
            "idem_{}",
            unique(name).replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        (on_table(url, &table), table)
    }

    async fn delete_table(client: &aws_sdk_dynamodb::Client, table: &str) {
        client
            .delete_table()
            .table_name(table)
            .send()
            .await
            .unwrap();
    }

    fn table_of(url: &str) -> String {
        url.split(['?', '&'])
            .find_map(|p| p.strip_prefix("table="))
            .unwrap_or("idem_records")
            .to_owned()
    }

    proxied_tests!("IDEM_TEST_DYNAMODB_URL", 8000);

    /// Unlike Redis (whose grace period keeps an expired record), a claim
    /// over an expired record is still one request: the update's condition
    /// takes it over and its expression counts the version on.
    #[tokio::test]
    async fn dynamodb_claim_of_an_expired_record_is_one_round_trip() {
        let Some((store, proxy)) = through_proxy("IDEM_TEST_DYNAMODB_URL", 8000).await else {
            return;
        };
        let (key, claim) = claim_over_expired(&store, &proxy, done(BASE_MS + 10), 1).await;
        let entry = store.get(&key, BASE_MS + 10).await.unwrap().unwrap();
        assert_eq!(
            (entry.version, entry.record),
            (2, claim),
            "the expired record's response is gone with it"
        );
    }

    /// Every item carries DynamoDB's TTL attribute: the record's expiry in
    /// seconds, rounded up, plus a minute of grace.
    #[tokio::test]
    async fn dynamodb_items_carry_their_ttl() {
        let Some(url) = url() else { return };
        let store = DynamoDbStore::open(&url).await.unwrap();
        let key = unique("ttl");
        let expires = BASE_MS + 10_001;
        store
            .insert(&key, claimed(BASE_MS + 1_000, expires), BASE_MS)
            .await
            .unwrap();
        let item = raw(&url)
            .await
            .get_item()
            .table_name(table_of(&url))
            .key("key", AttributeValue::S(key.clone()))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        let ttl = item.item().unwrap().get("ttl").unwrap();
        assert_eq!(
            ttl,
            &AttributeValue::N((expires.div_ceil(1_000) + 60).to_string())
        );
    }

    #[tokio::test]
    async fn dynamodb_corrupt_record_names_the_key() {
        let Some(url) = url() else { return };
        let store = DynamoDbStore::open(&url).await.unwrap();
        let key = unique("corrupt");
        let live = (BASE_MS + 60_000).to_string();
        raw(&url)
            .await
            .put_item()
            .table_name(table_of(&url))
            .item("key", AttributeValue::S(key.clone()))
            .item("version", AttributeValue::N("1".into()))
            .item("fingerprint", AttributeValue::S("fp".into()))
            .item("state", AttributeValue::S("paused".into()))
            .item("lease_until_ms", AttributeValue::N(live.clone()))
            .item("expires_at_ms", AttributeValue::N(live))
            .item("holder", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
        corrupt_record_names_the_key(Arc::new(store), &key).await;
    }

    /// A table that is absent is created, with its TTL on `ttl`; a second
    /// open finds it and uses it.
    #[tokio::test]
    async fn dynamodb_creates_its_table_with_ttl() {
        let Some(url) = url() else { return };
        let (url, table) = own_table(&url, "table");
        let first = DynamoDbStore::open(&url).await.unwrap();
        let key = unique("created");
        assert_eq!(
            first
                .insert(&key, claimed(BASE_MS + 1, BASE_MS + 10), BASE_MS)
                .await
                .unwrap(),
            InsertOutcome::Inserted(1)
        );
        let second = DynamoDbStore::open(&url).await.unwrap();
        assert!(second.get(&key, BASE_MS).await.unwrap().is_some());
        let client = raw(&url).await;
        let ttl = client
            .describe_time_to_live()
            .table_name(&table)
            .send()
            .await
            .unwrap();
        let ttl = ttl.time_to_live_description().unwrap();
        assert_eq!(ttl.attribute_name(), Some("ttl"));
        delete_table(&client, &table).await;
    }

    #[tokio::test]
    async fn dynamodb_purge_is_bounded_and_spares_live_records() {
        let Some(url) = url() else { return };
        let (url, table) = own_table(&url, "purge");
        let store: Arc<dyn Store> = Arc::new(DynamoDbStore::open(&url).await.unwrap());
        crate::conformance::purge_is_bounded_and_spares_live_records(&store).await;
        delete_table(&raw(&url).await, &table).await;
    }

    /// The clock is AWS's (here the emulator's machine's) from the `Date`
    /// header: known after open, to within half a second and the round trip.
    #[tokio::test]
    async fn dynamodb_clock_is_read_from_the_date_header() {
        let Some(url) = url() else { return };
        let store = DynamoDbStore::open(&url).await.unwrap();
        let clock = store.clock();
        let error = clock.known().unwrap();
        assert!(
            (501..2_000).contains(&error),
            "half a second and the round trip: {error}"
        );
        assert!(
            clock.authority().contains("Date header"),
            "{}",
            clock.authority()
        );
    }
}
