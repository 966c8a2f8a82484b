//! Records in PostgreSQL, shared by every guard that points at the same
//! database and table.
//!
//! One row per key in a table the store creates (`idem_records` unless the
//! URL says `?table=NAME`), with its schema version in `idem_schema`. Each
//! primitive is one prepared statement, so one round trip:
//!
//! - a claim reads the row by key and returns it when live — a replay is
//!   one index lookup, takes no lock and writes nothing. Only when the row is
//!   absent or expired does the same statement call `{table}_try_claim(…)`,
//!   a PL/pgSQL function: `INSERT … ON CONFLICT (key) DO NOTHING` (absent)
//!   or `UPDATE … WHERE expires_at_ms <= now` (expired), answering the new
//!   version. It has to be a function: each statement in it takes a new
//!   snapshot, so it sees a row that a concurrent claimer committed after
//!   the claim's read began. When such a claimer won (the function answers
//!   NULL), the claim asks again through `{table}_claim(…)`, which reads,
//!   inserts or overwrites in a loop until it settles and returns the row:
//!   a second round trip, only for the loser of a race.
//! - a completion is `UPDATE … WHERE key = $1 AND version = $2 AND expires_at_ms > $now`.
//!
//! Every read filters `expires_at_ms > now` by the guard's clock; the
//! bounded [`Store::purge_expired`] only frees space (an index on
//! `expires_at_ms` keeps it cheap). Keys sort by byte (`COLLATE "C"`).
//!
//! URL: `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?pool=16&table=idem_records&timeout_ms=2000]`
//! (also `postgresql://`; other parameters such as `application_name` go to
//! the driver). Connections come from a pool that drops broken connections
//! and opens new ones, so the store works again once the server is back.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::store::{PostgresStore, Store};
//! let store = PostgresStore::open("postgres://postgres@127.0.0.1:5432/test?pool=8").await?;
//! assert_eq!(store.name(), "postgres");
//! # Ok(()) }
//! ```

use super::params::StoreUrl;
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, State, Store, StoreError};
use async_trait::async_trait;
use deadpool_postgres::tokio_postgres::{self, NoTls, Row, types::ToSql};
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime,
};
use idem_guest::model::Response;
use std::sync::Arc;
use std::time::Duration;

const NAME: &str = "postgres";

/// A store on a PostgreSQL database. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    timeout: Duration,
}

/// The statements, with the table name filled in once.
struct Sql {
    claim: String,
    settle: String,
    get: String,
    replace: String,
    delete: String,
    list: String,
    purge: String,
}

const COLUMNS: &str = "version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body";

impl Sql {
    fn all(&self) -> [&str; 7] {
        [
            &self.claim,
            &self.settle,
            &self.get,
            &self.replace,
            &self.delete,
            &self.list,
            &self.purge,
        ]
    }

    fn new(t: &str) -> Sql {
        Sql {
            // The row's `COLUMNS` (all NULL when absent), then the version
            // `{t}_try_claim` wrote, if it was called and won.
            claim: format!(
                "SELECT r.*, CASE WHEN r.expires_at_ms > $2 THEN NULL \
                 ELSE {t}_try_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) END \
                 FROM (SELECT 1) AS one LEFT JOIN (SELECT {COLUMNS} FROM {t} WHERE key = $1) r ON true"
            ),
            settle: format!("SELECT * FROM {t}_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE key = $1 AND expires_at_ms > $2"),
            replace: format!(
                "UPDATE {t} SET version = version + 1, fingerprint = $4, state = $5, lease_until_ms = $6, \
                 expires_at_ms = $7, status = $8, header_names = $9, header_values = $10, body = $11 \
                 WHERE key = $1 AND version = $2 AND expires_at_ms > $3"
            ),
            delete: format!(
                "DELETE FROM {t} WHERE key = $1 AND ($2::BIGINT IS NULL OR version = $2)"
            ),
            list: format!(
                "SELECT key, {COLUMNS} FROM {t} WHERE key LIKE $1 AND expires_at_ms > $2 \
                 AND ($3::TEXT IS NULL OR state = $3) AND ($4::TEXT IS NULL OR key > $4 COLLATE \"C\") \
                 ORDER BY key LIMIT $5"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE expires_at_ms <= $1 AND key IN \
                 (SELECT key FROM {t} WHERE expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// Creates the table, its index, the claim functions and the schema
/// version, under an advisory lock so that guards starting together do not
/// race on `CREATE`.
fn schema(t: &str) -> String {
    format!(
        r#"
SELECT pg_advisory_xact_lock(hashtext('idem schema {t}'));
CREATE TABLE IF NOT EXISTS idem_schema (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL);
INSERT INTO idem_schema VALUES ('{t}', {version}) ON CONFLICT (table_name) DO NOTHING;
CREATE TABLE IF NOT EXISTS {t} (
  key TEXT COLLATE "C" PRIMARY KEY,
  version BIGINT NOT NULL,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('processing', 'done')),
  lease_until_ms BIGINT NOT NULL,
  expires_at_ms BIGINT NOT NULL,
  status INTEGER,
  header_names TEXT[],
  header_values BYTEA[],
  body BYTEA
);
CREATE INDEX IF NOT EXISTS {t}_expires ON {t} (expires_at_ms);
"#,
        version = PostgresStore::SCHEMA_VERSION
    ) + &claim_functions(t)
}

/// The claim's two PL/pgSQL functions (see the module docs).
fn claim_functions(t: &str) -> String {
    format!(
        r"
-- Earlier builds returned a set (RETURNS TABLE); one row is cheaper to return,
-- and CREATE OR REPLACE cannot change a function's return type.
DO $drop$ BEGIN
  IF (SELECT proretset FROM pg_proc
      WHERE oid = to_regprocedure('{t}_claim(text, bigint, text, text, bigint, bigint, integer, text[], bytea[], bytea)'))
  THEN
    DROP FUNCTION {t}_claim(text, bigint, text, text, bigint, bigint, integer, text[], bytea[], bytea);
  END IF;
END $drop$;
-- Claims an absent or expired key: its new version, or NULL when a live row
-- (a concurrent claimer's, committed since the caller read) holds it.
CREATE OR REPLACE FUNCTION {t}_try_claim(
  p_key TEXT, p_now BIGINT, p_fp TEXT, p_state TEXT, p_lease BIGINT, p_exp BIGINT,
  p_status INTEGER, p_names TEXT[], p_values BYTEA[], p_body BYTEA)
RETURNS BIGINT
LANGUAGE plpgsql AS $fn$
DECLARE
  v BIGINT;
BEGIN
  -- The unique key lets exactly one concurrent claimer insert; the others
  -- wait for it to commit and insert nothing.
  INSERT INTO {t} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body)
  VALUES (p_key, 1, p_fp, p_state, p_lease, p_exp, p_status, p_names, p_values, p_body)
  ON CONFLICT (key) DO NOTHING
  RETURNING version INTO v;
  IF FOUND THEN
    RETURN v;
  END IF;
  -- Present: overwritten at its version + 1 if still expired when we hold its
  -- lock (a concurrent claimer that overwrote it first made it live again).
  UPDATE {t} r SET version = r.version + 1, fingerprint = p_fp, state = p_state, lease_until_ms = p_lease,
    expires_at_ms = p_exp, status = p_status, header_names = p_names, header_values = p_values, body = p_body
  WHERE r.key = p_key AND r.expires_at_ms <= p_now
  RETURNING r.version INTO v;
  RETURN v;
END
$fn$;
-- The whole claim in a loop, returning the row it found or the version it
-- wrote: for a claimer that lost a race to `{t}_try_claim`.
CREATE OR REPLACE FUNCTION {t}_claim(
  p_key TEXT, p_now BIGINT, p_fp TEXT, p_state TEXT, p_lease BIGINT, p_exp BIGINT,
  p_status INTEGER, p_names TEXT[], p_values BYTEA[], p_body BYTEA,
  OUT o_inserted BOOLEAN, OUT o_version BIGINT, OUT o_fingerprint TEXT, OUT o_state TEXT, OUT o_lease BIGINT,
  OUT o_exp BIGINT, OUT o_status INTEGER, OUT o_names TEXT[], OUT o_values BYTEA[], OUT o_body BYTEA)
LANGUAGE plpgsql AS $fn$
BEGIN
  FOR attempt IN 1..10 LOOP
    -- Read first: a live record (a replay, a request in flight) is answered
    -- with no write and no lock. Each statement here takes a new snapshot, so
    -- this sees a row a concurrent claimer committed while we waited below.
    SELECT false, r.version, r.fingerprint, r.state, r.lease_until_ms, r.expires_at_ms, r.status,
      r.header_names, r.header_values, r.body
    INTO o_inserted, o_version, o_fingerprint, o_state, o_lease, o_exp, o_status, o_names, o_values, o_body
    FROM {t} r WHERE r.key = p_key;
    IF NOT FOUND THEN
      -- Absent: the unique key lets exactly one concurrent claimer insert; the
      -- others wait for it to commit, insert nothing and read its row.
      INSERT INTO {t} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body)
      VALUES (p_key, 1, p_fp, p_state, p_lease, p_exp, p_status, p_names, p_values, p_body)
      ON CONFLICT (key) DO NOTHING
      RETURNING version INTO o_version;
    ELSIF o_exp > p_now THEN
      RETURN;
    ELSE
      -- Expired: overwritten at its version + 1, unless a concurrent claimer
      -- did so first (its row is live again when we get the lock) or it was purged.
      UPDATE {t} r SET version = r.version + 1, fingerprint = p_fp, state = p_state, lease_until_ms = p_lease,
        expires_at_ms = p_exp, status = p_status, header_names = p_names, header_values = p_values, body = p_body
      WHERE r.key = p_key AND r.expires_at_ms <= p_now
      RETURNING r.version INTO o_version;
    END IF;
    IF FOUND THEN
      -- Only the version is read when inserted (the other columns may hold the expired row).
      o_inserted := true;
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'idem: claim of % did not settle after 10 attempts', p_key;
END
$fn$;
"
    )
}

impl PostgresStore {
    /// The table layout this build reads and writes, kept in `idem_schema`.
    pub const SCHEMA_VERSION: i32 = 1;

    /// Connects, creates the schema if needed and checks its version. Fails
    /// when the server cannot be reached now; after that, broken connections
    /// are replaced and each operation fails as unavailable meanwhile.
    #[allow(clippy::too_many_lines)] // one linear sequence: parse, set up the schema, open the pool
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url, &["pool", "table", "timeout_ms"])?;
        let bad = |reason: String| OpenError::BadUrl {
            url: url.shown.clone(),
            reason,
        };
        let unreachable = |reason: String| OpenError::Unreachable {
            store: NAME,
            url: url.shown.clone(),
            reason,
        };
        let table = url.get("table").unwrap_or("idem_records").to_owned();
        if table.is_empty()
            || table.len() > 48
            || !table.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            || !table
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(bad(format!(
                "table={table:?} must be 1 to 48 characters of a-z, 0-9 and _, not starting with a digit"
            )));
        }
        let pool_size = url.number("pool", 16, 1, 1024)? as usize;
        let timeout = url.timeout()?;
        let driver = url.driver.replacen("postgresql://", "postgres://", 1);
        let mut config: tokio_postgres::Config = driver
            .parse()
            .map_err(|e: tokio_postgres::Error| bad(e.to_string()))?;
        config.connect_timeout(timeout);
        if config.get_application_name().is_none() {
            config.application_name("idem");
        }
        // The schema first, on a connection of its own: the pool's
        // connections prepare the statements, which need the claim function.
        let setup = async {
            let (client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|e| unreachable(describe(&e)))?;
            let connection = tokio::spawn(connection);
            client
                .batch_execute(&schema(&table))
                .await
                .map_err(|e| unreachable(describe(&e)))?;
            let row = client
                .query_one(
                    "SELECT version FROM idem_schema WHERE table_name = $1",
                    &[&table],
                )
                .await
                .map_err(|e| unreachable(describe(&e)))?;
            drop(client);
            let _ = connection.await;
            Ok::<i32, OpenError>(row.get(0))
        };
        let found = tokio::time::timeout(timeout * 4, setup)
            .await
            .map_err(|_| {
                unreachable(format!("no answer within {} ms", (timeout * 4).as_millis()))
            })??;
        if found != Self::SCHEMA_VERSION {
            return Err(unreachable(format!(
                "the table {table:?} has schema version {found}; this build reads version {}",
                Self::SCHEMA_VERSION
            )));
        }
        let sql = Arc::new(Sql::new(&table));
        let prepare = sql.clone();
        // Fast: a pooled connection is reused without a test query, so an
        // operation stays one round trip; a closed one is dropped and replaced.
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            // The connection used last is used next: under light load one
            // warm server process answers, instead of every pooled one in turn.
            .queue_mode(QueueMode::Lifo)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            // Every statement prepared as the connection opens, so that even
            // the first use of each on a connection is one round trip.
            .post_create(Hook::async_fn(move |client, _| {
                let sql = prepare.clone();
                Box::pin(async move {
                    for statement in sql.all() {
                        client
                            .prepare_cached(statement)
                            .await
                            .map_err(HookError::Backend)?;
                    }
                    Ok(())
                })
            }))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        // The whole pool opened now: a failure shows at start-up, and the
        // first burst of requests does not queue behind connection set-up.
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..pool_size {
            let pool = pool.clone();
            opening.spawn(async move { pool.get().await });
        }
        let mut opened = Vec::with_capacity(pool_size);
        while let Some(conn) = opening.join_next().await {
            opened.push(
                conn.map_err(|e| unreachable(e.to_string()))?
                    .map_err(|e| unreachable(e.to_string()))?,
            );
        }
        drop(opened);
        Ok(PostgresStore { pool, sql, timeout })
    }

    /// Runs one prepared statement on a pooled connection, within the timeout.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.within_timeout(async {
            let (client, statement) = self.prepared(sql).await?;
            client
                .query(&statement, params)
                .await
                .map_err(|e| unavailable(describe(&e)))
        })
        .await
    }

    /// Runs one prepared statement that returns no rows; how many it changed.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        self.within_timeout(async {
            let (client, statement) = self.prepared(sql).await?;
            client
                .execute(&statement, params)
                .await
                .map_err(|e| unavailable(describe(&e)))
        })
        .await
    }

    /// A pooled connection and `sql` prepared on it (cached per connection).
    async fn prepared(
        &self,
        sql: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement), StoreError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| unavailable(describe(&e)))?;
        Ok((client, statement))
    }

    async fn within_timeout<T>(
        &self,
        run: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(unavailable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// The server's message when there is one (the driver's own text is just "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
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

/// Milliseconds and versions as BIGINT; beyond `i64::MAX` (292 million
/// years) they saturate.
fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A record as the statements' parameters, in `COLUMNS` order after the
/// version: fingerprint, state, lease, expiry, status, header names,
/// header values, body.
struct RecordParams<'r> {
    fingerprint: &'r str,
    state: &'static str,
    lease_until_ms: i64,
    expires_at_ms: i64,
    status: Option<i32>,
    names: Option<Vec<String>>,
    values: Option<Vec<Vec<u8>>>,
    body: Option<&'r [u8]>,
}

impl<'r> RecordParams<'r> {
    fn new(record: &'r Record) -> Self {
        let response = record.response.as_ref();
        RecordParams {
            fingerprint: &record.fingerprint,
            state: record.state.as_str(),
            lease_until_ms: big(record.lease_until_ms),
            expires_at_ms: big(record.expires_at_ms),
            status: response.map(|r| i32::from(r.status)),
            names: response.map(|r| r.headers.iter().map(|(n, _)| n.clone()).collect()),
            values: response.map(|r| r.headers.iter().map(|(_, v)| v.clone()).collect()),
            body: response.map(|r| r.body.as_slice()),
        }
    }

    /// `leading` (key, version, now: as the statement wants), then the record.
    fn after<'a>(&'a self, leading: &[&'a (dyn ToSql + Sync)]) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut params = leading.to_vec();
        params.extend_from_slice(&[
            &self.fingerprint,
            &self.state,
            &self.lease_until_ms,
            &self.expires_at_ms,
            &self.status,
            &self.names,
            &self.values,
            &self.body,
        ]);
        params
    }
}

/// Decodes the `COLUMNS` starting at column `at`.
fn decode(key: &str, row: &Row, at: usize) -> Result<Entry, StoreError> {
    let col = |name: &str, e: tokio_postgres::Error| {
        corrupt(key, format!("the column {name:?} does not decode: {e}"))
    };
    let version: i64 = row.try_get(at).map_err(|e| col("version", e))?;
    let fingerprint: String = row.try_get(at + 1).map_err(|e| col("fingerprint", e))?;
    let state: String = row.try_get(at + 2).map_err(|e| col("state", e))?;
    let lease: i64 = row.try_get(at + 3).map_err(|e| col("lease_until_ms", e))?;
    let exp: i64 = row.try_get(at + 4).map_err(|e| col("expires_at_ms", e))?;
    let status: Option<i32> = row.try_get(at + 5).map_err(|e| col("status", e))?;
    let names: Option<Vec<String>> = row.try_get(at + 6).map_err(|e| col("header_names", e))?;
    let values: Option<Vec<Vec<u8>>> = row.try_get(at + 7).map_err(|e| col("header_values", e))?;
    let body: Option<Vec<u8>> = row.try_get(at + 8).map_err(|e| col("body", e))?;
    let unsigned = |name: &str, n: i64| {
        u64::try_from(n).map_err(|_| corrupt(key, format!("{name} is negative ({n})")))
    };
    let state =
        State::parse(&state).ok_or_else(|| corrupt(key, format!("unknown state {state:?}")))?;
    let response = match (status, names, values, body) {
        (None, None, None, None) => None,
        (Some(status), Some(names), Some(values), Some(body)) if names.len() == values.len() => {
            Some(Response {
                status: u16::try_from(status)
                    .map_err(|_| corrupt(key, format!("status {status} is out of range")))?,
                headers: names.into_iter().zip(values).collect(),
                body,
            })
        }
        _ => {
            return Err(corrupt(
                key,
                "the response columns are inconsistent (status, header names/values, body)",
            ));
        }
    };
    Ok(Entry {
        version: unsigned("version", version)?,
        record: Record {
            fingerprint,
            state,
            lease_until_ms: unsigned("lease_until_ms", lease)?,
            expires_at_ms: unsigned("expires_at_ms", exp)?,
            response,
        },
    })
}

/// A `LIKE` pattern matching keys that start with `prefix`.
fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

#[async_trait]
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        let rows = self.query(&self.sql.get, &[&key, &big(now_ms)]).await?;
        rows.first().map(|row| decode(key, row, 0)).transpose()
    }

    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        let now = big(now_ms);
        let columns = RecordParams::new(&record);
        let params = columns.after(&[&key, &now]);
        let rows = self.query(&self.sql.claim, &params).await?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable("the claim returned no row".into()))?;
        // Columns: the row's `COLUMNS` (expires_at_ms is the fifth), then the claimed version.
        let claimed: Option<i64> = row.try_get(9).map_err(|e| unavailable(e.to_string()))?;
        if let Some(version) = claimed {
            return Ok(InsertOutcome::Inserted(version.cast_unsigned()));
        }
        let expires: Option<i64> = row.try_get(4).map_err(|e| unavailable(e.to_string()))?;
        if expires.is_some_and(|expires| expires > now) {
            return Ok(InsertOutcome::Existing(decode(key, row, 0)?));
        }
        // A concurrent claimer committed the key after this claim read it:
        // settle in a second round trip, which returns the winner's row.
        let rows = self.query(&self.sql.settle, &params).await?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable("the claim returned no row".into()))?;
        let inserted: bool = row.try_get(0).map_err(|e| unavailable(e.to_string()))?;
        if inserted {
            let version: i64 = row.try_get(1).map_err(|e| unavailable(e.to_string()))?;
            Ok(InsertOutcome::Inserted(version.cast_unsigned()))
        } else {
            Ok(InsertOutcome::Existing(decode(key, row, 1)?))
        }
    }

    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let (version, now) = (big(expected_version), big(now_ms));
        let columns = RecordParams::new(&record);
        let replaced = self
            .execute(&self.sql.replace, &columns.after(&[&key, &version, &now]))
            .await?;
        // The row's version is `version + 1` = expected + 1 when one was updated.
        Ok((replaced > 0).then(|| expected_version.saturating_add(1)))
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        let removed = self
            .execute(&self.sql.delete, &[&key, &expected_version.map(big)])
            .await?;
        Ok(removed > 0)
    }

    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let state = query.state.map(State::as_str);
        let limit = big(query.limit as u64);
        let rows = self
            .query(
                &self.sql.list,
                &[
                    &like_prefix(&query.prefix),
                    &big(now_ms),
                    &state,
                    &query.after,
                    &limit,
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let key: String = row.get(0);
                decode(&key, row, 1).map(|entry| (key, entry))
            })
            .collect()
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let purged = self
            .execute(&self.sql.purge, &[&big(now_ms), &big(limit as u64)])
            .await?;
        Ok(usize::try_from(purged).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::like_prefix;

    #[test]
    fn like_wildcards_in_prefixes_are_escaped() {
        assert_eq!(like_prefix(r"a%b_c\"), r"a\%b\_c\\%");
    }
}
