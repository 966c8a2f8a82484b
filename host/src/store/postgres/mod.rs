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
//! A server that refuses writes (a hot standby, a session with
//! `default_transaction_read_only`) still opens a table written before,
//! without its schema script: a claim of a live key only reads, so replays
//! go on; a claim of a new key, a completion or a release fails as
//! unavailable.
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

mod row;
mod sql;

use super::codec::{driver_failed, int, unavailable};
use super::params::StoreUrl;
use super::{Entry, InsertOutcome, ListQuery, OpenError, Record, Result, State, Store};
use crate::clock::{Clock, SyncedClock, Syncing};
use async_trait::async_trait;
use deadpool_postgres::tokio_postgres::error::SqlState;
use deadpool_postgres::tokio_postgres::{self, Client, NoTls, Row, Statement, types::ToSql};
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime,
};
use row::{RecordParams, decode};
use sql::{Sql, schema};
use std::sync::Arc;
use std::time::Duration;

const NAME: &str = "postgres";

/// A store on a PostgreSQL database. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    timeout: Duration,
    /// The server's clock, the store's time authority; kept synced while
    /// any clone holds `_syncing`.
    clock: Arc<SyncedClock>,
    _syncing: Arc<Syncing>,
}
impl PostgresStore {
    /// The table layout this build reads and writes, kept in `idem_schema`.
    pub const SCHEMA_VERSION: i32 = 2;

    /// Connects, creates the schema if needed and checks its version. Fails
    /// when the server cannot be reached now; after that, broken connections
    /// are replaced and each operation fails as unavailable meanwhile.
    #[allow(clippy::too_many_lines)] // one linear sequence: parse, set up the schema, open the pool
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url, &["pool", "table", "timeout_ms", "clock_sync_ms"])?;
        let clock_sync = url.clock_sync()?;
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
                .map_err(|e| unreachable(connect_failed(&config, &e)))?;
            let connection = tokio::spawn(connection);
            match client.batch_execute(&schema(&table)).await {
                Ok(()) => {}
                // A read-only server (a hot standby, a session with
                // `default_transaction_read_only`) cannot run the script, but
                // serves a table written before: replays, from reads.
                Err(e) if e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {}
                Err(e) => return Err(unreachable(describe(&e))),
            }
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
        // The time authority: the server's clock, read once now (a store
        // whose clock is unknown fails every guard call closed) and every
        // second after.
        let clock = SyncedClock::new("the PostgreSQL server's clock (clock_timestamp())");
        let syncing = clock
            .start_syncing(
                clock_sync,
                (pool.clone(), sql.clone(), timeout),
                server_time,
            )
            .await
            .map_err(unreachable)?;
        Ok(PostgresStore {
            pool,
            sql,
            timeout,
            clock,
            _syncing: syncing,
        })
    }

    /// Runs one prepared statement on a pooled connection, within the timeout.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        self.on_connection(sql, async |client, statement| {
            client.query(statement, params).await
        })
        .await
    }

    /// Runs one prepared statement that returns no rows; how many it changed.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        self.on_connection(sql, async |client, statement| {
            client.execute(statement, params).await
        })
        .await
    }

    /// `call` with `sql` prepared on a pooled connection, within the timeout.
    async fn on_connection<T>(
        &self,
        sql: &str,
        call: impl AsyncFnOnce(&Client, &Statement) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T> {
        self.within_timeout(async {
            let (client, statement) = self.prepared(sql).await?;
            call(&client, &statement)
                .await
                .map_err(|e| unavailable(NAME, describe(&e)))
        })
        .await
    }

    /// A pooled connection and `sql` prepared on it (cached per connection).
    async fn prepared(
        &self,
        sql: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement)> {
        let client = self.pool.get().await.map_err(|e| driver_failed(NAME, e))?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| unavailable(NAME, describe(&e)))?;
        Ok((client, statement))
    }

    async fn within_timeout<T>(&self, run: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(unavailable(
                NAME,
                format!("no answer within {} ms", self.timeout.as_millis()),
            )),
        }
    }
}

/// The server's time in milliseconds since the Unix epoch (the `now`
/// statement), within `timeout`.
async fn server_time((pool, sql, timeout): (Pool, Arc<Sql>, Duration)) -> Result<u64, String> {
    let ask = async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        let statement = client
            .prepare_cached(&sql.now)
            .await
            .map_err(|e| describe(&e))?;
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| describe(&e))?;
        u64::try_from(row.get::<_, i64>(0)).map_err(|e| e.to_string())
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(done) => done,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// The server's message when there is one (the driver's own text is just "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Why a connection could not be opened, naming where it went: the driver
/// says only "error connecting to server", and keeps the cause (refused,
/// timed out, no such database, authentication) in its source chain.
fn connect_failed(config: &tokio_postgres::Config, e: &tokio_postgres::Error) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("(none)");
    let db = config.get_dbname().unwrap_or(user);
    let mut cause = describe(e);
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    format!("cannot connect to {host}:{port} (database {db:?}, user {user:?}): {cause}")
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

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        let rows = self.query(&self.sql.get, &[&key, &int(now_ms)]).await?;
        rows.first().map(|row| decode(key, row, 0)).transpose()
    }

    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        let now = int(now_ms);
        let columns = RecordParams::new(&record);
        let params = columns.after(&[&key, &now]);
        let rows = self.query(&self.sql.claim, &params).await?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable(NAME, "the claim returned no row"))?;
        // Columns: the layout's columns (expires_at_ms is the fifth), then the claimed version.
        let claimed: Option<i64> = row.try_get(12).map_err(|e| driver_failed(NAME, e))?;
        if let Some(version) = claimed {
            return Ok(InsertOutcome::Inserted(version.cast_unsigned()));
        }
        let expires: Option<i64> = row.try_get(4).map_err(|e| driver_failed(NAME, e))?;
        if expires.is_some_and(|expires| expires > now) {
            return Ok(InsertOutcome::Existing(decode(key, row, 0)?));
        }
        // A concurrent claimer committed the key after this claim read it:
        // settle in a second round trip, which returns the winner's row.
        let rows = self.query(&self.sql.settle, &params).await?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable(NAME, "the claim returned no row"))?;
        let inserted: bool = row.try_get(0).map_err(|e| driver_failed(NAME, e))?;
        if inserted {
            let version: i64 = row.try_get(1).map_err(|e| driver_failed(NAME, e))?;
            Ok(InsertOutcome::Inserted(version.cast_unsigned()))
        } else {
            Ok(InsertOutcome::Existing(decode(key, row, 1)?))
        }
    }

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        let (version, now) = (int(expected), int(now_ms));
        let columns = RecordParams::new(&record);
        let replaced = self
            .execute(&self.sql.replace, &columns.after(&[&key, &version, &now]))
            .await?;
        Ok(replaced > 0)
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        let removed = self
            .execute(
                &self.sql.delete,
                &[&key, &expected_version.map(int), &int(now_ms)],
            )
            .await?;
        Ok(removed > 0)
    }

    /// The server's `clock_timestamp()`, read every second.
    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        let state = query.state.map(State::as_str);
        let limit = int(query.limit as u64);
        let rows = self
            .query(
                &self.sql.list,
                &[
                    &like_prefix(&query.prefix),
                    &int(now_ms),
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

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        let purged = self
            .execute(&self.sql.purge, &[&int(now_ms), &int(limit as u64)])
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
