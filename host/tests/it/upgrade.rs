//! Contract 0.3 keeps 0.2's records: what a 0.2 host wrote is read by 0.3
//! and keeps working, on Redis, PostgreSQL and SQLite.
//!
//! The records are written as the 0.2 code path wrote them, without 0.3's
//! code: in Redis and PostgreSQL, the bytes and columns of the shared
//! layout's vectors (`wit/store-layout/vectors.json`, made by an encoder
//! that shares no code with any store, and that 0.2's stores were checked
//! against byte for byte); in SQLite, a file of schema 2 made by 0.2's own
//! migrations and statements (copied below). Then a guard of this build,
//! on a manual clock: a completed key replays its bytes, a claim inside its
//! lease is in flight for exactly the rest of it, and past the lease a
//! claim is taken over with a higher fence, keeping its checkpoint.

use idem::store::Store;
use idem::{Checkpoint, Decision, Guard, ManualClock, Response};
use idem_harness::{server_url, unique};
use serde_json::Value;
use std::time::Duration;

const VECTORS: &str = include_str!("../../../wit/store-layout/vectors.json");

/// The keys the three records are written under, and the vector each takes.
const RECORDS: [(&str, &str); 3] = [
    ("paid", "done with headers and a binary body"),
    ("waiting", "processing, no response"),
    (
        "resumable",
        "processing after a checkpoint, holder above 2^63",
    ),
];

/// The instant the guard reads them at: inside both claims' leases.
const AT_MS: u64 = 1_700_000_000_000;

fn vector(name: &str) -> Value {
    let doc: Value = serde_json::from_str(VECTORS).unwrap();
    doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("vectors.json has no record {name:?}"))
        .clone()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn number(value: &Value) -> u64 {
    value.as_str().unwrap().parse().unwrap()
}

/// What 0.3 must make of the records a 0.2 host wrote into `store`.
async fn records_of_0_2_hosts_keep_working(store: impl Store) {
    let clock = ManualClock::new(AT_MS);
    let guard = Guard::builder(store)
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();

    let paid = vector(RECORDS[0].1)["record"].clone();
    let fp = paid["fingerprint"].as_str().unwrap();
    let Decision::Replay(response) = guard.begin("paid", fp).await.unwrap() else {
        panic!("the completed key replays")
    };
    let stored = &paid["response"];
    let expected = Response {
        status: stored["status"].as_u64().unwrap() as u16,
        headers: stored["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap().to_owned(),
                    hex(h[1].as_str().unwrap()),
                )
            })
            .collect(),
        body: hex(stored["body"].as_str().unwrap()),
    };
    assert_eq!(response, expected, "the bytes a 0.2 host stored replay");

    let mut claims = Vec::new();
    for (key, name) in &RECORDS[1..] {
        let record = vector(name)["record"].clone();
        let fp = record["fingerprint"].as_str().unwrap();
        let lease_left = number(&record["lease_until_ms"]) - AT_MS;
        assert_eq!(
            guard.begin(key, fp).await.unwrap(),
            Decision::InFlight {
                retry_after_ms: lease_left
            },
            "{key}: in flight for the rest of its 0.2 holder's lease"
        );
        claims.push((*key, fp.to_owned(), record));
    }

    clock.set(1_700_000_070_000); // past both leases
    for (key, fp, record) in claims {
        let version = number(&vector_of(key)["version"]);
        let Decision::Proceed(claim) = guard.begin(key, &fp).await.unwrap() else {
            panic!("{key}: taken over past its lease")
        };
        assert_eq!(claim.fence, version + 1, "{key}: a higher fence");
        assert_ne!(
            claim.holder,
            number(&record["holder"]),
            "{key}: a new holder"
        );
        let checkpoint = record["checkpoint"].as_object().map(|c| Checkpoint {
            phase: c["phase"].as_str().unwrap().to_owned(),
            data: hex(c["data"].as_str().unwrap()),
        });
        assert_eq!(claim.checkpoint, checkpoint, "{key}: its checkpoint kept");
        let done = Response {
            status: 200,
            headers: vec![],
            body: key.as_bytes().to_vec(),
        };
        guard.complete(claim, done.clone()).await.1.unwrap();
        assert_eq!(guard.begin(key, &fp).await.unwrap(), Decision::Replay(done));
    }
}

fn vector_of(key: &str) -> Value {
    let name = RECORDS.iter().find(|(k, _)| *k == key).unwrap().1;
    vector(name)
}

#[tokio::test]
async fn redis_reads_the_records_0_2_hosts_wrote() {
    let Some(url) = server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let prefix = format!("{}:", unique("upgrade"));
    let mut raw = ::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for (key, name) in RECORDS {
        let value = hex(vector(name)["redis"].as_str().unwrap());
        ::redis::cmd("SET")
            .arg(format!("{prefix}{key}"))
            .arg(value)
            .query_async::<()>(&mut raw)
            .await
            .unwrap();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = idem::store::RedisStore::open(&format!("{url}{sep}prefix={prefix}"))
        .await
        .unwrap();
    records_of_0_2_hosts_keep_working(store).await;
}

#[tokio::test]
async fn postgres_reads_the_records_0_2_hosts_wrote() {
    let Some(url) = server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let t = format!("t_upgrade_{}_{}", std::process::id(), fastrand::u32(..));
    let sep = if url.contains('?') { '&' } else { '?' };
    // The table as every schema-2 host creates it (0.2 and 0.3 alike).
    let store = idem::store::PostgresStore::open(&format!("{url}{sep}table={t}"))
        .await
        .unwrap();
    let client = crate::netstores::postgres::raw(&url).await;
    for (key, name) in RECORDS {
        let row = vector(name)["postgres"].clone();
        let text = |field: &str| row[field].as_str().map(str::to_owned);
        let int = |field: &str| text(field).map(|v| v.parse::<i64>().unwrap());
        let bytes = |field: &str| text(field).map(|v| hex(&v));
        let names: Option<Vec<String>> = row["header_names"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect());
        let values: Option<Vec<Vec<u8>>> = row["header_values"]
            .as_array()
            .map(|a| a.iter().map(|v| hex(v.as_str().unwrap())).collect());
        let status = row["status"].as_i64().map(|s| s as i32);
        client
            .execute(
                &format!(
                    "INSERT INTO {t} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, \
                     status, header_names, header_values, body, holder, phase, checkpoint) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
                ),
                &[
                    &key,
                    &int("version").unwrap(),
                    &text("fingerprint").unwrap(),
                    &text("state").unwrap(),
                    &int("lease_until_ms").unwrap(),
                    &int("expires_at_ms").unwrap(),
                    &status,
                    &names,
                    &values,
                    &bytes("body"),
                    &int("holder").unwrap(),
                    &text("phase"),
                    &bytes("checkpoint"),
                ],
            )
            .await
            .unwrap();
    }
    records_of_0_2_hosts_keep_working(store).await;
    crate::netstores::postgres::drop_table(&client, &t).await;
}

/// A SQLite file as a 0.2 host left it: schema 2, made by 0.2's migrations,
/// its rows written by 0.2's `INSERT` (`host/src/store/sqlite/`, 55d8f6a).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_a_file_0_2_hosts_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let raw = rusqlite::Connection::open(&db).unwrap();
    raw.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE records (
             key            TEXT PRIMARY KEY NOT NULL,
             version        INTEGER NOT NULL,
             fingerprint    TEXT NOT NULL,
             state          TEXT NOT NULL,
             lease_until_ms INTEGER NOT NULL,
             expires_at_ms  INTEGER NOT NULL,
             status         INTEGER,
             headers        BLOB,
             body           BLOB
         ) STRICT;
         CREATE INDEX records_expires_at ON records (expires_at_ms);
         ALTER TABLE records ADD COLUMN holder INTEGER NOT NULL DEFAULT 0;
         ALTER TABLE records ADD COLUMN phase TEXT;
         ALTER TABLE records ADD COLUMN checkpoint BLOB;
         PRAGMA user_version = 2; PRAGMA application_id = 1768187245;",
    )
    .unwrap();
    for (key, name) in RECORDS {
        let record = vector(name)["record"].clone();
        let response = record["response"].as_object();
        // 0.2's header blob: a u32 count, then each name and value as a
        // u32 length and its bytes, big-endian.
        let headers = response.map(|r| {
            let list = r["headers"].as_array().unwrap();
            let mut blob = (list.len() as u32).to_be_bytes().to_vec();
            for h in list {
                for part in [
                    h[0].as_str().unwrap().as_bytes().to_vec(),
                    hex(h[1].as_str().unwrap()),
                ] {
                    blob.extend((part.len() as u32).to_be_bytes());
                    blob.extend(part);
                }
            }
            blob
        });
        let checkpoint = record["checkpoint"].as_object();
        raw.execute(
            "INSERT INTO records (key, version, fingerprint, state, lease_until_ms, expires_at_ms, \
             status, headers, body, holder, phase, checkpoint) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            rusqlite::params![
                key,
                number(&vector(name)["version"]) as i64,
                record["fingerprint"].as_str().unwrap(),
                record["state"].as_str().unwrap(),
                number(&record["lease_until_ms"]) as i64,
                number(&record["expires_at_ms"]) as i64,
                response.map(|r| r["status"].as_i64().unwrap()),
                headers,
                response.map(|r| hex(r["body"].as_str().unwrap())),
                number(&record["holder"]) as i64,
                checkpoint.map(|c| c["phase"].as_str().unwrap().to_owned()),
                checkpoint.map(|c| hex(c["data"].as_str().unwrap())),
            ],
        )
        .unwrap();
    }
    drop(raw);
    let store = idem::store::SqliteStore::open(&db, idem::store::SqliteOptions::default()).unwrap();
    let version: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3, "migrated: the file's clock added");
    records_of_0_2_hosts_keep_working(store).await;
}
